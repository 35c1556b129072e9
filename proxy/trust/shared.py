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
verify is fetched instead.

A role's file is rewritten in place, not replaced by a new one: on a
filesystem that scans past recently freed inodes at every file it creates
(ext4 without a journal, ``bench/results/cold-uv-fresh-dirs.md``), a new
inode per version would leave one more for every file the servers create
next to scan past.  A reader
that catches a rewrite half done reads bytes that do not verify, and
fetches.  Nothing is fsynced (it is a cache), and nothing here raises: a
cache that cannot be read or written is a fetch, not a refusal.
"""

from __future__ import annotations

import asyncio
import logging
import os
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
        # role -> (version, bytes) to leave, the newest per role: a cold install's publishes move a bin on
        # several times a second, and a version superseded before it is written is not written.
        self._pending: dict[str, tuple[int, bytes]] = {}
        self._draining = False
        self._lock = threading.Lock()
        self._job: asyncio.Future[None] | None = None

    def _path(self, role: str) -> Path:
        return self.directory / f"{quote(role, safe='')}.json"

    def read(self, role: str, version: int, limit: int) -> bytes | None:
        """The bytes left for ``role`` at ``version``; None if there are none, or more than ``limit``."""
        try:
            with open(self._path(role), "rb") as f:
                kept = f.read(limit + _HEAD_MAX)
        except OSError:
            return None
        head, _, data = kept.partition(b"\n")
        return data if head == b"%d" % version and len(data) <= limit else None

    def leave(self, role: str, version: int, data: bytes) -> None:
        """Write ``data`` as ``role`` at ``version`` soon, off the loop: one thread job takes every copy left
        meanwhile (a thread hop per copy cost more than the write)."""
        with self._lock:
            self._pending[role] = (version, data)
            if self._draining:
                return
            self._draining = True
        self._job = asyncio.get_running_loop().run_in_executor(None, self._drain)

    async def drained(self) -> None:
        """Once every copy left so far is written (the job under way writes those left while it runs)."""
        if self._job is not None:
            await self._job

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._draining = False
                    return
                left, self._pending = self._pending, {}
            for role, (version, data) in left.items():
                self.write(role, version, data)

    def write(self, role: str, version: int, data: bytes) -> None:
        """Leave ``data`` as ``role`` at ``version`` (blocking: a thread)."""
        kept = b"%d\n" % version + data
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._path(role), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                pwrite_all(fd, kept, 0)
                os.ftruncate(fd, len(kept))
            finally:
                os.close(fd)
        except OSError as e:
            logger.warning("could not leave %s v%d for the other processes in %s: %s", role, version,
                           self.directory, e)
