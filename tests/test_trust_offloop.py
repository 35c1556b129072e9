"""A new snapshot of a 16,384-bin repository verifies off the edge's event loop (issue 19, B5)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from proxy.protocol.tufset import TopLevelSet
from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from proxy.transport.upstream import AiohttpFetcher
from proxy.trust import Mirror, TrustConfig, TrustedClient
from tests.support.upstream import Upstream

pytestmark = pytest.mark.slow  # signing 16,384 bins takes ~30 s on a loaded 2-core machine


class _Timed:
    """Wraps a TopLevelSet method to record, per call, its thread and wall time (it still does the work)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.calls: list[tuple[int, float]] = []
        original = getattr(TopLevelSet, name)

        def timed(top: TopLevelSet, data: bytes) -> object:
            start = time.perf_counter()
            try:
                return original(top, data)
            finally:
                self.calls.append((threading.get_ident(), time.perf_counter() - start))

        monkeypatch.setattr(TopLevelSet, name, timed)


ATTEMPTS = 3  # cycles measured; a loop that verifies on its own thread is blocked in every one


@pytest.mark.slow
async def test_the_event_loop_keeps_answering_while_a_new_snapshot_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = Repository.init(tmp_path / "repo", bins=16384)
    repo.add([build_wheel(tmp_path / "d", "first", "1.0")])
    fetcher = AiohttpFetcher(connect_timeout=2, read_timeout=10, total_timeout=60)
    seen: list[str] = []
    with Upstream(repo.public_dir) as up:
        TrustedClient.initialize(tmp_path / "client", (repo.metadata_dir / "1.root.json").read_bytes())
        client = TrustedClient(
            tmp_path / "client", [Mirror(f"{up.url}metadata/", up.url)], fetcher, TrustConfig(refresh_interval=3600)
        )
        try:
            await client.refresh(force=True)
            for attempt in range(ATTEMPTS):
                before = client.timestamp_version or 0
                repo.add([build_wheel(tmp_path / "d", f"second{attempt}", "1.0")])
                verifications = [_Timed(monkeypatch, "load_local_snapshot"), _Timed(monkeypatch, "update_snapshot")]
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
                monkeypatch.undo()
                assert (client.timestamp_version or 0) > before
                calls = [call for timed in verifications for call in timed.calls]
                assert len(calls) == 2, calls  # the persisted snapshot loaded, the new one verified
                assert all(thread != threading.get_ident() for thread, _ in calls), "a snapshot verified on the loop's thread"
                # Timed in the same cycle, under the same load: a loop blocked by a verification would show
                # one gap at least that long.  Smaller gaps remain: the verifying thread holds the GIL for
                # json.loads, and on a busy 2-core machine the loop's thread waits for a CPU to take it
                # back; so a cycle may be measured again, and one clear cycle is enough.
                verify = max(seconds for _, seconds in calls)
                assert verify > 0.05, f"verification too quick ({verify:.3f} s) to tell a blocked loop apart"
                seen.append(f"loop blocked {max(gaps):.3f} s; a snapshot verified in {verify:.3f} s")
                if max(gaps) < verify * 0.75:
                    break
            else:
                pytest.fail(f"in each of {ATTEMPTS} cycles the loop was blocked nearly as long as a verification: {seen}")
        finally:
            client.close()
            await fetcher.close()
