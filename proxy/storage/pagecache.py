"""Verified index pages: on disk, a size-bounded diskcache under ``<root>/index/``;
in memory, the hottest pages, raw and rendered (:class:`HotPages`).

Callers store only bytes they have verified; keys name the signed digest
so a page can be re-hashed later, and a rendered page can never outlive
the signed digest it was rendered from.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path
from typing import Generic, TypeVar

import diskcache

from proxy.protocol.errors import StoreError, StoreFull, StoreUnwritable
from proxy.storage.store import disk_error


class IndexCache:
    """Verified index pages by key, in a size-bounded diskcache, the oldest stored evicted first.

    Keys name the page's signed digest (:meth:`key`), so a page can be
    re-hashed against it later, by the server at first use and offline by
    ``tufproxy cache verify``.  Calls are blocking SQLite operations, quick
    for page-sized values.

    Not least-recently-used: diskcache records each read of an LRU cache in
    a write transaction, so every page read, in every worker, took the one
    database write lock, and a read waited behind another worker's write
    for SQLite's busy sleeps (1 to 25 ms each); a cold install's page reads
    then cost up to 37 ms.  Recency is kept in memory instead: a page in use
    is answered from the resolver's :class:`HotPages`, and not read here again.
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
                eviction_policy="least-recently-stored",
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
        except sqlite3.Error as exc:  # a page small enough to live in the database fails there ("disk is full")
            kind = StoreFull if "full" in str(exc) else StoreError
            raise kind(f"index cache write: {exc}") from exc

    def delete(self, key: str) -> None:
        """Forget ``key`` (a page that failed its re-check)."""
        self._cache.delete(key, retry=True)

    def keys(self) -> list[str]:
        """Every key stored."""
        return [k for k in self._cache.iterkeys() if isinstance(k, str)]

    def close(self) -> None:
        """Close the underlying database."""
        self._cache.close()


V = TypeVar("V")


class HotPages(Generic[V]):
    """A bounded LRU (entries and bytes) of rendered pages, kept by key.

    Keys must name the signed digest the page was rendered from, so a new
    trusted state that changes a page looks up a new key; the old entry
    ages out unused.
    """

    def __init__(self, max_entries: int = 4096, max_bytes: int = 128 * 2**20) -> None:
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0

    def get(self, key: Hashable) -> V | None:
        hit = self._entries.get(key)
        if hit is None:
            return None
        self._entries.move_to_end(key)
        return hit[0]

    def put(self, key: Hashable, value: V, size: int) -> None:
        """Keep ``value`` (``size`` bytes); a value over a quarter of the byte bound is not kept."""
        if size > self._max_bytes // 4:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        self._entries[key] = (value, size)
        self._bytes += size
        while len(self._entries) > self._max_entries or self._bytes > self._max_bytes:
            self._bytes -= self._entries.popitem(last=False)[1][1]
