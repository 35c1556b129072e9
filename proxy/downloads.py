"""Cold downloads in flight: one fetch per file, followed by every request that wants it.

A :class:`Download` runs the one fetch-and-verify into a store temp file
and publishes the blob only once every signed hash matched.  While it
runs it tells followers how many bytes are in the temp file
(``available``), and bumps ``generation`` when the body starts over from
another mirror, so requests can stream the bytes as they arrive (holding
the final byte back until the download is verified).

Across processes sharing a cache (workers, replicas), a
:class:`~proxy.locks.FetchLocks` lock makes one of them fetch; the others wait for the lock and
then find the blob.  They wait rather than stream because a temp file's
progress and verdict live in the fetching process's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

from proxy.locks import FetchLocks
from proxy.refusals import Busy
from proxy.store import Blob, BlobStore, BlobWriter
from proxy.trust.fetch import Observer, Pace, Sink, Want, fetch_verified
from proxy.upstream import Fetcher


class Download:
    """One fetch in flight; ``result`` is the published blob or the typed refusal."""

    def __init__(self, key: str, want: Want) -> None:
        self.key = key
        self.want = want
        self.path: Path | None = None  # the temp file, once writing started
        self.available = 0  # bytes of the current generation in the temp file
        self.generation = 0
        self.result: asyncio.Future[Blob] = asyncio.get_running_loop().create_future()
        self._changed = asyncio.Event()

    def waiter(self) -> asyncio.Event:
        """An event set at the next change; take it BEFORE looking at the state."""
        return self._changed

    def writing(self, path: Path) -> None:
        """The body goes to the temp file ``path`` from now on."""
        self.path = path
        self._notify()

    def finish(self, task: asyncio.Task[Blob]) -> None:
        """The fetch ``task`` is done: its blob or refusal becomes ``result``."""
        if task.cancelled():
            self.result.cancel()
        elif task.exception() is not None:
            self.result.set_exception(task.exception())  # type: ignore[arg-type]
            self.result.exception()  # nobody may be waiting any more: not "never retrieved"
        else:
            self.result.set_result(task.result())
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


class Tee:
    """A fetch's sink: a temp file (the store's, or any :class:`Sink`), announcing progress to followers."""

    def __init__(self, writer: BlobWriter | Sink, download: Download) -> None:
        self.writer = writer
        self.download = download

    async def write(self, data: bytes) -> None:
        await self.writer.write(data)
        self.download.available += len(data)
        self.download._notify()

    async def restart(self) -> None:
        await self.writer.restart()
        self.download.available = 0
        self.download.generation += 1
        self.download._notify()


class Downloads:
    """The downloads in flight in this process, by key."""

    def __init__(self, store: BlobStore, fetcher: Fetcher, pace: Pace, unknown_length_limit: int,
                 queue_wait: float = 10.0) -> None:
        self.store = store
        self.fetcher = fetcher
        self.pace = pace
        # Bodies of unsigned length reserve space as they grow: bound how many grow at once.
        self._unknown_length = asyncio.Semaphore(unknown_length_limit)
        self._queue_wait = queue_wait
        self._inflight: dict[str, Download] = {}
        self._locks = FetchLocks(store.root / "locks")

    def start(self, key: str, want: Want, urls: list[str], observer: Observer,
              cached: Callable[[], Blob | None]) -> tuple[Download, bool]:
        """The download of ``key``: the one in flight (joined: True), or a new one.

        ``cached`` looks the blob up again once the cross-process lock is held.
        """
        found = self._inflight.get(key)
        if found is not None:
            return found, True
        download = Download(key, want)
        self._inflight[key] = download
        task = asyncio.ensure_future(self._run(download, urls, observer, cached))
        task.add_done_callback(lambda t: self._finished(download, t))
        return download, False

    def _finished(self, download: Download, task: asyncio.Task[Blob]) -> None:
        if self._inflight.get(download.key) is download:
            del self._inflight[download.key]
        download.finish(task)

    async def _run(self, download: Download, urls: list[str], observer: Observer,
                   cached: Callable[[], Blob | None]) -> Blob:
        want = download.want
        async with self._locks.hold(download.key):
            blob = cached()
            if blob is not None:
                return blob
            async with self._slot(want.exact), self.store.writer(want.length, want.exact) as writer:
                download.writing(writer.path)
                digests = await fetch_verified(self.fetcher, want, urls, Tee(writer, download),
                                               pace=self.pace, observer=observer, also=("sha256",))
                return await writer.publish(digests["sha256"])

    @contextlib.asynccontextmanager
    async def _slot(self, exact: bool):  # type: ignore[no-untyped-def]
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
