"""``tufproxy gateway serve --workers 2``: workers share DIR, one signs at a time, a kill -9 of one is harmless.

Real parts throughout: the test index serves wheels built here, the
gateway runs as a ``tufproxy`` subprocess with two worker processes, an
edge (``serve --workers 2``) sits in front, pip and uv install through it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import random
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.repository.sample import build_wheel
from tests.support.clients import uv_path
from tests.support.gatewayproc import GatewayProcess, install_chain_first_try
from tests.support.gatewayproc import gateway_init as _gateway_init
from tests.support.gatewayproc import metric as _metric
from tests.support.poll import wait_for
from tests.support.testindex import TestIndex

CLIENTS = ["pip", pytest.param("uv", marks=pytest.mark.skipif(uv_path() is None, reason="uv not installed"))]


@pytest.fixture
def test_index(tmp_path: Path) -> Iterator[TestIndex]:
    dists = tmp_path / "dists"
    index = TestIndex(separate_files_host=True)
    for path in (build_wheel(dists, "app", "1.0", requires=["lib>=1.0"]), build_wheel(dists, "lib", "1.0", requires=["base"]),
                 build_wheel(dists, "base", "2.0")):
        index.add(path)
    with index:
        yield index


def _gateway(tmp_path: Path, test_index: TestIndex, *extra: str) -> GatewayProcess:
    _gateway_init(tmp_path / "gw")
    return GatewayProcess(tmp_path / "gw", "--index-url", test_index.url, "--files-origin", test_index.files_url,
                          "--workers", "2", *extra)


def _workers(gw: GatewayProcess) -> list[int]:
    """The pids of the gateway's worker processes (children of its supervisor)."""
    assert gw.proc is not None
    children = Path(f"/proc/{gw.proc.pid}/task/{gw.proc.pid}/children").read_text().split()
    return [int(pid) for pid in children]


def _serving_workers(gw: GatewayProcess) -> list[int]:
    """The workers the supervisor logged ready: a restarted one is a child well before it listens."""
    ready = {int(pid) for pid in re.findall(r"worker \d+ ready \(pid (\d+)\)", gw.log_path.read_text())}
    return [pid for pid in _workers(gw) if pid in ready]


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_chain_installs_through_edge_and_two_gateway_workers(tmp_path: Path, test_index: TestIndex, client: str) -> None:
    """First try, nothing published yet; files fetched on demand land in --cache-dir, not in DIR/public."""
    cache = tmp_path / "gw-cache"
    with _gateway(tmp_path, test_index, "--cache-dir", str(cache)) as gw:
        wait_for(lambda: len(_workers(gw)) == 2, what="two gateway workers")
        install_chain_first_try(tmp_path, gw, client)
        for project in ("app", "lib", "base"):
            assert test_index.requests.count(f"/simple/{project}/") == 1
    assert (cache / "packages" / "app" / "app-1.0-py3-none-any.whl").is_file()
    assert not (gw.directory / "public" / "packages").exists()


@pytest.mark.slow
def test_concurrent_cold_projects_over_two_workers_cost_few_signatures(tmp_path: Path, test_index: TestIndex) -> None:
    for i in range(50):
        test_index.add(build_wheel(tmp_path / "many", f"proj{i}", "1.0"))
    snapshots = lambda: len(list((tmp_path / "gw" / "public" / "metadata").glob("*.snapshot.json")))  # noqa: E731
    with _gateway(tmp_path, test_index, "--batch-window", "0.5") as gw:
        wait_for(lambda: len(_workers(gw)) == 2, what="two gateway workers")
        before = snapshots()
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            answers = list(pool.map(gw.publish, [f"proj{i}" for i in range(50)]))
        assert all(status == 200 for status, _ in answers), answers
        signed = snapshots() - before
        batches = _metric(gw.base, "tufproxy_gateway_publishes_total")
        print(f"50 concurrent cold projects over 2 workers: {signed} snapshot signatures, {batches:.0f} batches")
        # Each worker signs its batch; the repository's lock makes them take turns.
        assert 1 <= signed <= 10 and signed == batches
        versions = sorted(v for _, a in answers for v in [a["timestamp_version"]])
        assert len(set(versions)) <= signed
        for i in range(50):
            assert test_index.requests.count(f"/simple/proj{i}/") == 1


def _publish_quietly(gw: GatewayProcess, project: str) -> None:
    with contextlib.suppress(OSError):  # the worker answering may be killed on purpose
        gw.publish(project, timeout=10)


async def _edge_refresh(meta: Path, base: str) -> int:
    from proxy.transport.upstream import AiohttpFetcher
    from proxy.trust import Mirror, TrustConfig, TrustedClient

    fetcher = AiohttpFetcher()
    trust = TrustedClient(meta, [Mirror(f"{base}metadata/", base)], fetcher, TrustConfig(refresh_interval=3600))
    try:
        await trust.refresh(force=True)  # raises on rollback, a bad signature, torn metadata
        assert trust.timestamp_version is not None
        return trust.timestamp_version
    finally:
        trust.close()
        await fetcher.close()


@pytest.mark.slow
def test_kill_9_of_one_worker_mid_publish_leaves_verifying_metadata(tmp_path: Path, test_index: TestIndex) -> None:
    from proxy.trust import TrustedClient

    for i in range(30):
        test_index.add(build_wheel(tmp_path / "many", f"crash{i}", "1.0"))
    rng = random.Random(3)
    with _gateway(tmp_path, test_index, "--batch-window", "0.05") as gw:
        TrustedClient.initialize(tmp_path / "edge-meta", gw.root.read_bytes())
        trusted = [asyncio.run(_edge_refresh(tmp_path / "edge-meta", gw.base))]
        for round_ in range(5):
            # Both serving before one is killed: killing the other while its replacement still starts
            # would leave nobody listening, which is not what this test is about.
            workers = wait_for(lambda: len(_serving_workers(gw)) == 2 and _serving_workers(gw), what="two serving workers")
            names = [f"crash{(round_ * 6 + k) % 30}" for k in range(6)]
            threads = [threading.Thread(target=_publish_quietly, args=(gw, n)) for n in names]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.05, 0.3))  # the kill lands at a random point of the publishes: that is the test
            victim = rng.choice(workers)  # type: ignore[arg-type]
            os.kill(victim, signal.SIGKILL)
            for t in threads:
                t.join(15)
            # Until the kernel has closed the dead worker's listener, a connect may still land in its queue and be
            # refused (net.ipv4.tcp_migrate_req is off by default): not what this test is about.
            wait_for(lambda v=victim: v not in _workers(gw), what="the killed worker reaped")
            trusted.append(asyncio.run(_edge_refresh(tmp_path / "edge-meta", gw.base)))
        # The supervisor replaced the dead workers; publishing still works and moves versions on.
        wait_for(lambda: len(_workers(gw)) == 2, what="workers restarted")
        wait_for(lambda: gw.publish("crash29")[0] == 200, what="a publish after the kills")
        status, answer = gw.publish("app")
        assert status == 200
        trusted.append(asyncio.run(_edge_refresh(tmp_path / "edge-meta", gw.base)))
    print(f"timestamp versions an edge trusted across 5 kill -9 of a worker: {trusted}")
    assert trusted == sorted(trusted) and trusted[-1] > trusted[0]
    assert trusted[-1] >= answer["timestamp_version"]
