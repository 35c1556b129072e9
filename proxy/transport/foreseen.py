"""Downloads started before they are asked for: an edge told which files its next lookup reads.

A gateway's answer to a publish names the files an edge's next refresh and
lookup of the project will fetch: the new snapshot, the project's bin-n,
its pages.  In the TUF order each is asked for only once the one before it
verified, one round trip after another.  :class:`Foreseen` starts them all
at once when told (:meth:`Foreseen.expect`), or takes the bodies the answer
carried (:meth:`Foreseen.give`), and hands each body over when its URL is
asked for; nothing is trusted sooner, since whoever asks still verifies
every byte exactly as a body it fetched itself.

Only names whose bytes never change are to be foreseen: a consistent
snapshot's versioned metadata (``N.snapshot.json``) and hash-named targets,
and the next root (``N+1.root.json``), which a cycle asks for first and
which is usually not there.  For that one alone (``absent_ok``) a 404 seen
ahead is handed over as the 404 it was: one taken a moment before is
what a slower network would have answered, and the cycle goes on to the
timestamp without waiting a round trip for it.  A 404 kept a while may
predate a root published since: a client whose timestamp then fails to
verify probes for the next root again, live, before it calls the timestamp
a lie (:meth:`proxy.trust.client.TrustedClient._cycle`).  Any other
failure ahead is fetched again.
A body kept a moment may be older than the newest ``timestamp.json``, which
the client would then take for a rollback.  Bounded: at most ``keep``
bodies, each used once and within ``ttl`` seconds, each within the length
its caller allows (a longer one, or a failed download, is fetched again the
ordinary way, so a wrong guess costs a download and nothing else).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

from proxy.transport.upstream import ByteStream, DownloadHTTPError, Fetcher

KEEP = 32
TTL = 30.0


class Foreseen(Fetcher):
    """``inner``, with downloads started ahead by :meth:`expect`."""

    def __init__(self, inner: Fetcher, keep: int = KEEP, ttl: float = TTL,
                 counted: Callable[[str], None] | None = None) -> None:
        self.inner = inner
        self.keep = keep
        self.ttl = ttl
        # url -> (when started, the download or the body given, whether its 404 is handed over)
        self._started: OrderedDict[str, tuple[float, asyncio.Future[bytes], bool]] = OrderedDict()
        self._counted = counted or (lambda outcome: None)  # "used" or "wasted", once per download started

    def expect(self, url: str, max_length: int, absent_ok: bool = False) -> None:
        """Start downloading ``url`` (at most ``max_length`` bytes), unless it is already under way; with
        ``absent_ok``, its 404 is handed over too (see the module docstring)."""
        loop = asyncio.get_running_loop()
        self._expire(loop.time())
        if url in self._started:
            return
        self._keep(url, loop.create_task(self.inner.fetch_bytes(url, max_length)), absent_ok)

    def give(self, url: str, body: bytes | None) -> None:
        """Hand ``body`` over when ``url`` is asked for, as if downloaded now; None: hand over a 404 (``url`` is
        absent).  For a body that came with the answer that named it: the round trip it saves is the point."""
        loop = asyncio.get_running_loop()
        self._expire(loop.time())
        given: asyncio.Future[bytes] = loop.create_future()
        if body is None:
            given.set_exception(DownloadHTTPError(url, 404))
        else:
            given.set_result(body)
        self._waste_started(url)
        self._keep(url, given, body is None)

    def _keep(self, url: str, download: asyncio.Future[bytes], absent_ok: bool) -> None:
        download.add_done_callback(_retrieved)
        self._started[url] = (asyncio.get_running_loop().time(), download, absent_ok)
        while len(self._started) > self.keep:
            _, (_, oldest, _) = self._started.popitem(last=False)
            self._waste(oldest)

    def _waste_started(self, url: str) -> None:
        found = self._started.pop(url, None)
        if found is not None:
            self._waste(found[1])

    def _expire(self, now: float) -> None:
        while self._started:
            url, (began, task, _) = next(iter(self._started.items()))
            if now - began <= self.ttl:
                return
            del self._started[url]
            self._waste(task)

    def _waste(self, task: asyncio.Future[bytes]) -> None:
        task.cancel()
        self._counted("wasted")

    def stream(self, url: str, max_length: int, start: int = 0) -> AbstractAsyncContextManager[ByteStream]:
        found = self._started.pop(url, None) if start == 0 else None
        if found is not None and asyncio.get_running_loop().time() - found[0] <= self.ttl:
            return self._handed_over(found[1], url, max_length, found[2])
        if found is not None:
            self._waste(found[1])
        return self.inner.stream(url, max_length, start) if start else self.inner.stream(url, max_length)

    @contextlib.asynccontextmanager
    async def _handed_over(self, task: asyncio.Future[bytes], url: str, max_length: int,
                           absent_ok: bool) -> AsyncIterator[ByteStream]:
        # wait() rather than await: the download's own failure is not ours (we fetch again), a cancel of us is.
        await asyncio.wait({task})
        failed = task.exception() if not task.cancelled() else None
        if absent_ok and isinstance(failed, DownloadHTTPError) and failed.status == 404:
            self._counted("used")
            raise DownloadHTTPError(url, 404)
        data = task.result() if not task.cancelled() and failed is None else None
        if data is None or len(data) > max_length:
            self._counted("wasted")
            async with self.inner.stream(url, max_length) as body:
                yield body
            return
        self._counted("used")
        yield ByteStream(_once(data), len(data))

    async def close(self) -> None:
        for _, task, _ in self._started.values():
            task.cancel()  # not counted: the process is stopping
        self._started.clear()
        await self.inner.close()


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _retrieved(task: asyncio.Future[bytes]) -> None:
    """A download nobody came for may have failed: that is no error of anyone's."""
    if not task.cancelled():
        task.exception()
