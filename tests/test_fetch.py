"""The one fetch-and-verify (proxy.trust.fetch) against real HTTP mirrors on 127.0.0.1 that misbehave."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from proxy.protocol.errors import HashMismatch, LengthMismatch, RepositoryError, UpstreamUnreachable
from proxy.protocol.hashing import UnsupportedHashes
from proxy.transport import upstream
from proxy.transport.upstream import AiohttpFetcher
from proxy.trust.fetch import BytesSink, MissingUpstream, Observer, Pace, Want, fetch_verified
from tests.support.faults import Fault, FaultyUpstream

DATA = os.urandom(3 * 2**20 + 123)
PATH = "packages/p/p-1.0-py3-none-any.whl"
WANT = Want(PATH, {"sha256": hashlib.sha256(DATA).hexdigest(),
                   "blake2b-256": hashlib.blake2b(DATA, digest_size=32).hexdigest()}, len(DATA))


class Seen(Observer):
    """An observer that keeps what it heard."""

    def __init__(self) -> None:
        self.attempts: list[tuple[int, str, int]] = []
        self.refusals: list[tuple[str, str]] = []

    def attempt(self, mirror: int, outcome: str, nbytes: int, seconds: float) -> None:
        self.attempts.append((mirror, outcome, nbytes))

    def refused(self, error: RepositoryError, url: str) -> None:
        self.refusals.append((error.reason, url))


def _tree(root: Path, data: bytes) -> Path:
    (root / PATH).parent.mkdir(parents=True)
    (root / PATH).write_bytes(data)
    return root


@pytest.fixture
def mirrors(tmp_path: Path) -> Iterator[list[FaultyUpstream]]:
    honest = _tree(tmp_path / "honest", DATA)
    tampered = bytearray(DATA)
    tampered[-1] ^= 1
    liar = _tree(tmp_path / "liar", bytes(tampered))
    ups = [FaultyUpstream(honest).start(), FaultyUpstream(honest).start(), FaultyUpstream(liar).start(),
           FaultyUpstream(honest, ranges=False).start()]
    yield ups
    for u in ups:
        u.stop()


@pytest.fixture(params=["aiohttp-reads", "received-into-buffers"])
async def fetcher(request, monkeypatch) -> AsyncIterator[AiohttpFetcher]:
    """Every test twice: bodies read through aiohttp, and received straight into the fetch's buffers."""
    if request.param == "received-into-buffers":
        monkeypatch.setattr(upstream, "RECEIVE_MIN", 2**20)  # DATA is 3 MiB
    f = AiohttpFetcher(connect_timeout=2, read_timeout=2, total_timeout=None)
    yield f
    await f.close()


def urls(*ups: FaultyUpstream) -> list[str]:
    return [u.url + PATH for u in ups]


async def test_honest_mirror_gives_the_verified_bytes_and_sha256(mirrors, fetcher) -> None:
    sink = BytesSink()
    digests = await fetch_verified(fetcher, WANT, urls(mirrors[0]), sink, also=("sha256",))
    assert sink.value() == DATA and digests["sha256"] == WANT.hashes["sha256"]


async def test_md5_only_target_is_refused_before_any_fetch(mirrors, fetcher) -> None:
    want = Want(PATH, {"md5": hashlib.md5(DATA).hexdigest()}, len(DATA))
    with pytest.raises(UnsupportedHashes):
        await fetch_verified(fetcher, want, urls(mirrors[0]), BytesSink())
    assert mirrors[0].count(".*") == 0


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
async def test_mirror_killed_mid_body_is_continued_by_the_next(mirrors, fetcher, ranges: bool) -> None:
    mirrors[0].inject(f"/{PATH}", Fault.RESET)
    second = mirrors[1] if ranges else mirrors[3]
    sink, seen = BytesSink(), Seen()
    await fetch_verified(fetcher, WANT, urls(mirrors[0], second), sink, observer=seen)
    assert sink.value() == DATA
    (m0, o0, n0), (m1, o1, n1) = seen.attempts
    assert (m0, o0, m1, o1) == (0, "error", 1, "ok")
    assert n0 > 0 and n0 + n1 == len(DATA)  # the second mirror sent only the rest


async def test_tampered_second_mirror_after_a_failover_is_refused(mirrors, fetcher) -> None:
    mirrors[0].inject(f"/{PATH}", Fault.RESET)
    sink, seen = BytesSink(), Seen()
    with pytest.raises(HashMismatch):
        await fetch_verified(fetcher, WANT, urls(mirrors[0], mirrors[2]), sink, observer=seen)
    # No mirror follows, so the body does not start over: the sink keeps what it had for its owner to
    # drop on the error, and a reader following it hears of the refusal, not of a restart.
    assert len(sink.value()) > 0 and sink.value() != DATA
    assert seen.refusals == [("hash-mismatch", urls(mirrors[2])[0])]


async def test_a_lying_mirror_is_reported_and_the_next_starts_over(mirrors, fetcher) -> None:
    sink, seen = BytesSink(), Seen()
    await fetch_verified(fetcher, WANT, urls(mirrors[2], mirrors[0]), sink, observer=seen)
    assert sink.value() == DATA
    assert seen.refusals == [("hash-mismatch", urls(mirrors[2])[0])]
    assert [a[:2] for a in seen.attempts] == [(0, "refused"), (1, "ok")]


async def test_an_endless_body_is_refused_at_the_bound_with_one_actual(mirrors, fetcher) -> None:
    mirrors[0].inject(f"/{PATH}", Fault.ENDLESS)
    sink = BytesSink()
    with pytest.raises(LengthMismatch) as info:
        await fetch_verified(fetcher, WANT, urls(mirrors[0]), sink)
    assert info.value.expected == len(DATA) and info.value.actual > len(DATA)
    mirrors[0].clear()
    mirrors[0].inject(f"/{PATH}", Fault.OVERSIZED)  # announced too long: refused on the header
    with pytest.raises(LengthMismatch) as info:
        await fetch_verified(fetcher, WANT, urls(mirrors[0]), sink)
    assert info.value.actual == 2**40


async def test_every_mirror_404_is_not_found_and_a_mix_is_unreachable(mirrors, fetcher) -> None:
    for m in mirrors[:2]:
        m.inject(f"/{PATH}", Fault.STATUS, status=404)
    with pytest.raises(MissingUpstream):
        await fetch_verified(fetcher, WANT, urls(*mirrors[:2]), BytesSink())
    mirrors[1].clear()
    mirrors[1].inject(f"/{PATH}", Fault.STATUS, status=503)
    with pytest.raises(UpstreamUnreachable) as info:
        await fetch_verified(fetcher, WANT, urls(*mirrors[:2]), BytesSink())
    assert info.value.target == PATH and info.value.role is None


@pytest.mark.slow
async def test_a_dripping_mirror_is_abandoned_for_the_next_within_seconds(mirrors, fetcher) -> None:
    # A byte per 5 ms resets any per-chunk timeout; the rate over the body is what catches it.
    mirrors[0].inject(f"/{PATH}", Fault.DRIP, interval=0.005)
    sink, seen = BytesSink(), Seen()
    start = time.monotonic()
    await fetch_verified(fetcher, WANT, urls(mirrors[0], mirrors[1]), sink, observer=seen,
                         pace=Pace(stall=30, min_rate=256 * 1024, grace=1.0))
    took = time.monotonic() - start
    assert sink.value() == DATA
    assert [a[:2] for a in seen.attempts] == [(0, "error"), (1, "ok")]
    assert took < 5, took


async def test_a_cancelled_fetch_ends_only_once_its_sinks_write_has(mirrors, fetcher) -> None:
    # A write runs in a thread that a cancellation cannot stop: the fetch must not end (and let its owner close
    # the descriptor that thread writes to) before it has.
    started, release = threading.Event(), threading.Event()
    running: list[int] = []

    class SlowSink(BytesSink):
        async def write(self, data: bytes | bytearray | memoryview) -> None:
            def blocking() -> None:
                running.append(1)
                started.set()
                release.wait(30)
                running.pop()

            await asyncio.to_thread(blocking)

    task = asyncio.ensure_future(fetch_verified(fetcher, WANT, urls(mirrors[0]), SlowSink()))
    assert await asyncio.to_thread(started.wait, 30)
    task.cancel()
    for _ in range(50):  # as far as the cancellation can go without the thread
        await asyncio.sleep(0)
    assert not task.done() and running
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not running
