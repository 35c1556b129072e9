"""A new metadata slot starts from the newest state its siblings trust, re-verified from the pinned root."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tuf.api.metadata import Metadata

from proxy.trust import Rollback, TrustedClient
from proxy.trust.slots import catch_up
from tests.conftest import SampleRepo
from tests.support.trustenv import Env, env, tampered


def version(directory: Path, role: str) -> int:
    return Metadata.from_bytes((directory / f"{role}.json").read_bytes()).signed.version


async def test_a_new_slot_catches_up_and_refuses_what_its_sibling_outgrew(env: Env, sample_repo: SampleRepo,
                                                                           tmp_path: Path) -> None:
    old = env.meta("timestamp.json")
    env.repo.rotate_root()
    env.publish(tmp_path)
    await env.client().refresh()  # the sibling: root v2, the newest timestamp
    fresh = tmp_path / "fresh"
    TrustedClient.initialize(fresh, sample_repo.root_bytes)
    rank = catch_up(fresh, sample_repo.root_bytes, [env.dir, fresh])
    assert rank == (2, env.version("timestamp"), env.version("snapshot"))
    for role in ("root", "timestamp", "snapshot", "targets"):
        assert (fresh / f"{role}.json").read_bytes() == (env.dir / f"{role}.json").read_bytes()
    assert sorted(p.name for p in (fresh / "roots").iterdir()) == ["1.root.json", "2.root.json"]
    assert catch_up(fresh, sample_repo.root_bytes, [env.dir, fresh]) is None  # nothing newer now
    env.up.replace(r"/metadata/timestamp\.json", old)
    client = TrustedClient(fresh, [env.mirror], env.fetcher)
    try:
        with pytest.raises(Rollback):
            await client.refresh(force=True)
    finally:
        client.close()


async def test_nothing_a_sibling_holds_is_adopted_unverified(env: Env, sample_repo: SampleRepo, tmp_path: Path) -> None:
    await env.client().refresh()
    env.clients[-1].close()
    forged = tmp_path / "forged"
    TrustedClient.initialize(forged, sample_repo.root_bytes)
    # A writer of the shared volume: a higher timestamp with a broken signature, a root v2 nobody signed.
    (forged / "timestamp.json").write_bytes(
        tampered(env.meta("timestamp.json"), lambda s: s.update(version=s["version"] + 100)))
    root2 = json.loads(sample_repo.root_bytes)
    root2["signed"]["version"] = 2
    (forged / "roots" / "2.root.json").write_bytes(json.dumps(root2).encode())
    fresh = tmp_path / "fresh"
    TrustedClient.initialize(fresh, sample_repo.root_bytes)
    rank = catch_up(fresh, sample_repo.root_bytes, [forged, env.dir])
    assert rank == (1, env.version("timestamp"), env.version("snapshot"))  # the honest sibling's
    assert version(fresh, "root") == 1 and not (fresh / "roots" / "2.root.json").exists()
    assert (fresh / "timestamp.json").read_bytes() == (env.dir / "timestamp.json").read_bytes()


async def test_a_slot_never_moves_backwards(env: Env, sample_repo: SampleRepo, tmp_path: Path) -> None:
    behind = tmp_path / "behind"
    TrustedClient.initialize(behind, sample_repo.root_bytes)
    client = TrustedClient(behind, [env.mirror], env.fetcher)
    await client.refresh()
    client.close()
    env.publish(tmp_path)
    await env.client().refresh()
    env.clients[-1].close()
    before = {p.name: p.read_bytes() for p in env.dir.iterdir() if p.is_file()}
    assert catch_up(env.dir, sample_repo.root_bytes, [behind, env.dir]) is None
    assert {p.name: p.read_bytes() for p in env.dir.iterdir() if p.is_file()} == before
