"""Rank 3: the TUF client workflow with I/O: fetch, refresh, the metadata directory, slots.

The pure verification it drives lives in :mod:`proxy.protocol`.

An asyncio TUF client (spec 5, PEP 458) for a long-running proxy; see
:mod:`proxy.trust.client` for the refresh policy and
:mod:`proxy.protocol.tufset` for how it builds on python-tuf.
"""

from proxy.protocol.errors import (
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
from proxy.protocol.model import Mirror, TrustConfig, VerifiedTarget
from proxy.trust.client import TrustedClient

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
