"""Bytes on disk: a verified, content-addressed blob store and an index cache.

``BlobStore`` owns ``<root>/blobs/`` and ``<root>/tmp/``.  A download is
streamed into a ``BlobWriter`` that hashes as it writes into ``tmp/`` and
bounds the length; only a commit whose length and every expected hash match
is fsynced and renamed to ``blobs/<aa>/<sha256>``.  So a file under
``blobs/`` was verified when it was written; ``verify`` re-hashes it later
against bit rot.  The store is sized by ``max_bytes`` and evicts least
recently used blobs (by atime, so it survives a restart), never one pinned
as in use.

Several processes (workers, or hosts on a shared volume whose filesystem
honours ``flock``) may use one root at once; ``flock`` is the only
coordination.  A writer holds an exclusive lock on its temp file, so the
sweep at open removes only temp files no live process is writing.  A pin
holds a shared lock on the blob, and eviction takes a non-blocking
exclusive one, skipping a blob another process is sending.  Another
process's blobs are found on disk at ``get`` and adopted, and the size
accounting is rescanned from disk before evicting.  ``fetch_lock`` is the
cross-process single flight: one lock file per download key under
``<root>/locks/``.

``IndexCache`` keeps verified index pages in a size-bounded diskcache under
``<root>/index/``; callers store only bytes they have verified.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import diskcache

from proxy.atomic import fsync_dir

# Algorithm names as TUF metadata spells them (securesystemslib's names).
_HASHES: dict[str, Callable[[], Any]] = {
    "sha224": hashlib.sha224,
    "sha256": hashlib.sha256,
    "sha384": hashlib.sha384,
    "sha512": hashlib.sha512,
    "blake2b": hashlib.blake2b,
    "blake2b-256": lambda: hashlib.blake2b(digest_size=32),
    "blake2s": hashlib.blake2s,
}
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
# Small chunks are gathered so each thread hop writes up to about this much.
WRITE_CHUNK = 2**20
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# Another process's blobs appear on disk unannounced: resync the accounting this often, when near the limit.
_RESCAN_INTERVAL = 5.0
# Waiting for another process's download of the same file: poll its lock this often, at most this long.
_FETCH_LOCK_POLL = (0.005, 0.05)
FETCH_LOCK_WAIT = 900.0
_T = TypeVar("_T")
log = logging.getLogger(__name__)


class StoreError(Exception):
    """Base of every error the store raises."""


class StoreFull(StoreError):
    """The size limit or the disk is full: the request cannot be cached."""


class StoreUnwritable(StoreError):
    """The cache directory cannot be created or written at open."""


class UnsupportedHash(StoreError, ValueError):
    """Expected hashes name an algorithm the store cannot check (fail closed)."""


class BlobMismatch(StoreError):
    """The bytes received differ in length or hash from what was expected.

    When raised by ``write`` (too many bytes), ``actual_length`` is the count
    received so far and ``actual_hashes`` is empty.
    """

    def __init__(
        self,
        expected_length: int,
        actual_length: int,
        expected_hashes: dict[str, str],
        actual_hashes: dict[str, str],
    ) -> None:
        self.expected_length = expected_length
        self.actual_length = actual_length
        self.expected_hashes = dict(expected_hashes)
        self.actual_hashes = dict(actual_hashes)
        if actual_length != expected_length:
            what = f"length {actual_length}, expected {expected_length}"
        else:
            bad = sorted(a for a in expected_hashes if actual_hashes.get(a) != expected_hashes[a])
            what = f"{', '.join(bad)} differs"
        super().__init__(f"blob mismatch: {what}")


@dataclass(frozen=True)
class Blob:
    """A verified blob on disk, named by the sha256 of its content."""

    sha256: str
    path: Path
    size: int


def check_sha256(sha256: str) -> str:
    """Return ``sha256`` if it is 64 lowercase hex digits, else raise ValueError."""
    if not isinstance(sha256, str) or not _SHA256_RE.fullmatch(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return sha256


def _check_hashes(expected_hashes: dict[str, str]) -> None:
    if not expected_hashes:
        raise UnsupportedHash("no expected hashes given")
    unknown = sorted(set(expected_hashes) - set(_HASHES))
    if unknown:
        # python-tuf rejects a target with an unsupported algorithm; so do we.
        raise UnsupportedHash(f"unsupported hash algorithm(s): {', '.join(unknown)}")


def _disk_error(exc: OSError, what: str) -> StoreError:
    if exc.errno in _FULL_ERRNOS:
        return StoreFull(f"{what}: {exc.strerror}")
    return StoreError(f"{what}: {exc}")


def _try_flock(path: Path | str, flags: int, exclusive: bool) -> int | None:
    """Open ``path`` and take a non-blocking flock; the fd, or None if it is gone or held."""
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class BlobStore:
    """Content-addressed blobs under ``root``, at most ``max_bytes`` in all.

    Methods are synchronous and quick (metadata syscalls only) except
    ``verify``, which reads the whole blob and belongs in a thread.  State
    is guarded by a lock so ``verify`` may run in a thread beside the loop.
    """

    def __init__(self, root: Path, max_bytes: int | None = None) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self._blobs = self.root / "blobs"
        self._tmp = self.root / "tmp"
        self._locks = self.root / "locks"
        self._lock = threading.Lock()
        self._index: OrderedDict[str, int] = OrderedDict()  # sha256 -> size, oldest access first
        self._usage = 0
        self._reserved = 0
        self._pins: dict[str, int] = {}
        self._pin_fds: dict[str, int] = {}  # sha256 -> fd holding a shared flock while pinned
        self._scanned = 0.0  # monotonic time of the last scan of blobs/
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._open_dirs()
        self._scan()
        with self._lock:
            self._make_room_locked(0)

    def _open_dirs(self) -> None:
        try:
            self._blobs.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(exist_ok=True)
            self._locks.mkdir(exist_ok=True)
            self._sweep_tmp()
        except OSError as exc:
            raise StoreUnwritable(f"cache directory {self.root} is not writable: {exc}") from exc
        self.probe_writable()

    def _sweep_tmp(self) -> None:
        """A crash mid-download leaves temp files; none of them is trusted.

        A live writer holds an exclusive flock on its temp file: those are
        left alone.  The store never makes directories here.
        """
        for stale in self._tmp.iterdir():
            if stale.is_symlink():
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
                continue
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)  # another process may be sweeping it too
                continue
            fd = _try_flock(stale, os.O_RDONLY, exclusive=True)
            if fd is None:
                continue  # being written by a live process (or gone already)
            try:
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
            finally:
                os.close(fd)

    def probe_writable(self) -> None:
        """Write, fsync and remove a byte in ``tmp/``; StoreUnwritable if that fails."""
        try:
            fd, probe = tempfile.mkstemp(dir=self._tmp, prefix="probe-")
            try:
                os.write(fd, b"x")
                os.fsync(fd)
            finally:
                os.close(fd)
                # Another process's sweep at open may have removed it already.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(probe)
        except OSError as exc:
            raise StoreUnwritable(f"cache directory {self.root} is not writable: {exc}") from exc

    def _scan(self) -> None:
        found = self._list_blobs()
        for _, name, size in sorted(found):
            self._index[name] = size
            self._usage += size
        self._scanned = time.monotonic()

    def _list_blobs(self) -> list[tuple[int, str, int]]:
        """(atime, sha256, size) of every blob on disk; removes what the store did not write."""
        found: list[tuple[int, str, int]] = []
        with os.scandir(self._blobs) as subs:
            for sub in subs:
                if not sub.is_dir(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(sub.path)
                    continue
                with os.scandir(sub.path) as entries:
                    for entry in entries:
                        if not entry.is_file(follow_symlinks=False):
                            continue
                        if _SHA256_RE.fullmatch(entry.name) and entry.name[:2] == sub.name:
                            try:
                                st = entry.stat(follow_symlinks=False)
                            except FileNotFoundError:
                                continue  # evicted by another process meanwhile
                            found.append((st.st_atime_ns, entry.name, st.st_size))
                        else:
                            # Not something the store wrote: never let it be served.
                            with contextlib.suppress(FileNotFoundError):
                                os.unlink(entry.path)
        return found

    def _rescan_locked(self) -> None:
        """Resync the index with the disk, which other processes change too."""
        on_disk = {name: (atime, size) for atime, name, size in self._list_blobs()}
        for sha256 in [s for s in self._index if s not in on_disk]:
            self._usage -= self._index.pop(sha256)
        for _, name, size in sorted((atime, name, size) for name, (atime, size) in on_disk.items()
                                    if name not in self._index):
            self._index[name] = size
            self._usage += size
        self._scanned = time.monotonic()

    def _path(self, sha256: str) -> Path:
        return self._blobs / sha256[:2] / sha256

    def get(self, sha256: str, expected_size: int | None = None) -> Blob | None:
        """The blob with this sha256, or None (counted as hit or miss).

        A blob whose size on disk differs from the recorded or the expected
        size is evicted.  Pin a returned blob (``in_use``) before the next
        ``await`` if it is going to be sent.
        """
        check_sha256(sha256)
        path = self._path(sha256)
        with self._lock:
            size = self._index.get(sha256)
        try:
            st = path.stat()
        except FileNotFoundError:
            st = None
        if size is None and st is not None:
            # Committed by another process sharing this root (only the store writes blobs/).
            size = self._adopt(sha256, st.st_size).size
        if size is not None:
            if st is not None and st.st_size == size and expected_size in (None, size):
                with contextlib.suppress(FileNotFoundError):
                    # atime, not mtime: the server's ETag is built from mtime.
                    os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))
                with self._lock:
                    if sha256 in self._index:
                        self._index.move_to_end(sha256)
                        self.hits += 1
                        return Blob(sha256, path, size)
            elif st is None:
                with self._lock:  # evicted by another process: forget it, it is not our eviction
                    self._usage -= self._index.pop(sha256, 0)
            else:
                self.evict(sha256)
        with self._lock:
            self.misses += 1
        return None

    def writer(self, expected_length: int, expected_hashes: dict[str, str], exact: bool = True) -> BlobWriter:
        """A writer for one download; use it as ``async with``.

        With ``exact=False`` the length is only a bound: for files whose
        signed description gives hashes but no length (a verified index
        page's sha256), the hashes alone decide.  Raises
        ``UnsupportedHash`` here for an empty or unknown algorithm set;
        space is reserved (evicting if need be, else ``StoreFull``) on
        entering the context, or at commit for an inexact length.
        """
        if expected_length < 0:
            raise ValueError("expected_length must be >= 0")
        _check_hashes(expected_hashes)
        return BlobWriter(self, expected_length, expected_hashes, exact)

    def verify(self, blob: Blob, expected_hashes: dict[str, str]) -> bool:
        """Re-hash ``blob`` from disk; on any mismatch evict it and return False.

        Its own sha256 is always checked besides ``expected_hashes``.
        Blocking: run it in a thread.
        """
        check_sha256(blob.sha256)
        _check_hashes(expected_hashes)
        hashers = {name: _HASHES[name]() for name in set(expected_hashes) | {"sha256"}}
        length = 0
        try:
            with open(self._path(blob.sha256), "rb") as f:
                while chunk := f.read(WRITE_CHUNK):
                    length += len(chunk)
                    for h in hashers.values():
                        h.update(chunk)
        except FileNotFoundError:
            self.evict(blob.sha256)
            return False
        actual = {name: h.hexdigest() for name, h in hashers.items()}
        ok = (
            length == blob.size
            and actual["sha256"] == blob.sha256
            and all(actual[a] == v for a, v in expected_hashes.items())
        )
        if not ok:
            self.evict(blob.sha256)
        return ok

    def evict(self, sha256: str) -> None:
        """Remove a blob now, pinned or not (a corrupt blob must not be served).

        A transfer that already opened the file keeps reading its inode.
        """
        check_sha256(sha256)
        with self._lock:
            self._remove_locked(sha256)

    def _remove_locked(self, sha256: str) -> None:
        size = self._index.pop(sha256, None)
        if size is not None:
            self._usage -= size
            self.evictions += 1
        with contextlib.suppress(FileNotFoundError):
            self._path(sha256).unlink()

    def pin(self, sha256: str) -> None:
        """Keep LRU eviction away from this blob until ``unpin``."""
        check_sha256(sha256)
        with self._lock:
            self._pins[sha256] = self._pins.get(sha256, 0) + 1
            if self._pins[sha256] == 1:
                # Tells other processes' eviction to keep away; if the blob is gone or
                # being evicted right now there is nothing left to protect.
                fd = _try_flock(self._path(sha256), os.O_RDONLY, exclusive=False)
                if fd is not None:
                    self._pin_fds[sha256] = fd

    def unpin(self, sha256: str) -> None:
        """Undo one ``pin``."""
        check_sha256(sha256)
        with self._lock:
            count = self._pins.get(sha256, 0)
            if count <= 0:
                raise RuntimeError(f"unpin of a blob not pinned: {sha256}")
            if count == 1:
                del self._pins[sha256]
                fd = self._pin_fds.pop(sha256, None)
                if fd is not None:
                    os.close(fd)
            else:
                self._pins[sha256] = count - 1

    @contextlib.contextmanager
    def in_use(self, sha256: str) -> Iterator[None]:
        """Pin a blob for the duration of a ``with`` block."""
        self.pin(sha256)
        try:
            yield
        finally:
            self.unpin(sha256)

    def usage(self) -> int:
        """Bytes of committed blobs (downloads in progress not included)."""
        with self._lock:
            return self._usage

    def _reserve(self, n: int) -> None:
        with self._lock:
            self._make_room_locked(n)
            self._reserved += n

    def _release(self, n: int) -> None:
        with self._lock:
            self._reserved -= n

    def _make_room_locked(self, n: int) -> None:
        if self.max_bytes is None:
            return
        if time.monotonic() - self._scanned >= _RESCAN_INTERVAL:
            self._rescan_locked()
        excess = self._usage + self._reserved + n - self.max_bytes
        if excess <= 0:
            return
        # Exclusive flocks on the victims: a blob another process is sending is skipped.
        victims: list[tuple[str, int | None]] = []
        try:
            for sha256, size in self._index.items():
                if excess <= 0:
                    break
                if self._pins.get(sha256):
                    continue
                fd = _try_flock(self._path(sha256), os.O_RDONLY, exclusive=True)
                if fd is None and self._path(sha256).exists():
                    continue  # in use by another process
                victims.append((sha256, fd))
                excess -= size
            if excess > 0:
                # Evicting only some would lose cache for nothing.
                raise StoreFull(
                    f"{n} bytes do not fit in {self.max_bytes} "
                    f"({self._usage} stored, {self._reserved} reserved, rest in use)"
                )
            for sha256, fd in victims:
                if fd is None:
                    # Another process evicted it already: forget it, without counting it again.
                    self._usage -= self._index.pop(sha256, 0)
                else:
                    self._remove_locked(sha256)
        finally:
            for _, fd in victims:
                if fd is not None:
                    os.close(fd)

    def _locked_temp(self) -> tuple[int, str]:
        """A new temp file under an exclusive flock, so no other process's sweep removes it."""
        while True:
            fd, name = tempfile.mkstemp(dir=self._tmp, suffix=".part")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_nlink:
                    return fd, name
            except BlockingIOError:
                pass
            # A sweep got to it between creation and lock: it is gone, or going.
            os.close(fd)

    @contextlib.asynccontextmanager
    async def fetch_lock(self, key: str, wait: float = FETCH_LOCK_WAIT) -> AsyncIterator[bool]:
        """Hold the cross-process lock of download ``key``; yields False if ``wait`` ran out.

        The holder downloads; a process that waited re-checks the store
        after acquiring it.  Past ``wait`` the caller downloads anyway: two
        writers of one verified blob are harmless, a wait without end is not.
        A dead holder's lock is released by the kernel.
        """
        path = self._locks / f"{hashlib.sha256(key.encode()).hexdigest()}.lock"
        deadline = time.monotonic() + wait
        delay = _FETCH_LOCK_POLL[0]
        fd = -1
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                try:
                    current = os.stat(path).st_ino
                except FileNotFoundError:
                    current = None
                if current == os.fstat(fd).st_ino:
                    break
                # The previous holder unlinked this file as it let go: lock the new one.
                os.close(fd)
                continue
            except BlockingIOError:
                os.close(fd)
                fd = -1
            if time.monotonic() >= deadline:
                log.warning("waited %.0fs for another process's download of %s: fetching it too", wait, key)
                yield False
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, _FETCH_LOCK_POLL[1])
        try:
            yield True
        finally:
            # Unlink before unlocking, so lock files do not pile up; waiters re-check the inode.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.close(fd)

    def _adopt(self, sha256: str, size: int) -> Blob:
        with self._lock:
            if sha256 in self._index:
                self._index.move_to_end(sha256)
            else:
                self._index[sha256] = size
                self._usage += size
        return Blob(sha256, self._path(sha256), size)


class BlobWriter:
    """Streams one download into the store; nothing is visible until commit.

    Use as ``async with store.writer(n, hashes) as w``; ``write`` chunks in
    order (not concurrently), then ``await w.commit()``.  Leaving the block
    without a successful commit (error, mismatch, cancellation) removes the
    temp file.  File I/O and hashing run in a worker thread.
    """

    def __init__(self, store: BlobStore, expected_length: int, expected_hashes: dict[str, str], exact: bool = True) -> None:
        self._store = store
        self._expected_length = expected_length
        self._exact = exact
        self._expected_hashes = dict(expected_hashes)
        self._hashers = {name: _HASHES[name]() for name in set(expected_hashes) | {"sha256"}}
        self._received = 0
        self._buf = bytearray()
        self._fd = -1
        self._tmp_path: Path | None = None
        self._pending: asyncio.Future[Any] | None = None
        self._state = "new"  # new -> open [-> failed] -> closed
        self._renamed: Blob | None = None
        self._reserved = 0

    async def __aenter__(self) -> BlobWriter:
        if self._state != "new":
            raise RuntimeError("a BlobWriter can be entered once")
        if self._exact:
            self._store._reserve(self._expected_length)
            self._reserved = self._expected_length
        try:
            fd, name = self._store._locked_temp()
        except OSError as exc:
            self._release()
            raise _disk_error(exc, "cannot create temp file") from exc
        self._fd, self._tmp_path = fd, Path(name)
        self._state = "open"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pending = self._pending
        if pending is not None and not pending.done():
            try:
                await asyncio.shield(pending)
            except asyncio.CancelledError:
                # Cancelled again while the thread still holds the fd:
                # clean up when it is done, not under its feet.
                pending.add_done_callback(lambda _: self._cleanup())
                raise
            except BaseException:  # already reported to the caller, or moot
                pass
        self._cleanup()

    def _cleanup(self) -> None:
        if self._state == "closed":
            return
        if self._pending is not None and self._pending.done() and not self._pending.cancelled():
            self._pending.exception()  # retrieved: no "never retrieved" warning
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        if self._renamed is not None:
            # Renamed after a full verify (commit may have been cancelled
            # since): record it.
            self._store._adopt(self._renamed.sha256, self._renamed.size)
        elif self._tmp_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._tmp_path.unlink()
        self._release()
        self._state = "closed"

    def _release(self) -> None:
        self._store._release(self._reserved)
        self._reserved = 0

    def _check_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"BlobWriter is {self._state}: use it inside 'async with', once")
        if self._pending is not None and not self._pending.done():
            raise RuntimeError("BlobWriter.write called concurrently")

    async def _run(self, what: str, fn: Callable[..., _T], *args: Any) -> _T:
        self._pending = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        try:
            return await asyncio.shield(self._pending)
        except OSError as exc:
            self._state = "failed"
            raise _disk_error(exc, what) from exc

    async def write(self, chunk: bytes) -> None:
        """Append ``chunk``; BlobMismatch at once when past the expected length."""
        self._check_open()
        self._received += len(chunk)
        if self._received > self._expected_length:
            self._state = "failed"
            raise BlobMismatch(self._expected_length, self._received, self._expected_hashes, {})
        self._buf += chunk
        if len(self._buf) >= WRITE_CHUNK:
            data, self._buf = self._buf, bytearray()
            await self._run("write to temp file", self._write_sync, data)

    def _write_sync(self, data: bytearray) -> None:
        for h in self._hashers.values():
            h.update(data)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    async def commit(self) -> Blob:
        """Check length and every hash; if all match, make the blob visible."""
        self._check_open()
        if self._buf:
            data, self._buf = self._buf, bytearray()
            await self._run("write to temp file", self._write_sync, data)
        actual = {name: h.hexdigest() for name, h in self._hashers.items()}
        length_ok = self._received == self._expected_length if self._exact else self._received <= self._expected_length
        if not length_ok or any(actual[a] != v for a, v in self._expected_hashes.items()):
            self._state = "failed"
            self._cleanup()
            raise BlobMismatch(self._expected_length, self._received, self._expected_hashes, actual)
        sha256 = actual["sha256"]
        if not self._exact:
            self._store._reserve(self._received)
            self._reserved = self._received
        await self._run("commit blob", self._finish_sync, sha256)
        blob = self._renamed
        assert blob is not None
        self._cleanup()
        return blob

    def _finish_sync(self, sha256: str) -> None:
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        final = self._store._path(sha256)
        try:
            final.parent.mkdir()
            fsync_dir(final.parent.parent)
        except FileExistsError:
            pass
        assert self._tmp_path is not None
        # Replacing a concurrent writer's identical blob is harmless: a
        # sender that opened the old inode keeps reading it.
        os.replace(self._tmp_path, final)
        self._tmp_path = None
        self._renamed = Blob(sha256, final, self._received)
        fsync_dir(final.parent)


class IndexCache:
    """Verified index pages by key, in a size-bounded LRU diskcache.

    Calls are blocking SQLite operations, quick for page-sized values.
    """

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
            raise _disk_error(exc, "index cache write") from exc

    def close(self) -> None:
        """Close the underlying database."""
        self._cache.close()
