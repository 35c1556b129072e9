"""Files on disk: a verified, content-addressed blob store.

``BlobStore`` owns ``<root>/blobs/`` and ``<root>/tmp/``.  A download is
streamed into a ``BlobWriter`` (a sink of :func:`proxy.trust.fetch.fetch_verified`)
that writes into ``tmp/`` within space reserved against the size limit;
only once the fetch verified every signed hash is it published as
``blobs/<aa>/<sha256>``.  So a file under ``blobs/`` was verified when it
was written; ``verify`` re-hashes it later (the first time a process
serves it) against bit rot and against a power loss before the kernel
wrote it back.  That re-hash is why a blob gets no fsync of its own: one
lost costs a fetch, not a wrong byte, while its fsync would compete for
the disk with the fsyncs that guard something (trusted metadata, and a
gateway's signing batches where one shares the disk).  The store is sized by ``max_bytes`` and evicts least
recently used blobs (by atime, so it survives a restart), never one pinned
as in use.

Several processes (workers, or hosts on a shared volume whose filesystem
honours ``flock``) may use one root at once; ``flock`` is the only
coordination.  A writer holds an exclusive lock on its temp file, so the
sweep at open removes only temp files no live process is writing.  A pin
holds a shared lock on the blob, and eviction takes a non-blocking
exclusive one, skipping a blob another process is sending.  Another
process's blobs are found on disk at ``get`` and adopted, and the size
accounting is rescanned from disk before evicting.  Pages live in
:mod:`proxy.storage.pagecache`, the cross-process download locks in :mod:`proxy.util.locks`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from proxy.protocol.errors import RepositoryError, StoreError, StoreFull, StoreUnwritable
from proxy.protocol.hashing import StreamingVerifier, UnsupportedHashes
from proxy.trust.fetch import pwrite_all
from proxy.util.locks import try_flock

_SHA256_RE = re.compile(r"[0-9a-f]{64}")
# Re-hashing reads this much at a time.
WRITE_CHUNK = 2**20
# A download of bounded (unsigned) length reserves cache space in steps of this much.
RESERVE_STEP = 8 * 2**20
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# Another process's blobs appear on disk unannounced: resync the accounting this often, when near the limit.
_RESCAN_INTERVAL = 5.0
_T = TypeVar("_T")


@dataclass(frozen=True)
class Blob:
    """A verified blob on disk, named by the sha256 of its content."""

    sha256: str
    path: Path
    size: int
    # Its file's mtime when get() found it (0: not looked at): what a server's ETag is built from.
    mtime_ns: int = field(default=0, compare=False)


def disk_error(exc: OSError, what: str) -> StoreError:
    if exc.errno in _FULL_ERRNOS:
        return StoreFull(f"{what}: {exc.strerror}")
    return StoreError(f"{what}: {exc}")


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
            fd = try_flock(stale, os.O_RDONLY, exclusive=True)
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
        # Callers pass digests accepted_hashes() checked; this keeps any other string off the disk.
        if not _SHA256_RE.fullmatch(sha256):
            raise UnsupportedHashes(f"not a sha256 digest: {sha256[:80]!r}")
        return self._blobs / sha256[:2] / sha256

    def get(self, sha256: str, expected_size: int | None = None) -> Blob | None:
        """The blob with this sha256, or None (counted as hit or miss).

        A blob whose size on disk differs from the recorded or the expected
        size is evicted.  Pin a returned blob (``in_use``) before the next
        ``await`` if it is going to be sent.
        """
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
                        return Blob(sha256, path, size, st.st_mtime_ns)
            elif st is None:
                with self._lock:  # evicted by another process: forget it, it is not our eviction
                    self._usage -= self._index.pop(sha256, 0)
            else:
                self.evict(sha256)
        with self._lock:
            self.misses += 1
        return None

    def writer(self, length: int, exact: bool = True) -> BlobWriter:
        """The temp file of one download (a fetch-and-verify sink); use it as ``async with``.

        ``length`` is the signed length when ``exact``, else only a bound:
        space is reserved for an exact length on entering, and for a bound
        step by step as bytes arrive, so ``tmp/`` never holds more than is
        reserved and reservations count against ``max_bytes`` (``StoreFull``
        when they do not fit).
        """
        if length < 0:
            raise ValueError("length must be >= 0")
        return BlobWriter(self, length, exact)

    def verify(self, blob: Blob, expected_hashes: dict[str, str]) -> bool:
        """Re-hash ``blob`` from disk (the one hash check); on any mismatch evict it and return False.

        Its own sha256 is always checked besides ``expected_hashes``.
        Blocking: run it in a thread.
        """
        path = self._path(blob.sha256)
        try:
            verifier = StreamingVerifier(blob.sha256, {**expected_hashes, "sha256": blob.sha256}, blob.size)
            with open(path, "rb") as f:
                while chunk := f.read(WRITE_CHUNK):
                    verifier.update(chunk)
            verifier.finish()
        except (FileNotFoundError, RepositoryError):
            self.evict(blob.sha256)
            return False
        return True

    def evict(self, sha256: str) -> None:
        """Remove a blob now, pinned or not (a corrupt blob must not be served).

        A transfer that already opened the file keeps reading its inode.
        """
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
        path = self._path(sha256)
        with self._lock:
            self._pins[sha256] = self._pins.get(sha256, 0) + 1
            if self._pins[sha256] == 1:
                # Tells other processes' eviction to keep away; if the blob is gone or
                # being evicted right now there is nothing left to protect.
                fd = try_flock(path, os.O_RDONLY, exclusive=False)
                if fd is not None:
                    self._pin_fds[sha256] = fd

    def unpin(self, sha256: str) -> None:
        """Undo one ``pin``."""
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
            self._check_disk_locked(n)
            self._reserved += n

    def _check_disk_locked(self, n: int) -> None:
        """Refuse now what the disk cannot hold, rather than fail mid-stream."""
        try:
            st = os.statvfs(self._tmp)
        except OSError:
            return
        if n > st.f_bavail * st.f_frsize:
            raise StoreFull(f"{n} bytes do not fit on the disk ({st.f_bavail * st.f_frsize} free)")

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
                fd = try_flock(self._path(sha256), os.O_RDONLY, exclusive=True)
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

    def _adopt(self, sha256: str, size: int) -> Blob:
        with self._lock:
            if sha256 in self._index:
                self._index.move_to_end(sha256)
            else:
                self._index[sha256] = size
                self._usage += size
        return Blob(sha256, self._path(sha256), size)


class BlobWriter:
    """The temp file of one download; nothing is visible until :meth:`publish`.

    Use as ``async with store.writer(n) as w``; ``write`` chunks in order
    (not concurrently), ``restart`` to start the body over, then ``await
    w.publish(sha256)`` once the fetch verified the bytes.  Leaving the block
    without publishing (error, refusal, cancellation) removes the temp file.
    File I/O runs in a worker thread; ``path`` lets readers follow the
    bytes as they arrive.
    """

    def __init__(self, store: BlobStore, length: int, exact: bool = True) -> None:
        self._store = store
        self._length = length
        self._exact = exact
        self.size = 0
        self._fd = -1
        self.path: Path | None = None
        self._pending: asyncio.Future[Any] | None = None
        self._state = "new"  # new -> open [-> failed] -> closed
        self._renamed: Blob | None = None
        self._reserved = 0

    async def __aenter__(self) -> BlobWriter:
        if self._state != "new":
            raise RuntimeError("a BlobWriter can be entered once")
        if self._exact:
            self._reserve(self._length)
        try:
            fd, name = self._store._locked_temp()
        except OSError as exc:
            self._release()
            raise disk_error(exc, "cannot create temp file") from exc
        self._fd, self.path = fd, Path(name)
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
            except BaseException:  # noqa: BLE001 - already reported to the caller, or moot
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
            # Renamed after a full verify (publish may have been cancelled since): record it.
            self._store._adopt(self._renamed.sha256, self._renamed.size)
        elif self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._release()
        self._state = "closed"

    def _reserve(self, n: int) -> None:
        self._store._reserve(n)
        self._reserved += n

    def _release(self) -> None:
        self._store._release(self._reserved)
        self._reserved = 0

    def _check_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"BlobWriter is {self._state}: use it inside 'async with', once")
        if self._pending is not None and not self._pending.done():
            raise RuntimeError("BlobWriter used concurrently")

    async def _run(self, what: str, fn: Callable[..., _T], *args: Any) -> _T:
        self._pending = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        try:
            return await asyncio.shield(self._pending)
        except OSError as exc:
            self._state = "failed"
            raise disk_error(exc, what) from exc

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append ``data`` within the reserved space (growing it for a bounded length)."""
        self._check_open()
        end = self.size + len(data)
        if end > self._length:
            # The fetch refuses over-long bodies before they get here; this keeps the disk bound anyway.
            self._state = "failed"
            raise StoreError(f"write past the {self._length}-byte bound")
        if end > self._reserved:
            self._reserve(min(self._length, max(end, self._reserved + RESERVE_STEP)) - self._reserved)
        await self._run("write to temp file", pwrite_all, self._fd, data, self.size)
        self.size = end

    async def restart(self) -> None:
        """Drop what was written (the body starts over from another mirror)."""
        self._check_open()
        await self._run("truncate temp file", os.ftruncate, self._fd, 0)
        self.size = 0

    async def publish(self, sha256: str) -> Blob:
        """Make the verified bytes visible as the blob ``sha256`` (no fsync: see the module docstring)."""
        self._check_open()
        if not self._exact:
            extra = self.size - self._reserved
            if extra > 0:
                self._reserve(extra)
        await self._run("publish blob", self._rename_sync, sha256)
        blob = self._renamed
        assert blob is not None
        self._cleanup()
        return blob

    def _rename_sync(self, sha256: str) -> None:
        os.close(self._fd)
        self._fd = -1
        final = self._store._path(sha256)
        final.parent.mkdir(exist_ok=True)
        assert self.path is not None
        # Replacing a concurrent writer's identical blob is harmless: a
        # sender that opened the old inode keeps reading it.
        os.replace(self.path, final)
        self._renamed = Blob(sha256, final, self.size)
