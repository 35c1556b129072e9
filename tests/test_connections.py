"""Slow and idle clients, and busy mirrors, cannot take the proxy's capacity away.

A real proxy process: idle connections and clients dribbling a request
head are closed after ``--idle-timeout`` and ``--header-timeout`` while normal requests keep
their latency, connections beyond ``--max-connections`` make room or are closed at
once; and cold downloads that fill every per-mirror slot
(``--mirror-downloads``) do not delay a metadata refresh, which has a
connection pool of its own.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from pathlib import Path

import aiohttp
import pytest

from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from tests.conftest import make_sample_dists
from tests.support.faults import Fault, FaultyUpstream, get
from tests.support.poll import poll
from tests.support.proxyproc import ProxyProcess


@pytest.fixture
def repo(tmp_path: Path) -> Repository:
    repo = Repository.init(tmp_path / "repo", bins=16)
    repo.add(make_sample_dists(tmp_path / "dists"))
    (tmp_path / "root.json").write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
    return repo


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the proxy closed ``sock`` (what it said before, a 408 for a head cut short, is read and dropped)."""
    try:
        while sock.recv(65536):
            pass
        return True
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


@pytest.mark.slow
async def test_idle_and_slow_clients_are_closed_while_requests_keep_their_latency(tmp_path: Path, repo: Repository) -> None:
    with FaultyUpstream(repo.public_dir) as up, \
            ProxyProcess(tmp_path / "cache", "--upstream", up.url, "--root", str(tmp_path / "root.json"),
                         "--workers", "1", "--idle-timeout", "1", "--header-timeout", "1", "--max-connections", "60") as p:
        page = f"{p.base}simple/base/"
        async with aiohttp.ClientSession() as s:
            assert (await get(s, page)).status == 200
        idle = [socket.create_connection(("127.0.0.1", p.port)) for _ in range(30)]
        slow = [socket.create_connection(("127.0.0.1", p.port)) for _ in range(5)]
        for sock in idle + slow:
            sock.setblocking(False)
        for sock in slow:
            sock.send(b"GET /simple/base/ HTTP/1.1\r\nHost: x\r\n")
        latencies = []
        async with aiohttp.ClientSession() as s:
            for i in range(20):
                for sock in slow:  # a header byte every 100 ms, never the end of the head
                    try:
                        sock.send(b"X-Slow-%d: y\r\n" % i)
                    except OSError:
                        pass
                got = await get(s, page)
                assert got.status == 200
                latencies.append(got.seconds)
                await asyncio.sleep(0.1)
        print(f"\n[clients] 30 idle + 5 slow-head connections: page latency max {max(latencies) * 1000:.0f} ms")
        assert max(latencies) < 0.5
        await poll(lambda: all(_closed_by_peer(sock) for sock in idle + slow), "idle and slow clients closed", timeout=5)
        # Over the cap: 20 silent extra connections get no slot (held until they speak, then refused at the
        # grace), and a request on a new connection is still served at once.
        many = [socket.create_connection(("127.0.0.1", p.port)) for _ in range(80)]
        for sock in many:
            sock.setblocking(False)
        async with aiohttp.ClientSession() as s:
            got = await get(s, page)
        assert got.status == 200 and got.seconds < 0.5
        await poll(lambda: sum(_closed_by_peer(sock) for sock in many) >= 20, "20 idle clients closed", timeout=5)
        async with aiohttp.ClientSession() as s, s.get(f"{p.base}metrics") as r:
            refused = re.search(r'^tufproxy_connections_closed_total\{reason="refused"\} (\S+)$', await r.text(), re.M)
        assert refused is not None and float(refused[1]) >= 20  # the extras never had a slot
        # The idle ones among them go after the timeout, and the proxy takes requests again.
        await poll(lambda: all(_closed_by_peer(sock) for sock in many), "every idle client closed", timeout=5)
        async with aiohttp.ClientSession() as s:
            assert (await get(s, page)).status == 200
        for sock in idle + slow + many:
            sock.close()


@pytest.mark.slow
async def test_busy_file_downloads_do_not_starve_a_metadata_refresh(tmp_path: Path, repo: Repository) -> None:
    with FaultyUpstream(repo.public_dir) as up, \
            ProxyProcess(tmp_path / "cache", "--upstream", up.url, "--root", str(tmp_path / "root.json"),
                         "--workers", "1", "--mirror-downloads", "2", "--refresh-interval", "1") as p:
        held = up.hold(r"/packages/.*")
        async with aiohttp.ClientSession() as s:
            downloads = [asyncio.create_task(get(s, f"{p.base}packages/base/base-2.0-py3-none-any.whl")),
                         asyncio.create_task(get(s, f"{p.base}packages/lib/lib-1.0-py3-none-any.whl")),
                         asyncio.create_task(get(s, f"{p.base}packages/lib/lib-1.1-py3-none-any.whl"))]
            assert await asyncio.to_thread(held.arrived.wait, 10)
            repo.add([build_wheel(tmp_path / "late", "late", "1.0")])  # a new timestamp to find
            start = time.monotonic()
            try:
                await poll(lambda: get(s, f"{p.base}simple/late/"), "the new project", timeout=10, interval=0.2,
                           done=lambda got: got.status == 200)
            finally:
                took = time.monotonic() - start
                held.release()
            done = await asyncio.gather(*downloads)
        print(f"\n[pools] every file slot busy: new project visible after {took:.2f}s")
        assert took < 5.0, took
        assert all(d.status == 200 for d in done)


@pytest.mark.slow
async def test_a_dripping_mirror_holds_nothing_hostage_once_honest_again(tmp_path: Path, repo: Repository) -> None:
    wheel = "/packages/base/base-2.0-py3-none-any.whl"
    data = (repo.public_dir / wheel.lstrip("/")).read_bytes()
    with FaultyUpstream(repo.public_dir) as up, \
            ProxyProcess(tmp_path / "cache", "--upstream", up.url, "--root", str(tmp_path / "root.json"),
                         "--workers", "1", "--read-timeout", "30", "--min-rate", "128K") as p:
        # A byte per 50 ms never trips a 30 s read timeout; the minimum rate over the body does.
        up.inject(r"/packages/base/.*", Fault.DRIP, interval=0.05)
        async with aiohttp.ClientSession() as s:
            first = asyncio.create_task(get(s, p.base + wheel.lstrip("/")))
            await poll(lambda: up.count(r"/packages/base/.*") == 1, "one upstream fetch", timeout=5)
            up.clear()  # honest again: a client asking now joins the dripping fetch...
            start = time.monotonic()
            second = await get(s, p.base + wheel.lstrip("/"))
            took = time.monotonic() - start
            await first
        print(f"\n[drip] a client joining a dripping fetch, mirror honest again: {second.status} after {took:.1f}s")
        # ...and gets a fresh fetch of its own once the drip is abandoned, not the drip's failure.
        assert second.status == 200 and second.body == data
        assert took < 8.0, took  # the 5 s grace, a chunk at the minimum rate, then the fetch
