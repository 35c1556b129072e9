"""The local directory of trusted metadata: locked, atomic, non-versioned.

Files are named ``ROLE.json`` (role names URL-quoted, so a delegated role
can never name a path outside the directory).  Writes go through
:func:`proxy.util.atomic.atomic_write` (temp file, fsync, rename), so a crash
leaves either the old or the new trusted bytes, never a mix; a refresh
cycle's go through one :class:`~proxy.util.atomic.InOrder`, each renamed
once its bytes are on disk, in order, while the cycle goes on.  An exclusive
``flock`` on ``.lock``, held for the store's lifetime, keeps two processes
from ever writing the same directory.

Every root ever trusted is also kept by version, as ``roots/N.root.json``
(a subdirectory: the directory's top level holds one file per role), so
the chain from the pinned root can be walked again by someone who trusts
nothing in this directory.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path
from urllib.parse import quote

from proxy.protocol.errors import Fault, TrustError
from proxy.util.atomic import InOrder, atomic_write


class MetadataDirLocked(TrustError):
    """Another process holds this metadata directory."""

    reason = "metadata-dir-locked"
    fault = Fault.OURS


class MetadataStore:
    """Trusted metadata bytes on disk."""

    LOCK_NAME = ".lock"
    ROOTS = "roots"

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = None

    def lock(self) -> None:
        """Take the directory for this process (non-blocking: fail if held)."""
        if self._lock_fd is not None:
            return
        fd = os.open(self.directory / self.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise MetadataDirLocked(f"{self.directory} is in use by another process") from None
        self._lock_fd = fd
        # Temp files of a write that a kill -9 interrupted: never read, and nobody else writes here.
        for stale in [*self.directory.glob(".*.tmp"), *(self.directory / self.ROOTS).glob(".*.tmp")]:
            stale.unlink(missing_ok=True)

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def path(self, role: str) -> Path:
        return self.directory / f"{quote(role, safe='')}.json"

    def read(self, role: str) -> bytes | None:
        try:
            return self.path(role).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, role: str, data: bytes) -> None:
        self.lock()
        atomic_write(self.path(role), data)

    async def replace(self, role: str, data: bytes, order: InOrder) -> asyncio.Task[None]:
        """Replace ``role``'s bytes in ``order`` (see :class:`~proxy.util.atomic.InOrder`): the task renaming them."""
        self.lock()
        return await order.replace(self.path(role), data)

    def keep_root(self, version: int, data: bytes) -> None:
        """Keep a trusted root under its version as well."""
        self.lock()
        atomic_write(self.directory / self.ROOTS / f"{version}.root.json", data)

    def kept_root(self, version: int) -> bytes | None:
        try:
            return (self.directory / self.ROOTS / f"{version}.root.json").read_bytes()
        except FileNotFoundError:
            return None
