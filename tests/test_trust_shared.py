"""Hash-bin roles one process leaves the others of its cache (proxy.trust.shared): read only at the version the
snapshot names, verified like a mirror's answer, a fetch whenever they do not verify."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

from proxy.trust import TrustConfig, TrustedClient
from proxy.trust.shared import SharedRoles
from tests.conftest import SampleRepo
from tests.support.trustenv import Env, bin_of, env

WHEEL = "packages/lib/lib-1.1-py3-none-any.whl"


def test_a_copy_is_read_at_its_version_only_and_within_its_bound(tmp_path: Path) -> None:
    shared = SharedRoles(tmp_path / "shared")
    assert shared.read("bin-0a", 3, 100) is None  # none left yet
    shared.write("bin-0a", 3, b'{"signed": 3}')
    assert shared.read("bin-0a", 3, 100) == b'{"signed": 3}'
    assert shared.read("bin-0a", 4, 100) is None
    assert shared.read("bin-0a", 3, 5) is None
    shared.write("bin-0a", 4, b"{}")  # rewritten in place: one file per role, shorter bytes cut to size
    assert shared.read("bin-0a", 4, 100) == b"{}"
    assert shared.read("bin-0a", 3, 100) is None
    shared.write("../bin/../x", 1, b"{}")  # a role name never reaches outside the directory
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == ["..%2Fbin%2F..%2Fx.json", "bin-0a.json"]


def _second(env: Env, sample_repo: SampleRepo, tmp_path: Path, shared: SharedRoles, **config: object) -> TrustedClient:
    """Another process's client of the same upstream: its own metadata dir, the same shared directory."""
    TrustedClient.initialize(tmp_path / "second", sample_repo.root_bytes)
    client = TrustedClient(tmp_path / "second", [env.mirror], env.fetcher,
                           TrustConfig(refresh_interval=3600.0, **config), shared)  # type: ignore[arg-type]
    env.clients.append(client)
    return client


async def _left_by_first(env: Env, tmp_path: Path, shared: SharedRoles) -> tuple[object, Path, bytes]:
    """A first process's lookup of WHEEL: what it found, the copy it left, and that copy's bytes."""
    first = TrustedClient(env.dir, [env.mirror], env.fetcher, TrustConfig(refresh_interval=3600.0), shared)
    env.clients.append(first)
    found = await first.get_target(WHEEL)
    await shared.drained()
    [copy] = (tmp_path / "shared").iterdir()
    return found, copy, copy.read_bytes()


async def test_a_bin_one_process_fetched_is_read_by_another(env: Env, sample_repo: SampleRepo, tmp_path: Path) -> None:
    shared = SharedRoles(tmp_path / "shared")
    found, _, _ = await _left_by_first(env, tmp_path, shared)
    bin_requests = rf"/metadata/\d+\.{bin_of(env, WHEEL)}\.json"
    assert env.up.count(bin_requests) == 1
    second = _second(env, sample_repo, tmp_path, shared)
    assert await second.get_target(WHEEL) == found
    assert env.up.count(bin_requests) == 1  # its timestamp and snapshot fetched, its bin-n read


async def test_a_copy_that_does_not_verify_is_fetched(env: Env, sample_repo: SampleRepo, tmp_path: Path) -> None:
    shared = SharedRoles(tmp_path / "shared")
    found, copy, kept = await _left_by_first(env, tmp_path, shared)
    # The version line kept, a target's length changed: the signature no longer covers the bytes.
    copy.write_bytes(kept.replace(b'"length":', b'"length":1', 1))
    bin_requests = rf"/metadata/\d+\.{bin_of(env, WHEEL)}\.json"
    second = _second(env, sample_repo, tmp_path, shared)
    assert await second.get_target(WHEEL) == found
    assert env.up.count(bin_requests) == 2  # fetched again, and left again for the next process
    await shared.drained()
    assert copy.read_bytes() == kept


async def test_a_client_that_persists_its_bins_leaves_none(env: Env, sample_repo: SampleRepo, tmp_path: Path) -> None:
    shared = SharedRoles(tmp_path / "shared")
    client = _second(env, sample_repo, tmp_path, shared, persist_bins=True)
    await client.get_target(WHEEL)
    await shared.drained()
    assert not (tmp_path / "shared").exists()
    assert (tmp_path / "second" / f"{bin_of(env, WHEEL)}.json").exists()


async def test_copies_that_cannot_be_verified_or_read_are_fetched(env: Env, sample_repo: SampleRepo,
                                                                   tmp_path: Path) -> None:
    shared = SharedRoles(tmp_path / "shared")
    found, copy, kept = await _left_by_first(env, tmp_path, shared)
    head, _, body = kept.partition(b"\n")
    doc = json.loads(body)
    doc["signed"]["x-float"] = 1.5  # parses, but has no canonical form to check a signature over
    older = json.loads(body)
    older["signed"]["version"] -= 1  # an older version's bytes under the version line asked for
    second = _second(env, sample_repo, tmp_path, shared)
    bin_requests = rf"/metadata/\d+\.{bin_of(env, WHEEL)}\.json"
    for planted in (head + b"\n" + json.dumps(doc).encode(), head + b"\n" + json.dumps(older).encode()):
        copy.write_bytes(planted)
        fetched = env.up.count(bin_requests)
        second._roles.clear()  # the lookup reads the bin again
        second._found.clear()
        assert await second.get_target(WHEEL) == found
        assert env.up.count(bin_requests) == fetched + 1
    # A FIFO where the copy was: reading it must not wait (the loop would hang), writing leaves it alone.
    await shared.drained()  # the copy the last fetch left, written before it is replaced
    copy.unlink()
    os.mkfifo(copy)
    second._roles.clear()
    second._found.clear()
    assert await second.get_target(WHEEL) == found
    await shared.drained()
    assert stat.S_ISFIFO(copy.lstat().st_mode)


def test_a_copy_is_never_written_through_a_symlink(tmp_path: Path) -> None:
    shared = SharedRoles(tmp_path / "shared")
    (tmp_path / "shared").mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "shared" / "bin-0a.json").symlink_to(victim)
    shared.write("bin-0a", 3, b"{}")
    assert victim.read_bytes() == b"precious"
    assert shared.read("bin-0a", 3, 100) is None  # nor read through one


async def test_a_copy_left_as_the_process_stops_is_dropped_quietly(tmp_path: Path) -> None:
    shared = SharedRoles(tmp_path / "shared")
    await asyncio.get_running_loop().shutdown_default_executor()
    shared.leave("bin-0a", 3, b"{}")  # no thread to write it in: dropped, no error
    await shared.drained()
    assert not (tmp_path / "shared").exists()
