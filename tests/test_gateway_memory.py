"""The gateway's memory stays bounded under a flood of junk and absent project names (issue 27, item 5).

A remote, unauthenticated client sends 50,000 requests naming projects
that are junk (6,000 characters, not PEP 503 names) or valid but listed by
no index.  Nothing about a name is recorded before it is validated, and
what is recorded (recent use, absent names) is bounded with eviction; the
sizes are metrics.  The gateway is a real subprocess, the index a real
HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import random
import string
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from proxy.repository.sample import build_wheel
from tests.support.gatewayproc import GatewayProcess, gateway_init, metric
from tests.support.testindex import TestIndex

JUNK = 42_000
ABSENT = 8_000
# Growth allowed over the warmed-up gateway: far below what 50,000 recorded names cost (today's main grows
# by ~250 MiB on the junk alone), well above what allocator noise and a bounded absent-name list can.
MAX_GROWTH_MIB = 24


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    index = TestIndex()
    index.add(build_wheel(tmp_path / "dists", "real", "1.0"))
    gateway_init(tmp_path / "gw")
    with index, GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--batch-window", "0.05") as gw:
        yield gw


async def flood(base: str, paths: list[tuple[str, str]], concurrency: int = 32) -> dict[int, int]:
    statuses: dict[int, int] = {}
    queue = iter(paths)

    async def worker(session: aiohttp.ClientSession) -> None:
        for method, path in queue:
            async with session.request(method, base + path, allow_redirects=False) as r:
                await r.read()
                statuses[r.status] = statuses.get(r.status, 0) + 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return statuses


def junk_name(rng: random.Random) -> str:
    # Not a PEP 503 name ('~' and '@' are not name characters), long, and different every time.
    return "".join(rng.choices(string.ascii_letters + "~@", k=6000))


@pytest.mark.slow
def test_junk_and_absent_names_do_not_grow_memory(gateway: GatewayProcess) -> None:
    rng = random.Random(27)
    assert gateway.publish("real")[0] == 200
    # Warm up: the code paths, the allocator, the connection handling.
    asyncio.run(flood(gateway.base, [("GET", f"simple/{junk_name(rng)}/x") for _ in range(500)]
                      + [("POST", f"_tufproxy/publish/warm-{i}") for i in range(200)]))
    assert gateway.proc is not None
    before = rss_mib(gateway.proc.pid)
    paths = [("GET", f"simple/{junk_name(rng)}/x") for _ in range(JUNK // 2)]
    paths += [("GET", f"simple/{junk_name(rng)}/") for _ in range(JUNK // 2)]
    paths += [("POST", f"_tufproxy/publish/absent-{i}-{rng.randrange(10**9)}") for i in range(ABSENT // 2)]
    paths += [("GET", f"simple/absent-{i}-{rng.randrange(10**9)}/x") for i in range(ABSENT // 2)]
    rng.shuffle(paths)
    statuses = asyncio.run(flood(gateway.base, paths))
    assert sum(statuses.values()) == JUNK + ABSENT
    assert set(statuses) <= {404}, statuses
    after = rss_mib(gateway.proc.pid)
    print(f"gateway RSS {before:.1f} -> {after:.1f} MiB over {JUNK + ABSENT} requests")
    assert after - before < MAX_GROWTH_MIB, f"RSS grew from {before:.1f} to {after:.1f} MiB"
    # What is remembered is bounded and visible: absent names are a bounded list; junk is never recorded.
    used = metric(gateway.base, 'tufproxy_gateway_usage_entries{structure="used"}')
    absent = metric(gateway.base, 'tufproxy_gateway_usage_entries{structure="absent"}')
    assert used <= 1, used  # only the published project
    assert 0 < absent <= 10_000
    assert gateway.publish("real")[0] == 200  # still serving
