"""Copies of hash-bin roles that the processes of one cache leave each other: bytes, never trusted.

Each edge worker keeps its own trusted state (a metadata slot of its own)
and its bin-n roles in memory only: they are fetched, not persisted (one
file per bin and per cycle would be PEP 458's 16,384 files).  So the
second worker asked about a project fetched that project's bin-n from the
upstream again, and asked the gateway to publish it ahead of the lookup
(:meth:`proxy.serving.edge.MissProtocol.ask_ahead`): in the first warm
install after a cold one, once for every project the other worker had
served (``bench/results/warm-shared-bins.md``).

Here a process that fetched a bin-n leaves its bytes in ``ROLE.json`` (the
role URL-quoted, so never a path elsewhere), after a line naming their
version, and another reads them when that is the version its snapshot
names, before it asks a mirror.  What is read is verified exactly as a
mirror's answer is (the delegator's keys, the snapshot's version, length
and hashes, expiry), so nothing here is trusted: a copy that does not
verify is fetched instead.  Only bins small enough to be verified on the
event loop are left (64 KiB, the client's bound for that); a larger one is
fetched by every process, as before.

A role's file is rewritten in place, not replaced by a new one: on a
filesystem that scans past recently freed inodes at every file it creates
(ext4 without a journal, ``bench/results/cold-uv-fresh-dirs.md``), a new
inode per version would leave one more for every file the servers create
next to scan past.  A reader that catches a rewrite half done reads bytes
that do not verify, and fetches.  Nothing is fsynced (it is a cache), and
nothing here raises: a cache that cannot be read or written is a fetch,
not a refusal.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import threading
from pathlib import Path
from urllib.parse import quote

from proxy.trust.fetch import pwrite_all

logger = logging.getLogger(__name__)

# The version line before a role's bytes: at most 20 digits and its newline.
_HEAD_MAX = 21


class SharedRoles:
    """``directory``: shared by every process of one cache directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        # role -> (version, bytes) to leave, the highest version per role: a cold install's publishes move a bin
        # on several times a second, and a version superseded before it is written is not written.
        self._pending: dict[str, tuple[int, bytes]] = {}
        self._draining = False
        self._lock = threading.Lock()
        self._job: asyncio.Future[None] | None = None

    def _path(self, role: str) -> Path:
        return self.directory / f"{quote(role, safe='')}.json"

    def read(self, role: str, version: int, limit: int) -> bytes | None:
        """The bytes left for ``role`` at ``version``; None if there are none, or more than ``limit``.

        Only a regular file is read, never through a symlink, and opening never waits (a FIFO planted there
        must not hold the loop this runs on)."""
        try:
            fd = os.open(self._path(role), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            kept = os.read(fd, limit + _HEAD_MAX)
        except OSError:
            return None
        finally:
            os.close(fd)
        head, _, data = kept.partition(b"\n")
        return data if head == b"%d" % version and len(data) <= limit else None

    def leave(self, role: str, version: int, data: bytes) -> None:
        """Write ``data`` as ``role`` at ``version`` soon, off the loop: one thread job takes every copy left
        meanwhile (a thread hop per copy cost more than the write)."""
        with self._lock:
            kept = self._pending.get(role)
            if kept is None or kept[0] <= version:
                self._pending[role] = (version, data)
            if self._draining:
                return
            self._draining = True
        try:
            self._job = asyncio.get_running_loop().run_in_executor(None, self._drain)
        except RuntimeError:  # the executor is shut down (the process stops): nothing more is left
            with self._lock:
                self._pending.clear()
                self._draining = False

    async def drained(self) -> None:
        """Once every copy left so far is written (the job under way writes those left while it runs); for tests."""
        if self._job is not None:
            await self._job

    def _drain(self) -> None:
        try:
            while True:
                with self._lock:
                    if not self._pending:
                        self._draining = False  # under the lock: a leave from now on schedules a job of its own
                        return
                    left, self._pending = self._pending, {}
                for role, (version, data) in left.items():
                    self.write(role, version, data)
        except BaseException:
            with self._lock:
                self._draining = False
            raise

    def write(self, role: str, version: int, data: bytes) -> None:
        """Leave ``data`` as ``role`` at ``version`` now (blocking: :meth:`leave` runs it in a thread); never
        through a symlink, and a file there that is no regular file is left alone."""
        kept = b"%d\n" % version + data
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._path(role), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return
                pwrite_all(fd, kept, 0)
                os.ftruncate(fd, len(kept))
            finally:
                os.close(fd)
        except OSError as e:
            logger.warning("could not leave %s v%d for the other processes in %s: %s", role, version,
                           self.directory, e)
