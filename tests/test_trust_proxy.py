"""Trust-core attacks through the real proxy: refusal, audit record and metric, then recovery.

A ``tufproxy serve`` subprocess sits in front of a real upstream serving a
signed tree, and the upstream lies the way the issue describes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import pytest
from tuf.api.metadata import Metadata

from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from tests.conftest import make_sample_dists
from tests.support.faults import get
from tests.support.poll import poll
from tests.support.proxyproc import ProxyProcess
from tests.support.upstream import Upstream


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


def audit_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")] if path.exists() else []


@pytest.fixture
def signed_tree(tmp_path: Path) -> tuple[Repository, Path]:
    repo = Repository.init(tmp_path / "repo", bins=16)
    repo.add(make_sample_dists(tmp_path / "dists"))
    root = tmp_path / "root.json"
    root.write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
    return repo, root


def _unsigned(data: bytes) -> bytes:
    doc = json.loads(data)
    doc["signatures"] = []
    return json.dumps(doc).encode()


@pytest.mark.slow
@pytest.mark.parametrize("served", ["timestamp", "unsigned-targets"])
async def test_type_confused_snapshot_is_refused_audited_counted_and_survived(
        signed_tree: tuple[Repository, Path], tmp_path: Path, served: str) -> None:
    """Issue 17, finding 1: the timestamp (or an unsigned targets) served as N.snapshot.json."""
    repo, root = signed_tree
    audit = tmp_path / "audit.log"
    with Upstream(repo.public_dir) as up, \
            ProxyProcess(tmp_path / "cache", "--upstream", up.url, "--root", str(root), "--workers", "1",
                         "--refresh-interval", "1", "--miss-wait", "2", "--audit-log", str(audit)) as proxy:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            assert (await get(session, f"{proxy.url}base/")).status == 200
            repo.add([build_wheel(tmp_path / "new", "fresh", "1.0")])
            meta = repo.metadata_dir
            snapshot = Metadata.from_bytes((meta / "timestamp.json").read_bytes()).signed.snapshot_meta.version
            lie = (meta / "timestamp.json").read_bytes() if served == "timestamp" else \
                _unsigned(next(meta.glob("*.targets.json")).read_bytes())
            up.replace(rf"/metadata/{snapshot}\.snapshot\.json", lie)

            # Until a refresh has seen the new timestamp, the old state answers (404 or 503 while one runs).
            refused = await poll(lambda: get(session, f"{proxy.url}fresh/"), "a refusal", interval=0.1,
                                 done=lambda a: a.status not in (404, 503))
            assert refused.status == 502, refused
            assert refused.headers["x-tufproxy-reason"] == "bad-metadata"
            # The update is aborted (issue 27, item 6): a project of the still-valid state keeps serving.
            assert (await get(session, f"{proxy.url}lib/")).status == 200
            records = [r for r in audit_records(audit) if r.get("reason") == "bad-metadata"]
            assert records and records[0]["role"] == "snapshot" and records[0]["event"] == "refused"
            # The refresher lives on: it keeps retrying (and counting) while the mirror lies.
            async def metrics() -> str:
                return await (await session.get(f"{proxy.base}metrics")).text()

            text = await poll(metrics, "two refresh failures", interval=0.1,
                              done=lambda t: metric(t, "tufproxy_refresh_failures_total", reason="bad-metadata") >= 2)
            assert metric(text, "tufproxy_verification_failures_total", reason="bad-metadata") >= 1
            # Honest again: the new release is served without a restart.
            up.clear()
            assert (await poll(lambda: get(session, f"{proxy.url}fresh/"), "fresh served", interval=0.1,
                               done=lambda a: a.status == 200)).status == 200
        assert "Traceback" not in proxy.log()


@pytest.mark.slow
async def test_a_replica_on_the_shared_cache_never_answers_from_a_state_another_outgrew(
        signed_tree: tuple[Repository, Path], tmp_path: Path) -> None:
    """Issue 17, finding 2: 30 requests to a replica whose mirror rolls back gave 12 answers from the old state."""
    repo, root = signed_tree
    old_timestamp = (repo.metadata_dir / "timestamp.json").read_bytes()
    repo.add([build_wheel(tmp_path / "new", "lib", "3.0")])
    cache = tmp_path / "shared-cache"
    flags = ("--root", str(root), "--workers", "1", "--refresh-interval", "1", "--miss-wait", "2")
    with Upstream(repo.public_dir) as up, ProxyProcess(cache, "--upstream", up.url, *flags) as first:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            page = await get(session, f"{first.url}lib/")
            assert page.status == 200 and b"lib-3.0" in page.body
            # The mirror rolls back to the previous, still valid, timestamp; a replica starts on the
            # same cache dir while the first process holds slot 0, so it gets a new slot.
            up.replace(r"/metadata/timestamp\.json", old_timestamp)
            with ProxyProcess(cache, "--upstream", up.url, *flags) as replica:
                assert (cache / "metadata" / "worker-1" / "timestamp.json").exists()
                answers = [await get(session, f"{replica.url}lib/") for _ in range(30)]
                replica_metrics = await (await session.get(f"{replica.base}metrics")).text()
    rolled_back = [a for a in answers if a.status == 200 and b"lib-3.0" not in a.body]
    assert not rolled_back, f"{len(rolled_back)} of 30 answers came from the rolled-back state"
    # The replayed timestamp is refused and counted; the replica answers from the newer state it trusts.
    assert metric(replica_metrics, "tufproxy_verification_failures_total", reason="rollback") >= 1
    assert all(a.status == 502 or b"lib-3.0" in a.body for a in answers)
