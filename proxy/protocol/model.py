"""The trust core's public value types: mirrors, settings, verified targets."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from proxy.protocol.errors import ExpiredMetadata
from proxy.protocol.hashing import new_hash, verify_bytes
from proxy.protocol.layout import consistent_name


@dataclass(frozen=True)
class Mirror:
    """One copy of the repository: where its metadata and its targets live."""

    metadata_url: str
    targets_url: str

    def metadata(self, filename: str) -> str:
        return _join(self.metadata_url, filename)

    def target(self, path: str) -> str:
        return _join(self.targets_url, path)


def _join(base: str, path: str) -> str:
    return f"{base}{path}" if base.endswith("/") else f"{base}/{path}"


@dataclass(frozen=True)
class ExpiryOverride:
    """An operator's explicit permission to use expired metadata until ``until`` (an air-gapped tree).

    While it holds, expiry is not enforced (signatures, versions, rollback
    and hashes still are); every lookup that expired metadata vouched for is
    passed to ``report`` (target path, the expiry refusal it replaced) so
    nothing is used silently.  From ``until`` on, expiry is enforced again.
    """

    until: datetime
    report: Callable[[str, ExpiredMetadata], None]


@dataclass(frozen=True)
class TrustConfig:
    """Bounds and refresh policy of a :class:`~proxy.trust.TrustedClient`."""

    refresh_interval: float = 60.0
    # How long a lookup of an unknown target (or one with no usable state) waits for the
    # refresh in flight before MetadataPending: well under pip's 15 s read timeout.
    miss_wait: float = 5.0
    max_root_rotations: int = 256
    max_delegations: int = 32
    root_max_length: int = 512_000
    timestamp_max_length: int = 16_384
    # A 16384-bin snapshot is about 1 MB; tuf's 2 MB default leaves too little room.
    snapshot_max_length: int = 16_000_000
    targets_max_length: int = 16_000_000
    bin_cache_size: int = 4096
    # Lookups answered from memory while the state they came from is live (a serving process asks the same
    # paths again and again; a one-pass check such as mirror verify asks each once and sets it low).
    found_cache_size: int = 65_536
    # A listing of every target (a root page no list is signed for) visits at most this many roles:
    # PEP 458's 16,384 bins and their delegators, and a repository delegating to millions is refused.
    max_listed_roles: int = 65_536
    # Also persist roles reached through hash-bin delegations (one file per
    # bin); the server keeps those in memory only, ``tufproxy client`` stores all.
    persist_bins: bool = False
    # Where a consistent snapshot serves a target under its digest (the profile decides).
    served_name: Callable[[str, str], str] = consistent_name
    expiry_override: ExpiryOverride | None = None


@dataclass(frozen=True)
class VerifiedTarget:
    """A target as the repository's keys describe it."""

    path: str
    length: int
    hashes: dict[str, str]
    role: str  # the role that listed it
    custom: dict[str, Any] = field(default_factory=dict)

    def verify(self, data: bytes) -> None:
        """Raise unless ``data`` is exactly the signed target (small things only)."""
        verify_bytes(self.path, self.hashes, self.length, data, role=self.role)


def digest(algorithm: str, data: bytes) -> str:
    h = new_hash(algorithm)
    h.update(data)
    return h.hexdigest()


def file_digest(algorithm: str, path: Path) -> str:
    """``digest`` of a file's bytes, read in chunks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, lambda: new_hash(algorithm)).hexdigest()


def consistent_target_urls(
    target: VerifiedTarget,
    mirrors: list[Mirror],
    consistent: bool,
    served_name: Callable[[str, str], str] = consistent_name,
) -> list[str]:
    """Download URLs of ``target`` in mirror order (``served_name(path, digest)`` if consistent)."""
    if consistent and target.hashes:
        name = served_name(target.path, next(iter(target.hashes.values())))
    else:
        name = target.path
    return [m.target(name) for m in mirrors]
