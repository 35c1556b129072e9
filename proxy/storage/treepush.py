"""A signed tree pushed to a bucket in an order that is safe for readers.

The gateway signs into a directory (``DIR/public``); with ``--store
s3://...`` that tree is copied into the bucket after every signing batch
(and every few seconds, for files fetched meanwhile), so edges and CDNs can
read the published repository straight from the bucket.  Files the gateway
keeps elsewhere (``--cache-dir DIR2``: ``DIR2/packages/``) are pushed with
it, under the same names as in the tree.  Each push uploads what changed
since the last one in this order:

1. everything outside ``metadata/`` (pages and distribution files, all
   under hashed, immutable names);
2. versioned metadata other than snapshot (``N.root.json``, ``N.targets.json``,
   ``N.bins.json``, ``N.bin-K.json``);
3. ``N.snapshot.json``;
4. ``timestamp.json`` (and any other unversioned file), last.

A reader that sees a new timestamp therefore finds its snapshot, the bins
it names and every page and file they list.  Each object is one PUT, so it
is whole or absent.  Then metadata versions and pages this pusher uploaded
and the gateway has since collected (after ``--gc-grace``, unreferenced)
are deleted from the bucket too; files under ``packages/`` never are (a
lost ``--cache-dir`` must not empty the bucket of files pages list), nor
is anything this process did not upload (after a restart, what was
collected meanwhile stays: a lifecycle rule may expire it).  Workers of one gateway push one at a time (a
``flock`` on ``lock_path`` across scan and upload), and the unversioned
files are uploaded as they were when scanned: a push never uploads a
timestamp newer than the snapshot it scanned, and a later push never an
older one.  With a :class:`~proxy.storage.leader.Fence` (``--leader-lease``),
only the leader pushes, ``timestamp.json`` goes through the fence, and
versioned metadata is created only where absent (``If-None-Match: *``; the
same bytes already there are fine, other bytes step the leader down); a
replica's shared state (:mod:`proxy.gateway.shared`) is synced before anything
else, on followers too.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

from proxy.storage.leader import GENERATION_META, TIMESTAMP_KEY, Fence, LeaseLost
from proxy.transport.bucket import Bucket
from proxy.util.journal import Journal

log = logging.getLogger(__name__)
_VERSIONED = re.compile(r"\d+\.[^/]+\.json")
_UNVERSIONED = ("metadata/timestamp.json", "metadata/root.json")
Stamp = tuple[int, int, int]  # inode, size, mtime_ns: an atomic replace always changes the inode


def _stamp(st: os.stat_result) -> Stamp:
    return st.st_ino, st.st_size, st.st_mtime_ns


# Names whose bytes never change: a page under its hash, a file under its pinned name.  Not versioned metadata:
# another leader's version under the same name must reach the fence's check (create_or_same), same size or not.
_IMMUTABLE = re.compile(r"(?:packages/.+|simple/.*/[0-9a-f]{64,128}\.[^/]+)")


def _held(relative: str, path: Path, size: int, there: tuple[int, str] | None) -> bool:
    """Whether the bucket's object (size, ETag) already holds ``path``'s bytes (see :meth:`TreePush._walked`)."""
    if there is None:
        return False
    if _IMMUTABLE.fullmatch(relative):
        # Its bytes never change, and the bucket's came from a verified, fsynced file: a local copy of another
        # size was damaged since (the gateway re-checks its own at first serve and pushes what it fetches again).
        return True
    return there[0] == size and hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest() == there[1]


@contextlib.asynccontextmanager
async def _flock(path: Path) -> AsyncIterator[None]:
    """An exclusive ``flock`` on ``path``, waited for in a thread."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _rank(relative: str) -> int:
    if not relative.startswith("metadata/"):
        return 0
    name = relative.rsplit("/", 1)[-1]
    if not _VERSIONED.fullmatch(name):
        return 3
    return 2 if name.endswith(".snapshot.json") else 1


class TreePush:
    """Copies ``root`` (and ``more``) into ``bucket`` (see the module docstring); one push at a time.

    ``more`` maps a name in the tree (``"packages"``) to the directory that holds it instead.
    """

    def __init__(self, bucket: Bucket, root: Path, lock_path: Path, more: dict[str, Path] | None = None,
                 fence: Fence | None = None, state: Callable[[], Awaitable[None]] | None = None,
                 journal: Journal | None = None) -> None:
        self.bucket = bucket
        self.fence = fence
        self.state = state  # a replica's shared state, synced first (the leader's before the pages relying on it)
        self.root = root
        self.lock_path = lock_path
        self.trees = {"": root, **{f"{name.strip('/')}/": directory for name, directory in (more or {}).items()}}
        self._pushed: dict[str, Stamp] = {}  # relative path -> its stamp when last pushed
        # What the tree's writers wrote since (proxy.util.journal): after the first push, read instead of a walk.
        self.journal = journal
        self._scanned = False
        self._backlog: tuple[list[str], list[str]] = ([], [])  # taken from the journal, not pushed yet
        self._lock = asyncio.Lock()

    def _changed(self, held: dict[str, tuple[int, str]] | None = None) -> tuple[list[tuple[str, Path | bytes, Stamp]], list[str]]:
        """What changed since the last push, in push order (unversioned metadata as its bytes now),
        and what was pushed and has been collected since (never files).  The whole tree is walked at the
        first push (and when there is no journal), the journal read after that."""
        if self.journal is None or not self._scanned:
            if self.journal is not None:
                self.journal.skip()  # this walk covers what was written before it
            self._scanned = True
            return self._walked(held)
        # Unversioned metadata is read before the journal: its writer told the journal before writing it, so
        # every file the timestamp read here reaches is in what is taken next.  It is pushed when its stamp
        # moved, journal line or not: a push that took the line between the writer's append and its write
        # pushed the old bytes, and no later line would name the new ones.
        unversioned: dict[str, tuple[bytes, Stamp]] = {}
        for name in _UNVERSIONED:
            with contextlib.suppress(FileNotFoundError):
                stamp = _stamp((self.root / name).stat())  # before the bytes: a write in between is seen next time
                unversioned[name] = ((self.root / name).read_bytes(), stamp)
        wrote, removed = self.journal.take()
        wrote, removed = self._backlog[0] + wrote, self._backlog[1] + removed
        moved = [name for name, (_, stamp) in unversioned.items() if self._pushed.get(name) != stamp]
        found: list[tuple[str, Path | bytes, Stamp]] = []
        for relative in dict.fromkeys([*wrote, *moved]):
            path = self._local(relative)
            if path is None:
                continue
            if _rank(relative) == 3:
                if relative in unversioned:
                    found.append((relative, *unversioned[relative]))
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue  # collected meanwhile
            found.append((relative, path, _stamp(st)))
        gone = [r for r in dict.fromkeys(removed) if self._local(r) is not None and not r.startswith("packages/")]
        self._backlog = ([f[0] for f in found], gone)  # until pushed
        return sorted(found, key=lambda f: (_rank(f[0]), f[0])), gone

    def _local(self, relative: str) -> Path | None:
        """Where a name in the bucket lives here (None for a name no tree holds, or a temp file)."""
        if relative.startswith(".") or "/." in relative or ".." in relative.split("/"):
            return None
        for prefix, directory in self.trees.items():
            if prefix and relative.startswith(prefix):
                return directory / relative[len(prefix):]
        return self.root / relative

    def _walked(self, held: dict[str, tuple[int, str]] | None = None) -> tuple[list[tuple[str, Path | bytes, Stamp]], list[str]]:
        """Every file not pushed yet; at a first push, ``held`` (the bucket's inventory) says which are there
        already: a name whose bytes never change under it (a page under its hash, a file under its pinned
        name) whatever its size, any other with the same size and MD5 as its ETag.  A restart then uploads
        what changed while it was down, not the whole tree again."""
        found: list[tuple[str, Path | bytes, Stamp]] = []
        seen = set()
        for path, relative in self._files():
            seen.add(relative)
            try:
                st = path.stat()
            except FileNotFoundError:
                continue  # collected meanwhile
            if not path.is_file():
                continue
            stamp = _stamp(st)
            if self._pushed.get(relative) == stamp:
                continue
            try:
                data: Path | bytes = path.read_bytes() if _rank(relative) == 3 else path
                if held is not None and _held(relative, path, st.st_size, held.get(relative)):
                    self._pushed[relative] = stamp
                    continue
                found.append((relative, data, stamp))
            except FileNotFoundError:
                continue
        gone = [relative for relative in self._pushed if relative not in seen and not relative.startswith("packages/")]
        return sorted(found, key=lambda f: (_rank(f[0]), f[0])), gone

    def _files(self) -> Iterator[tuple[Path, str]]:
        """Every file of the trees with its name in the bucket, but temp files of atomic writes."""
        for prefix, directory in self.trees.items():
            for path in directory.rglob("*"):
                relative = path.relative_to(directory).as_posix()
                if not (relative.startswith(".") or "/." in relative):
                    yield path, prefix + relative

    async def push(self) -> int:
        """Upload what changed, in order; how many files.  BucketUnavailable if the bucket fails (retried next push)."""
        async with self._lock, _flock(self.lock_path):
            if self.state is not None:
                await self.state()
            if self.fence is not None and not self.fence.lease.leader:
                return 0  # a follower: the leader publishes
            held = await self.bucket.inventory() if not self._scanned else None
            changed, gone = await asyncio.to_thread(self._changed, held)
            for relative, data, stamp in changed:
                if self.fence is not None and _rank(relative) and not self.fence.lease.leader:
                    # A leader frozen mid-push that wakes past its lease writes no more metadata.
                    raise LeaseLost(f"lease of {self.bucket.url} lost during a push: {relative} not written")
                try:
                    if self.fence is not None and relative == TIMESTAMP_KEY and isinstance(data, bytes):
                        await self.fence.write(data)
                    elif self.fence is not None and _rank(relative) in (1, 2):
                        # A version is written once: other bytes under its name are another leader's.
                        meta = {GENERATION_META: str(self.fence.lease.generation)}
                        if not await self.bucket.create_or_same(relative, data, meta):
                            self.fence.lease.step_down()
                            raise LeaseLost(f"{self.bucket.url}{relative} holds another writer's bytes: another "
                                            "replica leads; stepped down")
                    else:
                        await self.bucket.replace(relative, data)
                except FileNotFoundError:
                    continue  # removed by the gateway's collection between the scan and now
                self._pushed[relative] = stamp
            for relative in gone:  # after the timestamp: nothing it names is among them
                await self.bucket.delete(relative)
                self._pushed.pop(relative, None)
            self._backlog = ([], [])
            if changed or gone:
                log.info("pushed %d file(s) of %s to %s, deleted %d collected there", len(changed), self.root,
                         self.bucket.url, len(gone))
            return len(changed)

    async def push_logged(self) -> None:
        """One push whose failure is logged, not raised (retried by :meth:`keep_pushing`)."""
        try:
            await self.push()
        except Exception as e:  # noqa: BLE001 - a bucket outage must not end the caller
            log.warning("push to %s failed: %s", self.bucket.url, e)

    async def keep_pushing(self, interval: float) -> None:
        """Push every ``interval`` seconds (files fetched between signing batches); failures are logged and retried."""
        while True:
            await asyncio.sleep(interval)
            await self.push_logged()
