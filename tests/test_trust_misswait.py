"""Miss-wait through the real proxy: a stalled timestamp turns a miss into 503 + Retry-After, which pip retries.

A release is published upstream, then the mirror sits on ``timestamp.json``.
Asking for the new project must neither hang until pip's read timeout nor
answer 404 (which ends pip's resolve): it answers 503 with Retry-After
within ``--miss-wait``, while a project the proxy already knows is served at
once.  pip, started during the stall, keeps retrying and installs the new
release once the mirror answers again.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from tests.conftest import make_sample_dists
from tests.support.clients import clean_env
from tests.support.faults import FaultyUpstream, get
from tests.support.proxyproc import ProxyProcess

MISS_WAIT = 1.0


def pending_answers(metrics: str) -> float:
    """How many 503s the proxy has answered so far (per its own metrics)."""
    return sum(float(v) for v in re.findall(r'tufproxy_requests_total\{[^}]*status="503"[^}]*\} (\S+)', metrics))


@pytest.mark.slow
async def test_a_miss_during_a_stalled_refresh_is_503_retry_after_and_pip_retries(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "repo", bins=16)
    repo.add(make_sample_dists(tmp_path / "dists"))
    root = tmp_path / "root.json"
    root.write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
    with FaultyUpstream(repo.public_dir) as mirror, \
            ProxyProcess(tmp_path / "cache", "--upstream", mirror.url, "--root", str(root), "--workers", "1",
                         "--refresh-interval", "1", "--miss-wait", str(MISS_WAIT)) as proxy:
        async with aiohttp.ClientSession() as session:
            await stalled_miss(tmp_path, repo, mirror, proxy, session)


async def stalled_miss(tmp_path: Path, repo: Repository, mirror: FaultyUpstream, proxy: ProxyProcess,
                       session: aiohttp.ClientSession) -> None:
    assert (await get(session, f"{proxy.url}base/")).status == 200
    repo.add([build_wheel(tmp_path / "new", "fresh", "1.0")])
    stall = mirror.hold(r"/metadata/timestamp\.json")
    try:
        # The proxy's own refresher asks for the timestamp within a refresh interval, and waits.
        assert await asyncio.to_thread(stall.arrived.wait, 10)
        miss = await get(session, f"{proxy.url}fresh/")
        assert miss.status == 503, miss
        assert miss.headers["retry-after"] == "1"
        assert miss.headers["x-tufproxy-reason"] == "metadata-pending"
        assert MISS_WAIT * 0.9 <= miss.seconds < MISS_WAIT + 1.5
        hit = await get(session, f"{proxy.url}base/")
        assert hit.status == 200 and hit.seconds < MISS_WAIT
        answered = pending_answers(await (await session.get(f"{proxy.base}metrics")).text())
        pip = subprocess.Popen(
            [sys.executable, "-m", "pip", "install", "--index-url", proxy.url, "--target", str(tmp_path / "t"),
             "--retries", "10", "--timeout", "15", "fresh"],
            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        # pip got a 503 during the stall (the proxy counted it) and did not give up: see below.
        deadline = time.monotonic() + 30
        while pending_answers(await (await session.get(f"{proxy.base}metrics")).text()) <= answered:
            assert time.monotonic() < deadline and pip.poll() is None, "pip never got a 503"
            await asyncio.sleep(0.05)
    finally:
        stall.release()
        mirror.clear()
    out, _ = await asyncio.to_thread(pip.communicate, timeout=120)
    assert pip.returncode == 0, out
    assert (tmp_path / "t" / "fresh").is_dir() or any((tmp_path / "t").glob("fresh*")), out
