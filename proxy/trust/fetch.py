"""The one fetch-and-verify: bytes of a target from its mirrors, checked as they arrive.

Every download of something signed (a file or page in the proxy, a target
in ``tufproxy client`` or ``mirror sync``) goes through :func:`fetch_verified`:

* mirrors are tried in order (:func:`proxy.transport.failover.failover`, which
  also says what each failure means); a mirror that fails at the transport level
  after N bytes is continued by the next one from byte N (``Range``), and
  the whole body is verified, so a failover is invisible to the reader;
* a mirror whose bytes do not verify (length or hash) is reported and the
  body starts over from the next mirror (the sink is told to restart);
* a body that stalls, or stays below a minimum rate, is abandoned like a
  transport failure (:class:`Pace`), so a dripping mirror holds nothing hostage;
* large batches are hashed in threads (one per digest) beside writing,
  while the next bytes are received: receiving, hashing and writing overlap.

The outcome is the verified digests, or ONE typed error: a
:class:`~proxy.protocol.errors.RepositoryError` (the upstream lied; the first
mirror's lie when several did), :class:`~proxy.protocol.errors.UpstreamUnreachable`
(no mirror answered usably), :class:`MissingUpstream` (every mirror said
404), or whatever the sink raised (our resources: the store's errors pass
through unchanged).  Nothing here decides HTTP statuses or writes audit
records: the caller's :class:`Observer` hears of each attempt.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from proxy.protocol.errors import NotFound, RepositoryError, UpstreamUnreachable
from proxy.protocol.hashing import StreamingVerifier, over_length
from proxy.protocol.model import VerifiedTarget
from proxy.transport.failover import Attempt, Exhausted, Outcome, failover
from proxy.transport.upstream import CHUNK_SIZE, DownloadError, DownloadLengthError, DownloadTimeout, Fetcher

# Batches at least this big are hashed in a thread (hashlib releases the GIL); smaller ones inline.
_THREAD_HASH_MIN = 256 * 1024
# Received bytes are handed to the hasher and the sink in batches of this much, or after this long.
# Measured (bench/coldab.py; bench/coldpath.py under load 5): 1 MiB batches with 1 MiB more buffered
# take a cold 212 MB file in ~100 hand-offs instead of ~400 with 256 KiB/512 KiB, for ~20 % less CPU;
# 2 MiB buffered was no faster and let 50 concurrent downloads at 4 MiB/s, starved of CPU, reach 264 MB.
# Not a power of two: writes of exactly 1 MiB at offsets that are multiples of 1 MiB made this machine's
# kernel (6.18, ext4) spend about twice the system time copying them into the page cache, a cold 287 MB
# file through edge -> gateway taking 0.96-1.25 s against 0.66-0.75 s (bench/results/gateway_cold.md).
_BATCH = 2**20 + 2**16
_BATCH_DELAY = 0.05


class _Slots:
    """Batch buffers, reused from one body to the next (at most ``keep`` idle).

    A body is read into memory already faulted in: a new 1 MiB buffer per batch cost its page faults
    (and their zeroing) every time.  A download holds two: the one being filled, and the one being hashed
    and written, which caps the bytes received but not yet hashed and written at one batch.  A body that
    announces less than a batch (a page, a small file) gets one buffer of its size instead, never pooled:
    zeroing a batch's worth of memory for a few kilobytes cost more than the copies saved."""

    def __init__(self, size: int, keep: int) -> None:
        self.size, self.keep = size, keep
        self._idle: list[bytearray] = []

    def take(self, size: int) -> bytearray:
        """A buffer of ``size`` bytes (a reused one if that is the pool's size)."""
        if size == self.size:
            try:
                return self._idle.pop()
            except IndexError:  # none idle (or another thread's event loop took the last one)
                pass
        return bytearray(size)

    def give(self, *slots: bytearray | None) -> None:
        for slot in slots:
            if slot is not None and len(slot) == self.size and len(self._idle) < self.keep:
                self._idle.append(slot)


_SLOTS = _Slots(_BATCH, keep=8)


class MissingUpstream(NotFound):
    """Every mirror answered 404 or 410 for a signed target."""

    reason = "missing-upstream"

    def __init__(self, target: str, urls: list[str]) -> None:
        super().__init__(f"{target}: no mirror has it ({len(urls)} asked)", target=target)


@dataclass(frozen=True)
class Want:
    """What the bytes must be: ``length`` is exact, or only a bound when ``exact`` is False."""

    path: str
    hashes: Mapping[str, str]
    length: int
    exact: bool = True
    role: str | None = None

    @classmethod
    def of(cls, target: VerifiedTarget) -> Want:
        return cls(target.path, target.hashes, target.length, True, target.role)


@dataclass(frozen=True)
class Pace:
    """How slow an upstream body may be before the mirror is abandoned.

    ``stall``: seconds without a single chunk.  ``min_rate``: bytes per
    second the body must average once ``grace`` seconds have passed (0: no
    minimum).
    """

    stall: float = 30.0
    min_rate: float = 16 * 1024
    grace: float = 5.0


class Sink(Protocol):
    """Where received (not yet verified) bytes go, in order.

    ``data`` is valid during the call only (its buffer receives the next bytes after): a sink that keeps
    it copies it."""

    async def write(self, data: bytes | bytearray | memoryview) -> None: ...

    async def restart(self) -> None:
        """Drop everything written: the body starts over."""


class Observer:
    """Hears each mirror attempt (for metrics) and each refusal (for audit); override what you need."""

    def attempt(self, mirror: int, outcome: str, nbytes: int, seconds: float) -> None:
        """One mirror tried: outcome ``ok``, ``error`` (transport) or ``refused`` (a lie)."""

    def refused(self, error: RepositoryError, url: str) -> None:
        """``url``'s bytes did not verify."""


class BytesSink:
    """A sink in memory, for pages and other small targets."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        self.parts.append(bytes(data))

    async def restart(self) -> None:
        self.parts.clear()

    def value(self) -> bytes:
        return b"".join(self.parts)


async def fetch_verified(fetcher: Fetcher, want: Want, urls: list[str], sink: Sink, *,
                         pace: Pace = Pace(), observer: Observer | None = None,
                         also: tuple[str, ...] = ()) -> dict[str, str]:
    """Stream ``want`` from ``urls`` into ``sink``; the verified digests (plus ``also``'s).

    Raises one typed outcome (see the module docstring).  A target with no
    hash we check is refused before any byte is fetched.
    """
    verifier = StreamingVerifier(want.path, want.hashes, want.length, exact=want.exact, role=want.role, also=also)
    return await _Fetch(fetcher, want, verifier, sink, pace, observer or Observer()).run(urls)


async def fetch_bytes(fetcher: Fetcher, want: Want, urls: list[str], *, pace: Pace = Pace(),
                      observer: Observer | None = None) -> bytes:
    """The verified bytes of a small target."""
    sink = BytesSink()
    await fetch_verified(fetcher, want, urls, sink, pace=pace, observer=observer)
    return sink.value()


class _Fetch:
    def __init__(self, fetcher: Fetcher, want: Want, verifier: StreamingVerifier, sink: Sink,
                 pace: Pace, observer: Observer) -> None:
        self.fetcher = fetcher
        self.want = want
        self.verifier = verifier
        self.sink = sink
        self.pace = pace
        self.observer = observer
        self.kept = 0  # bytes handed to the hasher and the sink
        self.urls: list[str] = []
        self.start = 0  # where the body stood, and when, as the current mirror was asked
        self.began = 0.0

    async def run(self, urls: list[str]) -> dict[str, str]:
        self.urls = urls
        try:
            return await failover(urls, self._attempt, after=self._after, resumed=lambda: self.verifier.received > 0)
        except Exhausted as e:
            tried = e.tried
        verdict = tried.verdict()
        if verdict is Outcome.LIE:
            raise tried.lies[0]
        if verdict is Outcome.MISSING:
            raise MissingUpstream(self.want.path, urls)
        raise UpstreamUnreachable(self.want.path, tried.failures)

    async def _attempt(self, _mirror: int, url: str) -> dict[str, str]:
        """One mirror's body, continuing from what earlier mirrors delivered; the verified digests."""
        self.start, self.began = self.verifier.received, time.monotonic()
        try:
            await self._one(url, self.start)
            return self.verifier.finish()
        except DownloadLengthError as e:
            raise over_length(self.want.path, self.want.length, e.actual, exact=self.want.exact, role=self.want.role) from e

    async def _after(self, attempt: Attempt) -> None:
        if attempt.outcome is Outcome.LIE:
            assert isinstance(attempt.error, RepositoryError)
            self.observer.refused(attempt.error, attempt.url)
        self.observer.attempt(attempt.mirror, attempt.outcome.label, self.verifier.received - self.start,
                              time.monotonic() - self.began)
        if attempt.outcome is not Outcome.LIE:
            return
        # A lie (by this mirror, or by one we continued from): start over from the next one.
        if self.kept and attempt.mirror + 1 < len(self.urls):
            # Only when a mirror follows: a last lie ends the download, and readers of the sink
            # hear of its refusal rather than of a restart.
            await self.sink.restart()
        self.verifier.restart()
        self.kept = 0

    async def _one(self, url: str, start: int) -> None:
        """Receive one mirror's body from ``start`` on; hashing and writing trail one batch behind.

        The body is read into one batch buffer while the other is hashed and written."""
        pending: asyncio.Future[None] | None = None
        slot: bytearray | None = None
        spare: bytearray | None = None
        filled = 0
        try:
            async with self.fetcher.stream(url, self.want.length, start) if start else \
                    self.fetcher.stream(url, self.want.length) as body:
                # One byte more than announced: the read that finds the end needs room, not a new buffer.
                size = _BATCH if body.content_length is None else min(_BATCH, body.content_length + 1)
                slot = _SLOTS.take(size)
                began, got = time.monotonic(), 0
                handed = began
                while True:
                    try:
                        async with asyncio.timeout(self._wait(time.monotonic() - began, got)):
                            n = await body.readinto(memoryview(slot)[filled:])
                    except TimeoutError:
                        raise DownloadTimeout(url, f"too slow: {got} bytes in {time.monotonic() - began:.1f}s "
                                                   f"(stall {self.pace.stall:g}s, minimum {self.pace.min_rate:g} B/s)") from None
                    if not n:
                        break
                    got += n
                    filled += n
                    self.verifier.admit(n)
                    if pending is not None and (pending.done() or filled == len(slot)):
                        (await _settled(pending)).result()
                        pending = None
                    # Hand over batches, not reads (fewer thread hops), but never sit on bytes long; a full
                    # buffer is always handed over (the next read needs room).
                    now = time.monotonic()
                    if pending is None and (filled == len(slot) or now - handed >= _BATCH_DELAY):
                        pending = asyncio.ensure_future(self._keep(memoryview(slot)[:filled]))
                        slot, spare, filled, handed = spare or _SLOTS.take(size), slot, 0, now
        except DownloadError:
            # What arrived before the failure is good for the next mirror to continue from.
            await self._drain(pending, slot, filled)
            _SLOTS.give(slot, spare)
            raise
        except BaseException:
            # Leaving early (a refusal, cancellation): the keep's threads end before anyone restarts or closes
            # the sink; its error is retrieved, the one being raised is the one that matters.
            if pending is not None and not (await _settled(pending)).cancelled():
                pending.exception()
            raise
        await self._drain(pending, slot, filled)
        _SLOTS.give(slot, spare)

    async def _drain(self, pending: asyncio.Future[None] | None, slot: bytearray | None, filled: int) -> None:
        """The keep under way ended, then the ``filled`` bytes of ``slot`` kept (each to its end, even if
        cancelled meanwhile); raises a keep's error."""
        if pending is not None:
            (await _settled(pending)).result()
        if filled and slot is not None:
            (await _settled(asyncio.ensure_future(self._keep(memoryview(slot)[:filled])))).result()

    def _wait(self, elapsed: float, got: int) -> float:
        """Seconds the next chunk may take: the stall limit, or less if the rate would fall too low."""
        if not self.pace.min_rate:
            return self.pace.stall
        on_the_line = self.pace.grace + (got + CHUNK_SIZE) / self.pace.min_rate - elapsed
        return max(0.0, min(self.pace.stall, on_the_line))

    async def _keep(self, data: memoryview) -> None:
        self.kept += len(data)
        if len(data) >= _THREAD_HASH_MIN:
            # One thread per digest (sha512 is the slow one), beside the write: on several
            # cores the batch costs the slowest of them, not their sum.  Every part ends before an error
            # is raised: a thread still reading the buffer must not outlive the keep.
            for outcome in await asyncio.gather(
                    *(asyncio.to_thread(update, data) for update in self.verifier.updaters()),
                    self.sink.write(data), return_exceptions=True):
                if isinstance(outcome, BaseException):
                    raise outcome
        else:
            self.verifier.hash(data)
            await self.sink.write(data)


async def _settled(task: asyncio.Future[None]) -> asyncio.Future[None]:
    """``task`` once it has ended, waiting through a cancellation (raised after): a keep's threads read the
    fetch's buffer and write to its sink's descriptor, which its owner closes once the fetch ends."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task


class FileSink:
    """A sink into an open file descriptor, written from a thread; a restart truncates it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.size = 0

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        await asyncio.to_thread(pwrite_all, self.fd, data, self.size)
        self.size += len(data)

    async def restart(self) -> None:
        await asyncio.to_thread(os.ftruncate, self.fd, 0)
        self.size = 0


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (blocking: run it in a thread)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
