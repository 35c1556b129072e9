"""Cold downloads in flight: one fetch per file, followed by every request that wants it.

A :class:`Download` is what requests stream from: ``available`` bytes of
the current ``generation`` can be read through :meth:`Download.open`,
``result`` becomes the published blob (or the typed refusal).  Requests
hold the final byte back until ``result`` is a blob, and reset when the
generation changes under them (the body started over) or the download
fails.  :class:`Tee` is the sink that feeds a download in this process
(the gateway's files use it over a temp file of their own, restarted in
place).

Across processes sharing a cache (workers, replicas), a
:class:`~proxy.util.locks.FetchLocks` lock makes one of them fetch.  That
process runs the one fetch-and-verify into a store temp file (a new file
each time the body starts over from another mirror) and announces the
file beside its lock.  A :class:`Download` in any other process follows
that file as it grows (:class:`_Follower`): it reads the bytes, hashes
them itself with the one :class:`~proxy.protocol.hashing.StreamingVerifier`
against the signed hashes, and makes them ``available`` as they pass.
Its result is the blob only once its own hash matched AND the holder
published the blob; a new announced file (a restart), its own mismatch,
or the holder's end without a blob change the generation or fail it.
Because a temp file is never rewritten in place, a byte read at an
offset of one file is the byte that was hashed there, whoever reads it.
When the holder ends without a blob, the follower takes the lock and
fetches itself (or refuses with the lie it saw); when the holder's file
makes no progress for a while (a frozen process), it fetches without the
lock: two writers of one verified blob are harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.protocol.errors import Busy, RepositoryError
from proxy.protocol.hashing import StreamingVerifier
from proxy.storage.store import Blob, BlobStore, BlobWriter
from proxy.transport.upstream import Fetcher
from proxy.trust.fetch import Observer, Pace, Sink, Want, fetch_verified
from proxy.util.locks import FetchLocks, Held

if TYPE_CHECKING:
    from proxy.storage.tiered import SharedTier

# A follower looks at the holder's file this often (backing off while nothing changes).
_FOLLOW_POLL = (0.005, 0.05)
# ... reads and hashes at most this much at a time.
_FOLLOW_READ = 4 * 2**20
# A download refused for the repository's lie answers resumes of its key this long (see InFlight).
LIE_MEMORY = 60.0
LIES_KEPT = 1024
log = logging.getLogger(__name__)


class Download:
    """One download in flight; ``result`` is the published blob or the typed refusal."""

    def __init__(self, key: str, want: Want) -> None:
        self.key = key
        self.want = want
        self.available = 0  # bytes of the current generation in its file (readers hold the last back)
        self.generation = 0
        self.result: asyncio.Future[Blob] = asyncio.get_running_loop().create_future()
        self._changed = asyncio.Event()
        self._fd = -1  # read-only, on the current generation's file
        self._fd_closer: weakref.finalize[[int], Download] | None = None
        self._sourced = False

    def waiter(self) -> asyncio.Event:
        """An event set at the next change; take it BEFORE looking at the state."""
        return self._changed

    def open(self) -> int | None:
        """A new descriptor (the caller closes it) on the current generation's bytes; None if none."""
        return os.dup(self._fd) if self._fd >= 0 else None

    def writing(self, path: Path) -> None:
        """The body goes to the temp file ``path`` from now on (from byte 0)."""
        self._source(os.open(path, os.O_RDONLY))

    def verified(self, blob: Blob) -> None:
        """Every byte is in and verified: ``blob`` becomes ``result`` before the fetch's task ends, which still
        makes the file durable under its name (the gateway's kept files); readers send the last bytes now."""
        if not self.result.done():
            self.result.set_result(blob)
            self._notify()

    def finish(self, task: asyncio.Task[Blob]) -> None:
        """The fetch ``task`` is done: its blob or refusal becomes ``result`` (unless :meth:`verified` said so).

        A blob's file stays open until the download is dropped: it is the published blob's inode, so a
        request that has not opened it yet still reads the verified bytes when the store (this process's
        or another's on the same cache) evicts the blob a moment after its publish."""
        if self.result.done():  # verified earlier: what follows failing loses the kept copy, not the answer
            if not task.cancelled():
                task.exception()  # retrieved: its task logged it
        elif task.cancelled():
            self._close()
            self.result.cancel()
        elif task.exception() is not None:
            self._close()
            self.result.set_exception(task.exception())  # type: ignore[arg-type]
            self.result.exception()  # nobody may be waiting any more: not "never retrieved"
        else:
            self.result.set_result(task.result())
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _source(self, fd: int) -> None:
        """The bytes now come from ``fd`` (-1: nowhere yet), from byte 0: a new generation."""
        self._close()
        self._fd = fd
        if fd >= 0:
            self._fd_closer = weakref.finalize(self, os.close, fd)
        if self._sourced or self.available:
            self.generation += 1
        self._sourced = True
        self.available = 0
        self._notify()

    def _close(self) -> None:
        if self._fd_closer is not None:
            self._fd_closer()
            self._fd_closer = None
        self._fd = -1


class InFlight:
    """Downloads in flight by key, and for a while those that ended in the repository's lie.

    A client whose download was cut because the bytes did not verify
    resumes it: pip sends ``Range`` for the rest, six times, and retries
    each 502 five times, and each of those would fetch the whole body once
    more to see the same lie (30 fetches of a 50 MB file for one install).
    Such a resume continues the very body that lied, so for ``LIE_MEMORY``
    seconds (at most ``LIES_KEPT`` keys) it joins the finished download and
    gets the refusal at once.  A plain request fetches again: an upstream
    that serves the right bytes again is trusted the moment it does.
    """

    def __init__(self) -> None:
        self._running: dict[str, Download] = {}
        self._lied: OrderedDict[str, tuple[float, Download]] = OrderedDict()

    def get(self, key: str, resume: bool = False) -> Download | None:
        """The download of ``key`` to join: running, or (for a ``resume``) refused for a lie a moment ago;
        None: start one."""
        found = self._running.get(key)
        if found is not None or not resume:
            return found
        lied = self._lied.get(key)
        if lied is None:
            return None
        if lied[0] > time.monotonic():
            return lied[1]
        del self._lied[key]
        return None

    def add(self, download: Download, task: asyncio.Task[Blob]) -> None:
        """``download`` runs as ``task``; once it ends, it is finished and forgotten (remembered if it lied)."""
        self._running[download.key] = download
        task.add_done_callback(lambda t: self._finished(download, t))

    def _finished(self, download: Download, task: asyncio.Task[Blob]) -> None:
        if self._running.get(download.key) is download:
            del self._running[download.key]
        download.finish(task)
        if not task.cancelled() and isinstance(task.exception(), RepositoryError):
            self._lied.pop(download.key, None)
            self._lied[download.key] = (time.monotonic() + LIE_MEMORY, download)
            while len(self._lied) > LIES_KEPT:
                self._lied.popitem(last=False)


class Tee:
    """A fetch's sink: a temp file (the store's, or any :class:`Sink`), announcing progress to followers
    in this process; a restart truncates it."""

    def __init__(self, writer: BlobWriter | Sink, download: Download) -> None:
        self.writer = writer
        self.download = download

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await self.writer.write(data)
        self.download.available += len(data)
        self.download._notify()

    async def restart(self) -> None:
        await self.writer.restart()
        self.download.available = 0
        self.download.generation += 1
        self.download._notify()


class _StoreTee(Tee):
    """The store's sink: a new temp file per body, announced to followers in other processes too."""

    def __init__(self, store: BlobStore, download: Download, held: Held | None) -> None:
        self.store = store
        self.download = download
        self.held = held
        self._files = contextlib.AsyncExitStack()

    async def open(self) -> None:
        want = self.download.want
        writer = self.writer = await self._files.enter_async_context(self.store.writer(want.length, want.exact))
        assert writer.path is not None
        self.download.writing(writer.path)
        if self.held is not None:
            self.held.announce(str(writer.path))

    async def restart(self) -> None:
        # A new file, not a truncated one: bytes once written at an offset never change,
        # so whoever read them (here or in a follower) read what was hashed.
        await self._files.aclose()
        await self.open()

    async def publish(self, sha256: str) -> Blob:
        assert isinstance(self.writer, BlobWriter)
        return await self.writer.publish(sha256)

    async def close(self) -> None:
        await self._files.aclose()


class _Follower:
    """Another process's fetch of the same file, read and hashed here as it is written."""

    def __init__(self, download: Download, store: BlobStore) -> None:
        want = download.want
        self.download = download
        self.store = store
        self.verifier = StreamingVerifier(want.path, want.hashes, want.length, exact=want.exact,
                                          role=want.role, also=("sha256",))
        self.source: str | None = None  # the announcement followed
        self.path = ""
        self.fd = -1
        self.digests: dict[str, str] | None = None  # set once its own hash matched
        self.lie: RepositoryError | None = None  # the first mismatch it saw itself
        self.dead = False  # the followed file cannot verify any more

    async def step(self, announced: str | None, final: bool = False) -> bool:
        """Follow ``announced`` (the holder's file; None once it let go); True if anything moved.

        ``final``: the holder is gone, so the followed file will not grow any more.
        """
        moved = False
        if announced is not None and announced != self.source:
            self._switch(announced)
            moved = True
        if self.fd < 0 or self.dead or self.digests is not None:
            return moved
        verifier = self.verifier
        n = min(verifier.length - verifier.received, os.fstat(self.fd).st_size - verifier.received, _FOLLOW_READ)
        if n > 0 and await asyncio.to_thread(self._take, verifier.received, n) > 0:
            self.download.available = verifier.received
            self.download._notify()
            moved = True
        if self.download.want.exact and verifier.received == verifier.length:
            self._conclude()
        elif final and not moved:
            if self._renamed():
                self._conclude()
            else:
                self.dead = True  # given up by its holder, not a verdict on the bytes
        return moved

    def _switch(self, announced: str) -> None:
        self.source = announced
        self.path = announced.split(" ", 2)[2]
        self.verifier.restart()
        self.digests, self.dead = None, False
        if self.fd >= 0:
            os.close(self.fd)
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:  # already given up by the holder: the next announcement follows
            self.fd, self.dead = -1, True
        self.download._source(os.dup(self.fd) if self.fd >= 0 else -1)

    def _take(self, offset: int, n: int) -> int:
        """Read and hash ``n`` bytes at ``offset`` (in a thread); how many there were."""
        data = os.pread(self.fd, n, offset)
        self.verifier.admit(len(data))
        self.verifier.hash(data)
        return len(data)

    def _conclude(self) -> None:
        """Every byte of the followed file is read: its own verdict on them."""
        try:
            self.digests = self.verifier.finish()
        except RepositoryError as e:
            self.lie = self.lie or e
            self.dead = True
            self.download._source(-1)  # what its readers got must never complete

    def _renamed(self) -> bool:
        """The holder published the followed file (its temp name is gone, the file is not)."""
        if os.fstat(self.fd).st_nlink == 0:
            return False
        try:
            return os.stat(self.path).st_ino != os.fstat(self.fd).st_ino  # the name was taken again
        except FileNotFoundError:
            return True

    def published(self) -> Blob | None:
        """The blob, once its own hash matched and the holder published these very bytes."""
        if self.digests is None or not self._renamed():
            return None
        return self.store.get(self.digests["sha256"], self.verifier.received)


class ReadAheads:
    """Files fetched ahead of their request, within bounds.

    A resolver (pip, uv) asks for the ``.metadata`` of the version it picks
    and, once it has resolved everything, for the file: whoever serves the
    first may start the second, so the download finds it kept or under way
    instead of one more upstream round trip away.  At most ``at_once`` run
    at a time, none of unknown size or larger than ``max_size``: a guess
    must not crowd out what clients ask for.
    """

    def __init__(self, at_once: int = 8, max_size: int = 64 * 2**20) -> None:
        self.at_once, self.max_size = at_once, max_size
        self._keys: set[str] = set()

    def admits(self, key: str, size: int | None) -> bool:
        """Whether a file of ``size`` bytes may be read ahead now."""
        return size is not None and size <= self.max_size and len(self._keys) < self.at_once and key not in self._keys

    def started(self, key: str, ended: asyncio.Future[Any]) -> None:
        """``key`` is being read ahead until ``ended`` is done (its download's result, or the task that keeps it)."""
        self._keys.add(key)
        ended.add_done_callback(lambda _: self._keys.discard(key))


class Downloads:
    """The downloads in flight in this process, by key."""

    def __init__(self, store: BlobStore, fetcher: Fetcher, pace: Pace, unknown_length_limit: int,
                 queue_wait: float = 10.0, shared: SharedTier | None = None) -> None:
        self.store = store
        # The bucket behind the local store (--store s3://...): where a local miss looks next.
        self.shared = shared
        self.fetcher = fetcher
        self.pace = pace
        # Bodies of unsigned length reserve space as they grow: bound how many grow at once.
        self._unknown_length = asyncio.Semaphore(unknown_length_limit)
        self._queue_wait = queue_wait
        self._inflight = InFlight()
        self._locks = FetchLocks(store.root / "locks")
        # Following another process's file that makes no progress this long: fetch it too.
        self._follow_stall = max(60.0, 3 * pace.stall)

    def in_flight(self, key: str) -> bool:
        """Whether this process fetches ``key`` now."""
        return self._inflight.get(key, False) is not None

    def start(self, key: str, want: Want, urls: list[str], observer: Observer,
              cached: Callable[[], Blob | None], resume: bool = False) -> tuple[Download, bool]:
        """The download of ``key``: the one in flight (joined: True), or a new one.

        ``cached`` looks the blob up again once the cross-process lock is held;
        ``resume``: the client continues a body it holds part of (see :class:`InFlight`).
        """
        found = self._inflight.get(key, resume)
        if found is not None:
            return found, True
        download = Download(key, want)
        self._inflight.add(download, asyncio.ensure_future(self._run(download, urls, observer, cached)))
        return download, False

    async def _run(self, download: Download, urls: list[str], observer: Observer,
                   cached: Callable[[], Blob | None]) -> Blob:
        follower = _Follower(download, self.store)
        try:
            return await self._follow_or_fetch(download, follower, urls, observer, cached)
        finally:
            if follower.fd >= 0:
                os.close(follower.fd)

    async def _follow_or_fetch(self, download: Download, follower: _Follower, urls: list[str],
                               observer: Observer, cached: Callable[[], Blob | None]) -> Blob:
        """Fetch under the lock, or follow its holder's file until a verdict (see the module docstring)."""
        key = download.key
        stalled = time.monotonic() + self._follow_stall
        delay = _FOLLOW_POLL[0]
        while True:
            held = self._locks.try_hold(key)
            if held is not None:
                try:
                    return await self._as_holder(download, follower, urls, observer, cached, held)
                finally:
                    held.release()
            moved = await follower.step(self._locks.announced(key))
            blob = follower.published()
            if blob is not None:
                return blob
            now = time.monotonic()
            if moved:
                stalled, delay = now + self._follow_stall, _FOLLOW_POLL[0]
                continue
            if now >= stalled:
                log.warning("another process's download of %s made no progress for %.0fs: fetching it too",
                            key, self._follow_stall)
                return await self._fetch(download, urls, observer, None)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _FOLLOW_POLL[1])

    async def _as_holder(self, download: Download, follower: _Follower, urls: list[str],
                         observer: Observer, cached: Callable[[], Blob | None], held: Held) -> Blob:
        # Whoever held the lock before is gone: what it left is final.
        while await follower.step(None, final=True):
            pass
        blob = follower.published()
        if blob is not None:
            return blob
        if follower.lie is not None:
            raise follower.lie  # the upstream lied to the holder too; seen here, not guessed
        blob = cached()
        if blob is not None:
            if follower.source is not None:
                download._source(-1)  # bytes sent from a file that did not complete: start over
            return blob
        return await self._fetch(download, urls, observer, held)

    async def _fetch(self, download: Download, urls: list[str], observer: Observer, held: Held | None) -> Blob:
        if self.shared is None:
            return await self._fetch_upstream(download, held, urls, observer)
        return await self.shared.fetch(download.want, urls, observer, partial(self._fetch_upstream, download, held))

    async def _fetch_upstream(self, download: Download, held: Held | None, urls: list[str],
                              observer: Observer) -> Blob:
        want = download.want
        async with self._slot(want.exact):
            tee = _StoreTee(self.store, download, held)
            try:
                await tee.open()
                digests = await fetch_verified(self.fetcher, want, urls, tee,
                                               pace=self.pace, observer=observer, also=("sha256",))
                return await tee.publish(digests["sha256"])
            finally:
                await tee.close()

    @contextlib.asynccontextmanager
    async def _slot(self, exact: bool):
        if exact:
            yield
            return
        try:
            async with asyncio.timeout(self._queue_wait):
                await self._unknown_length.acquire()
        except TimeoutError:
            raise Busy("too many downloads of unsigned length in progress") from None
        try:
            yield
        finally:
            self._unknown_length.release()
