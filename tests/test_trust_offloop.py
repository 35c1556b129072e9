"""A new snapshot of a 16,384-bin repository verifies off the edge's event loop (issue 19, B5)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tuf.api.metadata import Metadata

from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from proxy.trust import Mirror, TrustConfig, TrustedClient
from proxy.trust._tufset import TopLevelSet
from proxy.upstream import AiohttpFetcher
from tests.support.upstream import Upstream

pytestmark = pytest.mark.slow  # signing 16,384 bins takes ~30 s on a loaded 2-core machine


def _snapshot_verify_seconds(repo: Repository) -> float:
    """How long verifying the repository's current snapshot takes (what would block the loop)."""
    meta = repo.metadata_dir
    top = TopLevelSet((meta / "1.root.json").read_bytes(), datetime.now(UTC))
    ts = meta / "timestamp.json"
    top.update_timestamp(ts.read_bytes())
    version = Metadata.from_bytes(ts.read_bytes()).signed.snapshot_meta.version
    data = (meta / f"{version}.snapshot.json").read_bytes()
    start = time.perf_counter()
    top.update_snapshot(data)
    return time.perf_counter() - start


async def test_the_event_loop_keeps_answering_while_a_new_snapshot_verifies(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "repo", bins=16384)
    repo.add([build_wheel(tmp_path / "d", "first", "1.0")])
    fetcher = AiohttpFetcher(connect_timeout=2, read_timeout=10, total_timeout=60)
    with Upstream(repo.public_dir) as up:
        TrustedClient.initialize(tmp_path / "client", (repo.metadata_dir / "1.root.json").read_bytes())
        client = TrustedClient(
            tmp_path / "client", [Mirror(f"{up.url}metadata/", up.url)], fetcher, TrustConfig(refresh_interval=3600)
        )
        try:
            await client.refresh(force=True)
            before = client.timestamp_version or 0
            repo.add([build_wheel(tmp_path / "d", "second", "1.0")])
            # The measured cycle loads the persisted snapshot and verifies the new one: two
            # 16,384-entry snapshots, each of which blocked the loop for all its verification.
            loop = asyncio.get_running_loop()
            gaps: list[float] = []
            cycle = asyncio.create_task(client.refresh(force=True))
            last = loop.time()
            while not cycle.done():
                await asyncio.sleep(0.002)  # a tick of a loop that should stay responsive, not synchronisation
                now = loop.time()
                gaps.append(now - last)
                last = now
            await cycle
        finally:
            client.close()
            await fetcher.close()
    assert (client.timestamp_version or 0) > before
    verify = _snapshot_verify_seconds(repo)
    assert verify > 0.05, f"verification too quick ({verify:.3f} s) to tell a blocked loop apart"
    assert max(gaps) < verify / 2, f"loop blocked {max(gaps):.3f} s; one snapshot verifies in {verify:.3f} s"
