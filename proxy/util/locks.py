"""Cross-process coordination on a shared cache directory, by ``flock`` alone.

Several processes (workers, or hosts on a shared volume whose filesystem
honours ``flock``) use one cache root.  :func:`try_flock` is the
non-blocking primitive the blob store builds its pins and sweeps on;
:class:`FetchLocks` is the cross-process single flight of downloads: one
lock file per download key under ``<root>/locks/``.  While it holds a
lock, the fetching process announces where its bytes are
(:meth:`Held.announce`: a side file beside the lock, replaced atomically,
gone before the lock is released), so other processes can follow them
(:meth:`FetchLocks.announced`).  :class:`Leadership` picks one process of
several for a periodic job.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

# Waiting for another process's download of the same file: poll its lock this often, at most this long.
_FETCH_LOCK_POLL = (0.005, 0.05)
FETCH_LOCK_WAIT = 900.0
log = logging.getLogger(__name__)


def try_flock(path: Path | str, flags: int, exclusive: bool) -> int | None:
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


class Held:
    """A held download lock: announce the bytes' whereabouts, then :meth:`release`."""

    def __init__(self, path: Path, fd: int) -> None:
        self._path = path
        self._fd = fd
        self._serial = 0

    def announce(self, where: str) -> None:
        """Tell followers the bytes are now at ``where`` (a new file each time the body starts over)."""
        self._serial += 1
        side = self._path.with_suffix(".follow")
        part = side.with_suffix(f".follow.{os.getpid()}")
        part.write_text(f"{os.getpid()} {self._serial} {where}")
        os.replace(part, side)

    def release(self) -> None:
        # Side file, then lock file, then the lock: a follower that finds the lock free
        # finds no announcement left behind; waiters re-check the lock file's inode.
        for path in (self._path.with_suffix(".follow"), self._path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        os.close(self._fd)


class FetchLocks:
    """One lock file per download key under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self._locks = Path(directory)
        self._locks.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self._locks / f"{hashlib.sha256(key.encode()).hexdigest()}.lock"

    def try_hold(self, key: str) -> Held | None:
        """The lock of download ``key`` if no process holds it (never blocks).  A dead holder's
        lock is released by the kernel."""
        path = self._path(key)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            try:
                current = os.stat(path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                # A holder that died left its announcement: nobody must follow that file now.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path.with_suffix(".follow"))
                return Held(path, fd)
            # The previous holder unlinked this file as it let go: lock the new one.
            os.close(fd)

    def announced(self, key: str) -> str | None:
        """What the holder of ``key`` last announced (None: nothing, or nobody holds it)."""
        try:
            return self._path(key).with_suffix(".follow").read_text()
        except FileNotFoundError:
            return None

    @contextlib.asynccontextmanager
    async def hold(self, key: str, wait: float = FETCH_LOCK_WAIT) -> AsyncIterator[bool]:
        """Hold the cross-process lock of ``key``; yields False if ``wait`` ran out.

        The holder does the work; a process that waited re-checks for its
        result after acquiring it.  Past ``wait`` the caller goes ahead
        anyway: two writers of one verified blob are harmless, a wait
        without end is not.
        """
        deadline = time.monotonic() + wait
        delay = _FETCH_LOCK_POLL[0]
        while (held := self.try_hold(key)) is None:
            if time.monotonic() >= deadline:
                log.warning("waited %.0fs for another process's work on %s: doing it too", wait, key)
                yield False
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, _FETCH_LOCK_POLL[1])
        try:
            yield True
        finally:
            held.release()


class Leadership:
    """One process of several holds ``path``'s lock and does a periodic job; another takes over when it dies."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None

    def held(self) -> bool:
        """True while this process leads (tries to take the lead when nobody holds it)."""
        if self._fd is None:
            self._fd = try_flock(self.path, os.O_RDWR | os.O_CREAT, exclusive=True)
        return self._fd is not None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
