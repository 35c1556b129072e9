"""Crash-safe file publication: a reader sees the old file or the new one, never half.

Every write of trusted or signed state in tufproxy goes through here:
write a temp file in the same directory, fsync it, ``os.replace`` it over
the target, fsync the directory so the rename itself survives power loss.
``durable=False`` leaves out the fsyncs: for the files of a :class:`Batch`,
flushed together before their commit point (:meth:`Batch.commit`), and for
the few records a crash may take back to an older copy (the gateway's
catalog, its high-water mark).  :class:`InOrder` replaces files one after
another, each renamed once its own fsync is done, while its caller goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

# Flushes a batch's files side by side (see Batch.flush): one pool per process, made on first use.
_FLUSH_THREADS = 8
_flushers: ThreadPoolExecutor | None = None
_flushers_made = threading.Lock()


def _forget_flushers() -> None:
    """In a forked child: the parent's pool threads did not come along, so it makes a pool of its own."""
    global _flushers, _flushers_made
    _flushers, _flushers_made = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_flushers)


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file published here is replaced or rewritten (None: absent), without reading it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def fsync_file(path: Path) -> None:
    """Make ``path``'s bytes durable (its name is the directory's business: :func:`fsync_dir`)."""
    _fsync(path)


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    _fsync(directory, os.O_RDONLY | os.O_DIRECTORY)


def _fsync(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_beside(path: Path, data: bytes, mode: int, durable: bool) -> Path:
    """A temp file in ``path``'s directory holding ``data`` (fsynced if ``durable``), to be renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if durable:
                os.fsync(f.fileno())
    except BaseException:
        discard(Path(tmp))
        raise
    return Path(tmp)


def discard(path: Path) -> None:
    """Remove ``path`` if it is there (a temp file given up on)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _replace(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` over ``path``; ``tmp`` is gone either way."""
    try:
        os.replace(tmp, path)
    except BaseException:
        discard(tmp)
        raise


def atomic_write(path: Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (and durably, unless the caller
    batches many files in a :class:`Batch` and flushes it once before its commit point)."""
    _replace(_temp_beside(path, data, mode, durable), path)
    if durable:
        fsync_dir(path.parent)


def atomic_link(source: Path, path: Path) -> None:
    """Make ``path`` a hard link to ``source``, replacing what was there atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if os.path.samefile(source, path):
            return  # rename(2) of a link onto the same file does nothing and would leave tmp behind
    tmp = path.with_name(f".{path.name}.{os.getpid()}.link")
    discard(tmp)  # left by a process that died between its link and its rename
    os.link(source, tmp)
    os.replace(tmp, path)


class Batch:
    """Files written atomically but not yet durably, made durable together before a commit point.

    A signer writes many files (pages, bins, snapshot) that the next
    timestamp will reach; each must be on disk before the timestamp is.
    Flushing only these files and their directories costs what they wrote,
    where ``os.sync()`` would flush every dirty page of the machine.  They
    are flushed side by side: concurrent fsyncs share the filesystem's
    journal commits, where one after another each may wait for its own.
    With other processes fsyncing too (a gateway and its edges keeping
    wheels), 40 small files took 25 ms one by one and 6 ms side by side
    (``python bench/fsync_batch.py``, ``bench/results/fsync-batch.md``).
    """

    def __init__(self) -> None:
        self._paths: list[Path] = []

    def write(self, path: Path, data: bytes, mode: int = 0o644) -> None:
        atomic_write(path, data, mode, durable=False)
        self._paths.append(path)

    def add(self, path: Path) -> None:
        """A file written (or linked) by other means, to be flushed with the batch."""
        self._paths.append(path)

    @property
    def paths(self) -> list[Path]:
        """The files of the batch not flushed yet."""
        return list(self._paths)

    def flush(self) -> None:
        """fsync every file of the batch and every directory a rename of it went into; the first failure
        raises, once all are done."""
        pool = _flush_pool()
        done = [pool.submit(_fsync, path) for path in dict.fromkeys(self._paths)]
        done += [pool.submit(fsync_dir, directory) for directory in dict.fromkeys(p.parent for p in self._paths)]
        wait(done)
        for future in done:
            future.result()
        self._paths.clear()

    def commit(self, path: Path, data: bytes, before: Callable[[], object] = lambda: None, mode: int = 0o644) -> None:
        """The commit point: flush the batch, call ``before``, then replace ``path`` with ``data`` durably.

        ``data``'s temp file is fsynced with the batch's files rather than
        after them, then renamed over ``path`` and its directory fsynced:
        two waits for the disk where :meth:`flush` and :func:`atomic_write`
        one after the other took three, each of which a busy disk (edges and
        a gateway writing wheels beside it) stretched to tens of
        milliseconds on a signer's every batch."""
        tmp = _temp_beside(path, data, mode, durable=False)
        self._paths.append(tmp)
        try:
            self.flush()
            before()
        except BaseException:
            with contextlib.suppress(ValueError):
                self._paths.remove(tmp)
            discard(tmp)
            raise
        _replace(tmp, path)
        fsync_dir(path.parent)


class InOrder:
    """Files replaced atomically one after another, each renamed over its name only once its own bytes are on
    disk, so that a crash leaves the old bytes or the new under each name, never a torn file, and the renames
    happen in the order asked; a replace returns once its temp file is written, and its fsync runs beside
    whatever the caller does next (the next file's fsync too).  :meth:`settle` waits for them all and makes the
    renames durable with one fsync of each directory.

    The edge's trust core persists a refresh cycle's timestamp, snapshot
    and targets so, each the moment it verifies (TUF spec 5.4.5, 5.5.7,
    5.6.6): the timestamp's fsync ran while the cycle verified the snapshot,
    instead of before it, and a cycle waits for one directory fsync where it
    waited for one a role."""

    def __init__(self) -> None:
        self._last: asyncio.Task[None] | None = None
        self._replaces: list[asyncio.Task[None]] = []
        self._dirs: dict[Path, None] = {}

    async def replace(self, path: Path, data: bytes, mode: int = 0o644) -> asyncio.Task[None]:
        """Write ``data`` beside ``path`` now; the task that renames it over ``path``, once it is on disk and the
        replace asked before this one has renamed its own (a failed one fails every later one: none is renamed
        out of order)."""
        tmp = await asyncio.to_thread(_temp_beside, path, data, mode, False)
        task = asyncio.ensure_future(self._rename_when_durable(tmp, path, self._last))
        self._last = task
        self._replaces.append(task)
        self._dirs[path.parent] = None
        return task

    @staticmethod
    async def _rename_when_durable(tmp: Path, path: Path, before: asyncio.Task[None] | None) -> None:
        try:
            await asyncio.to_thread(_fsync, tmp)
            if before is not None:
                await asyncio.shield(before)
        except BaseException:
            discard(tmp)
            raise
        await asyncio.to_thread(_replace, tmp, path)

    async def settle(self) -> None:
        """Wait for every replace, then fsync each directory a rename went into; the first failure raises once
        all are done."""
        replaces, self._replaces = self._replaces, []
        ended = await asyncio.gather(*replaces, return_exceptions=True)
        # A replace cancelled (a shutdown) is no failure of the disk's: a refusal being raised stays the news.
        failed = next((e for e in ended if isinstance(e, Exception)), None)
        if replaces:
            for directory in self._dirs:
                await asyncio.to_thread(fsync_dir, directory)
        if failed is not None:
            raise failed


def _flush_pool() -> ThreadPoolExecutor:
    global _flushers
    with _flushers_made:
        if _flushers is None:
            _flushers = ThreadPoolExecutor(_FLUSH_THREADS, thread_name_prefix="flush")
        return _flushers
