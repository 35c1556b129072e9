"""Verified index pages on disk: a size-bounded LRU diskcache under ``<root>/index/``.

Callers store only bytes they have verified; keys name the signed digest
so a page can be re-hashed later.
"""

from __future__ import annotations

from pathlib import Path

import diskcache

from proxy.store import StoreUnwritable, disk_error


class IndexCache:
    """Verified index pages by key, in a size-bounded LRU diskcache.

    Keys name the page's signed digest (:meth:`key`), so a page can be
    re-hashed against it later, by the server at first use and offline by
    ``tufproxy cache verify``.  Calls are blocking SQLite operations, quick
    for page-sized values.
    """

    @staticmethod
    def key(path: str, algorithm: str, digest: str) -> str:
        return f"{path}@{algorithm}:{digest}"

    @staticmethod
    def parse_key(key: str) -> tuple[str, str, str] | None:
        """(path, algorithm, digest) of a :meth:`key`, or None."""
        path, _, signed = key.rpartition("@")
        algorithm, _, digest = signed.partition(":")
        return (path, algorithm, digest) if path and algorithm and digest else None

    def __init__(self, root: Path, size_limit: int = 256 * 2**20) -> None:
        try:
            self._cache = diskcache.Cache(
                str(Path(root) / "index"),
                size_limit=size_limit,
                eviction_policy="least-recently-used",
            )
        except OSError as exc:
            raise StoreUnwritable(f"index cache under {root} is not writable: {exc}") from exc

    def get(self, key: str) -> bytes | None:
        """The bytes stored under ``key``, or None."""
        value = self._cache.get(key, default=None, retry=True)
        return value if isinstance(value, bytes) else None

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` (already verified by the caller) under ``key``."""
        if not isinstance(value, bytes):
            raise TypeError("IndexCache stores bytes only")
        try:
            self._cache.set(key, value, retry=True)
        except OSError as exc:
            raise disk_error(exc, "index cache write") from exc

    def delete(self, key: str) -> None:
        """Forget ``key`` (a page that failed its re-check)."""
        self._cache.delete(key, retry=True)

    def keys(self) -> list[str]:
        """Every key stored."""
        return [k for k in self._cache.iterkeys() if isinstance(k, str)]

    def close(self) -> None:
        """Close the underlying database."""
        self._cache.close()
