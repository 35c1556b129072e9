"""Rank 6: the PEP 458 repository signer behind ``tufproxy repo`` and the gateway."""

from proxy.repository.distributions import Distribution, NotADistribution, inspect_distribution
from proxy.repository.keys import MissingKey
from proxy.repository.signer import ChangeReport, DuplicateFile, Expiry, Repository, RepositoryError

__all__ = [
    "ChangeReport",
    "Distribution",
    "DuplicateFile",
    "Expiry",
    "MissingKey",
    "NotADistribution",
    "Repository",
    "RepositoryError",
    "inspect_distribution",
]
