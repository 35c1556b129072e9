"""Upstream faults through the real proxy: each one a clear, bounded error, a fallback, nothing cached.

A fault-injecting upstream (:mod:`tests.support.faults`) serves a real
signed tree and misbehaves on demand.  Two ``tufproxy serve`` processes sit
in front of it: one with the faulty mirror alone, one with the faulty
mirror first and a good one second.  For every fault, on a distribution
file and on ``timestamp.json``: the lone-mirror proxy answers 502 with a
reason within the configured timeouts and caches nothing, while a cached
file keeps being served; the two-mirror proxy serves the verified bytes
from the good mirror.  Each test prints its timings.
"""

from __future__ import annotations

import asyncio
import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from proxy.repository import Repository
from tests.conftest import make_sample_dists
from tests.support.faults import Fault, FaultyUpstream, get, sized_wheel
from tests.support.net import free_port
from tests.support.poll import poll
from tests.support.proxyproc import ProxyProcess
from tests.support.tree import assert_cache_clean

CONNECT_TIMEOUT = 2.0
READ_TIMEOUT = 2.0
TIMEOUT_FLAGS = ("--connect-timeout", str(CONNECT_TIMEOUT), "--read-timeout", str(READ_TIMEOUT))
# One mirror's worst case is connect + headers (connect + read) or one stalled chunk (read).
BOUND = CONNECT_TIMEOUT + READ_TIMEOUT + 1.0
HOT = "/packages/base/base-2.0-py3-none-any.whl"
# The slow faults: a cached file must be served while they are still going on.
SLOW = {Fault.DRIP, Fault.DRIP_HEADERS, Fault.STALL_HEADERS}
# What the lone-mirror proxy names as the reason; everything else is "upstream-unreachable".
LIES = {
    Fault.WRONG_LENGTH: "length-mismatch",
    Fault.ENDLESS: "length-mismatch",
    Fault.OVERSIZED: "length-mismatch",
    Fault.GARBAGE: "hash-mismatch",
}
FILE_FAULTS = [(f, 503) for f in Fault if f is not Fault.STATUS] + [(Fault.STATUS, 500), (Fault.STATUS, 503), (Fault.STATUS, 404)]


@dataclass
class World:
    repo: Repository
    root: Path
    bad: FaultyUpstream
    good: FaultyUpstream
    foreign: FaultyUpstream
    cold: dict[str, Path]  # fault id -> a wheel nobody has asked for yet


def fault_id(fault: Fault, status: int) -> str:
    return f"{fault.value}-{status}" if fault is Fault.STATUS else fault.value


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("faults")
    repo = Repository.init(tmp / "repo", bins=16)
    dists = make_sample_dists(tmp / "dists")
    cold = {fault_id(f, s): sized_wheel(tmp / "dists", f"cold-{fault_id(f, s)}", "1.0", 300_000) for f, s in FILE_FAULTS}
    repo.add([*dists, *cold.values()])
    root = tmp / "root.json"
    root.write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
    with (
        FaultyUpstream(repo.public_dir) as bad,
        FaultyUpstream(repo.public_dir) as good,
        FaultyUpstream(repo.public_dir) as foreign,
    ):
        yield World(repo, root, bad, good, foreign, cold)


def start_proxies(world: World, tmp: Path, *extra: str) -> tuple[ProxyProcess, ProxyProcess]:
    """The lone-faulty-mirror proxy and the faulty-then-good one, started side by side."""
    single = ProxyProcess(
        tmp / "single" / "cache", "--upstream", world.bad.url, "--root", str(world.root), *TIMEOUT_FLAGS, *extra
    )
    dual = ProxyProcess(
        tmp / "dual" / "cache",
        "--upstream",
        world.bad.url,
        "--upstream",
        world.good.url,
        "--root",
        str(world.root),
        *TIMEOUT_FLAGS,
        *extra,
    )
    for p in (single, dual):
        p.cache_dir.parent.mkdir(parents=True)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(ProxyProcess.start, (single, dual)))
    return single, dual


@pytest.fixture(scope="module")
def proxies(world: World, tmp_path_factory: pytest.TempPathFactory):
    single, dual = start_proxies(world, tmp_path_factory.mktemp("file-faults"))
    try:
        yield single, dual
    finally:
        single.stop()
        dual.stop()


def wheel_path(wheel: Path) -> str:
    project = wheel.name.split("-")[0].replace("_", "-")
    return f"/packages/{project}/{wheel.name}"


def at(proxy: ProxyProcess, path: str) -> str:
    return f"http://127.0.0.1:{proxy.port}{path}"


def blob_names(cache_dir: Path) -> set[str]:
    return {p.name for p in (cache_dir / "blobs").rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("fault,status", FILE_FAULTS, ids=[fault_id(f, s) for f, s in FILE_FAULTS])
async def test_file_fault(world: World, proxies: tuple[ProxyProcess, ProxyProcess], fault: Fault, status: int) -> None:
    single, dual = proxies
    wheel = world.cold[fault_id(fault, status)]
    path, data = wheel_path(wheel), wheel.read_bytes()
    hot = (world.repo.public_dir / HOT.lstrip("/")).read_bytes()
    project = path.split("/")[2]
    world.bad.inject(rf"/packages/{project}/.*", fault, status=status, location=f"{world.foreign.url}{path}")
    try:
        async with aiohttp.ClientSession() as s:
            assert (await get(s, at(single, HOT))).status == 200  # cached before the fault
            cold_task = asyncio.create_task(get(s, at(single, path)))
            fallback_task = asyncio.create_task(get(s, at(dual, path)))
            hot_got = await get(s, at(single, HOT))
            hot_done_first = not cold_task.done()
            cold_got, fallback = await asyncio.gather(cold_task, fallback_task)
    finally:
        world.bad.clear()
    print(
        f"\n[fault {fault_id(fault, status)}] lone mirror: {cold_got.status} "
        f"{cold_got.headers.get('x-tufproxy-reason')} in {cold_got.seconds:.2f}s; cached file in "
        f"{hot_got.seconds * 1000:.0f} ms; faulty+good: {fallback.status} in {fallback.seconds:.2f}s"
    )
    if (fault, status) == (Fault.STATUS, 404):
        # A signed file no mirror has is "not found" (the one fetch-and-verify's MissingUpstream).
        assert (cold_got.status, cold_got.headers["x-tufproxy-reason"]) == (404, "missing-upstream"), cold_got
    else:
        assert cold_got.status == 502, cold_got
        assert cold_got.headers["x-tufproxy-reason"] == LIES.get(fault, "upstream-unreachable")
    assert cold_got.seconds < BOUND
    assert hot_got.status == 200 and hot_got.body == hot and hot_got.seconds < 1.0
    if fault in SLOW:
        assert hot_done_first, "a cached file waited for a faulty download"
    assert fallback.status == 200 and fallback.body == data and fallback.seconds < BOUND
    assert world.good.count(rf"/packages/{project}/.*") == 1
    assert hashlib.sha256(data).hexdigest() not in blob_names(single.cache_dir)
    assert_cache_clean(single.cache_dir, world.repo)
    assert_cache_clean(dual.cache_dir, world.repo)
    assert world.foreign.requests == []


# The transport is the same code for metadata as for files (matrix above): here, the faults whose
# handling differs per role (a lie refuses, a 404 is not "missing" for a timestamp) and one stall.
META_FAULTS = [
    (f, 503)
    for f in (
        Fault.TRUNCATE,
        Fault.STALL_HEADERS,
        Fault.WRONG_LENGTH,
        Fault.REDIRECT_FOREIGN,
        Fault.ENDLESS,
        Fault.OVERSIZED,
        Fault.GARBAGE,
    )
] + [(Fault.STATUS, 503), (Fault.STATUS, 404)]
META_LIES = {Fault.ENDLESS: "length-mismatch", Fault.OVERSIZED: "length-mismatch", Fault.GARBAGE: "bad-metadata"}


@pytest.mark.slow
@pytest.mark.parametrize("fault,status", META_FAULTS, ids=[fault_id(f, s) for f, s in META_FAULTS])
async def test_timestamp_fault_on_a_cold_start(world: World, tmp_path: Path, fault: Fault, status: int) -> None:
    world.bad.inject(r"/metadata/timestamp\.json", fault, status=status, location=f"{world.foreign.url}metadata/timestamp.json")
    try:
        single, dual = start_proxies(world, tmp_path)
        try:
            async with aiohttp.ClientSession() as s:
                refused, served = await asyncio.gather(get(s, single.url), get(s, dual.url))
        finally:
            single.stop()
            dual.stop()
    finally:
        world.bad.clear()
    print(
        f"\n[timestamp {fault_id(fault, status)}] lone mirror: {refused.status} "
        f"{refused.headers.get('x-tufproxy-reason')} in {refused.seconds:.2f}s; faulty+good: "
        f"{served.status} in {served.seconds:.2f}s"
    )
    # A cold-started worker may still be in its own start-up refresh when the request reaches it.
    assert refused.status == 502 and refused.seconds < 2 * BOUND
    assert refused.headers["x-tufproxy-reason"] == META_LIES.get(fault, "upstream-unreachable")
    assert b"timestamp" in refused.body
    assert served.status == 200 and b"base" in served.body
    assert not (single.cache_dir / "metadata" / "timestamp.json").exists()
    assert world.foreign.requests == []


@pytest.mark.slow
async def test_connection_refused(world: World, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/"
    lone = ProxyProcess(tmp_path / "cache", "--upstream", dead, "--root", str(world.root), *TIMEOUT_FLAGS)
    both = ProxyProcess(
        tmp_path / "cache2", "--upstream", dead, "--upstream", world.good.url, "--root", str(world.root), *TIMEOUT_FLAGS
    )
    with lone, both:
        async with aiohttp.ClientSession() as s:
            refused, served = await asyncio.gather(get(s, at(lone, HOT)), get(s, at(both, HOT)))
    print(
        f"\n[connection refused] lone mirror: {refused.status} in {refused.seconds:.2f}s; "
        f"dead+good: {served.status} in {served.seconds:.2f}s"
    )
    assert refused.status == 502 and refused.seconds < BOUND
    assert refused.headers["x-tufproxy-reason"] == "upstream-unreachable"
    assert served.status == 200 and served.body == (world.repo.public_dir / HOT.lstrip("/")).read_bytes()


@pytest.mark.slow
async def test_metadata_outage_or_a_lie_keeps_serving_the_verified_state(world: World, tmp_path: Path) -> None:
    """Unreachable upstream, or one answering garbage for timestamp.json: the update is aborted and the
    last verified (still valid) state keeps serving; the lie is counted and audited (issue 27, item 6)."""
    hot = (world.repo.public_dir / HOT.lstrip("/")).read_bytes()
    audit = tmp_path / "audit.log"
    with ProxyProcess(
        tmp_path / "cache", "--upstream", world.bad.url, "--root", str(world.root), "--refresh-interval", "0.5",
        "--audit-log", str(audit), *TIMEOUT_FLAGS
    ) as proxy:
        async with aiohttp.ClientSession() as s:
            assert (await get(s, at(proxy, HOT))).body == hot
            try:
                world.bad.inject(r"/metadata/.*", Fault.STATUS, status=503)
                outage = [await get(s, at(proxy, HOT)) for _ in range(5)]
                world.bad.clear()
                world.bad.inject(r"/metadata/timestamp\.json", Fault.GARBAGE)
                counted = await poll(lambda: get(s, f"{proxy.base}metrics"), "the lie counted", timeout=15,
                                     interval=0.1, done=lambda g: b'failures_total{reason="bad-metadata"}' in g.body)
                lie = [await get(s, at(proxy, HOT)) for _ in range(5)]
            finally:
                world.bad.clear()
    assert all(g.status == 200 and g.body == hot for g in outage)
    assert world.bad.count(r"/metadata/timestamp\.json") >= 2
    assert b'tufproxy_verification_failures_total{reason="bad-metadata"}' in counted.body
    assert all(g.status == 200 and g.body == hot for g in lie)
    assert '"reason": "bad-metadata"' in audit.read_text()
