"""The trust core: decides whether bytes are what the repository's keys signed.

An asyncio TUF client (spec 5, PEP 458) for a long-running proxy; see
:mod:`proxy.trust.client` for the refresh policy and
:mod:`proxy.trust._tufset` for how it builds on python-tuf.
"""

from proxy.trust.client import TrustedClient
from proxy.trust.errors import (
    BadMetadata,
    BadSignature,
    ExpiredMetadata,
    HashMismatch,
    LengthMismatch,
    NotInitialized,
    RepositoryError,
    Rollback,
    TrustError,
    UnknownTarget,
    UpstreamUnreachable,
    VersionMismatch,
)
from proxy.trust.model import Mirror, TrustConfig, VerifiedTarget

__all__ = [
    "BadMetadata",
    "BadSignature",
    "ExpiredMetadata",
    "HashMismatch",
    "LengthMismatch",
    "Mirror",
    "NotInitialized",
    "RepositoryError",
    "Rollback",
    "TrustConfig",
    "TrustError",
    "TrustedClient",
    "UnknownTarget",
    "UpstreamUnreachable",
    "VerifiedTarget",
    "VersionMismatch",
]
