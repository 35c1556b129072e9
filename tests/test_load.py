"""Load through the real proxy: a thundering herd, a mixed workload, and hot hits during a stalled refresh.

Every test prints its figures (run with ``-s``).  Bytes are checked
against the signed tree, response by response.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from proxy.protocol import index
from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from tests.conftest import make_sample_dists
from tests.support.faults import FaultyUpstream, get, sized_wheel
from tests.support.proxyproc import ProxyProcess
from tests.support.tree import all_targets, assert_cache_clean

BIG = 50 * 2**20
HERD = 200
MIXED_REQUESTS = 2_000
MIXED_CONCURRENCY = 64
PROJECTS = 30
READ_TIMEOUT = 2.0
JSON = "application/vnd.pypi.simple.v1+json"


@dataclass
class World:
    repo: Repository
    root: Path
    upstream: FaultyUpstream
    big: Path
    wheels: list[Path]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("load")
    repo = Repository.init(tmp / "repo", bins=16)
    big = sized_wheel(tmp / "dists", "big", "1.0", BIG)
    rng = random.Random(7)
    wheels = [build_wheel(tmp / "dists", f"proj{i}", v, payload=rng.randbytes(rng.randrange(1_000, 60_000)))
              for i in range(PROJECTS) for v in ("1.0", "2.0")]
    repo.add([*make_sample_dists(tmp / "dists"), big, *wheels])
    root = tmp / "root.json"
    root.write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
    with FaultyUpstream(repo.public_dir) as upstream:
        yield World(repo, root, upstream, big, wheels)


@pytest.fixture
def proxy(world: World, tmp_path: Path):
    with ProxyProcess(tmp_path / "cache", "--upstream", world.upstream.url, "--root", str(world.root),
                      "--read-timeout", str(READ_TIMEOUT), "--connect-timeout", "2", "--refresh-interval", "1") as p:
        yield p


def file_path(wheel: Path) -> str:
    return f"/packages/{wheel.name.split('-')[0].replace('_', '-')}/{wheel.name}"


def upstream_fetches(world: World, wheel: Path) -> int:
    return world.upstream.count(rf"/packages/[^/]+/[0-9a-f]+\.{wheel.name}")


async def sha256_of(session: aiohttp.ClientSession, url: str) -> tuple[int, str, int]:
    async with session.get(url) as r:
        h, n = hashlib.sha256(), 0
        async for chunk in r.content.iter_chunked(2**20):
            h.update(chunk)
            n += len(chunk)
        return r.status, h.hexdigest(), n


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


@pytest.mark.slow
async def test_herd_of_200_on_one_cold_50mb_file_is_one_upstream_fetch(world: World, proxy: ProxyProcess) -> None:
    url = f"http://127.0.0.1:{proxy.port}{file_path(world.big)}"
    expected = hashlib.sha256(world.big.read_bytes()).hexdigest()
    start = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=240)) as s:
        results = await asyncio.gather(*(sha256_of(s, url) for _ in range(HERD)))
        metrics = (await get(s, f"http://127.0.0.1:{proxy.port}/metrics")).body.decode()
    elapsed = time.monotonic() - start
    joins = next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("tufproxy_singleflight_joins"))
    print(f"\n[herd] {HERD} clients x {BIG >> 20} MiB cold: {upstream_fetches(world, world.big)} upstream fetch, "
          f"{int(joins)} joined the in-flight download, {elapsed:.1f}s, "
          f"{HERD * BIG / elapsed / 2**20:.0f} MiB/s served")
    assert results == [(200, expected, world.big.stat().st_size)] * HERD
    assert upstream_fetches(world, world.big) == 1
    assert_cache_clean(proxy.cache_dir, world.repo)


@pytest.mark.slow
async def test_mixed_load_hot_and_cold_pages_and_files(world: World, proxy: ProxyProcess) -> None:
    signed = all_targets(world.repo)
    files = {file_path(w): w.read_bytes() for w in world.wheels}
    projects = sorted({p.split("/")[2] for p in files})
    requests = ([("file", p, None) for p in files]
                + [("page", f"/simple/{p}/", accept) for p in projects for accept in (JSON, "text/html")]
                + [("page", "/simple/", JSON)])
    rng = random.Random(42)
    plan = [rng.choice(requests) for _ in range(MIXED_REQUESTS)]
    seen: dict[tuple[str, str | None], bytes] = {}
    latencies: dict[bool, list[float]] = {True: [], False: []}  # cold? -> seconds
    wrong: list[str] = []
    limit = asyncio.Semaphore(MIXED_CONCURRENCY)

    def check_page(path: str, accept: str, body: bytes) -> bool:
        if path == "/simple/":
            return {"proj0", "base"} <= {p["name"] for p in json.loads(body)["projects"]}
        project = path.split("/")[2]
        page = (index.parse_project_json(body, project) if accept == JSON else index.parse_project_html(body, project))
        return all(signed[f"packages/{project}/{f.filename}"]["hashes"]["sha256"] == f.hashes["sha256"]
                   for f in page.files) and len(page.files) == 2

    async def one(s: aiohttp.ClientSession, kind: str, path: str, accept: str | None) -> None:
        async with limit:
            cold = (path, accept) not in seen
            seen.setdefault((path, accept), b"")
            got = await get(s, f"http://127.0.0.1:{proxy.port}{path}", **({"Accept": accept} if accept else {}))
        latencies[cold].append(got.seconds)
        ok = got.status == 200 and (got.body == files[path] if kind == "file" else check_page(path, accept, got.body))
        if seen[(path, accept)] and seen[(path, accept)] != got.body:
            ok = False
        seen[(path, accept)] = got.body
        if not ok:
            wrong.append(f"{path} {accept}: {got.status} {got.body[:100]!r}")

    start = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(*(one(s, *r) for r in plan))
    elapsed = time.monotonic() - start
    all_lat = latencies[True] + latencies[False]
    print(f"\n[mixed] {len(plan)} requests ({len(latencies[True])} cold, {len(latencies[False])} hot), "
          f"{MIXED_CONCURRENCY} concurrent: {len(plan) / elapsed:.0f} req/s, p50 {statistics.median(all_lat) * 1000:.1f} ms, "
          f"p99 {percentile(all_lat, 0.99) * 1000:.1f} ms, hot p99 {percentile(latencies[False], 0.99) * 1000:.1f} ms, "
          f"{len(wrong)} wrong or failed")
    assert wrong == []
    assert all(upstream_fetches(world, Path(p)) == 1 for p in files if (p, None) in seen)
    assert_cache_clean(proxy.cache_dir, world.repo)


@pytest.mark.slow
async def test_hot_hits_during_a_stalled_metadata_refresh(world: World, proxy: ProxyProcess) -> None:
    """A refresh stuck on timestamp.json does not hold hot hits up: the live state answers (stale-while-refresh)."""
    hot = world.wheels[0]
    url = f"http://127.0.0.1:{proxy.port}{file_path(hot)}"
    # Well under the read timeout a stalled refresh could otherwise cost; generous for a loaded 2-core box.
    bound = 0.5
    async with aiohttp.ClientSession() as s:
        assert (await get(s, url)).body == hot.read_bytes()
        before = world.upstream.count(r"/metadata/timestamp\.json")
        hold = world.upstream.hold(r"/metadata/timestamp\.json")
        try:
            # The background refresher asks for timestamp.json within the refresh interval.
            assert await asyncio.to_thread(hold.arrived.wait, 10), "no refresh started"
            window_end = time.monotonic() + 2 * READ_TIMEOUT + 1
            during: list[float] = []
            while time.monotonic() < window_end:
                got = await get(s, url)
                assert got.status == 200 and got.body == hot.read_bytes()
                during.append(got.seconds)
        finally:
            hold.release()
    stalled = world.upstream.count(r"/metadata/timestamp\.json") - before
    print(f"\n[stale-while-refresh] {len(during)} hot hits over {2 * READ_TIMEOUT + 1:.0f}s with timestamp.json stalled "
          f"({stalled} stalled refresh attempts): p50 {statistics.median(during) * 1000:.1f} ms, "
          f"max {max(during):.2f}s (bound: {bound}s; read timeout {READ_TIMEOUT:.0f}s)")
    assert max(during) < bound
