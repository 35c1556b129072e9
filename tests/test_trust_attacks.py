"""The attack matrix: a real signed repository behind a lying upstream.

Every attack must be refused with the right error class, leave the live
trusted state as it was, and never write the refused document: only the
roles of that cycle that verified before it are persisted (the spec's
client workflow persists each role as soon as it verifies).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tuf.api.metadata import Metadata, MetaFile, Snapshot

import proxy.trust.client as trust_client
from proxy.repository import Expiry, Repository
from proxy.repository.keys import ONLINE
from proxy.repository.sample import build_wheel
from proxy.transport.upstream import AiohttpFetcher
from proxy.trust import (
    BadSignature,
    ExpiredMetadata,
    HashMismatch,
    LengthMismatch,
    Mirror,
    Rollback,
    TrustedClient,
    UnknownTarget,
    UpstreamUnreachable,
    VersionMismatch,
)
from tests.conftest import SampleRepo
from tests.support.net import free_port
from tests.support.tree import all_targets, signed_timestamp
from tests.support.trustenv import Env, bin_of, env, tampered
from tests.support.upstream import Upstream


async def assert_refused(env: Env, client: TrustedClient, error: type[Exception], persisted: tuple[str, ...] = (),
                         **attrs: object) -> Exception:
    """A forced refresh raises ``error``; status does not change, and on disk only the ``persisted`` files do."""
    before_status, before_disk = client.status(), env.on_disk()
    with pytest.raises(error) as info:
        await client.refresh(force=True)
    for name, value in attrs.items():
        assert getattr(info.value, name) == value, (name, info.value)
    after = client.status()
    assert after["roles"] == before_status["roles"]
    after_disk = env.on_disk()
    assert {name for name in {*before_disk, *after_disk} if before_disk.get(name) != after_disk.get(name)} == set(persisted)
    return info.value


WHEEL = "packages/lib/lib-1.1-py3-none-any.whl"


# -- the happy path, so the attacks below are refusals of something that works ---------


async def test_lookup_and_urls(env: Env) -> None:
    client = env.client()
    target = await client.get_target(WHEEL)
    assert target.role == bin_of(env, WHEEL)
    data = (env.repo.public_dir / WHEEL).read_bytes()
    target.verify(data)
    [url] = client.target_urls(target)
    assert url == f"{env.up.url}packages/lib/{target.hashes['sha256']}.{WHEEL.rsplit('/', 1)[1]}"
    with pytest.raises(UnknownTarget):
        await client.get_target("packages/lib/lib-9.9-py3-none-any.whl")
    assert set(env.on_disk()) >= {"root.json", "timestamp.json", "snapshot.json", "targets.json", "bins.json"}


# -- tampering --------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["timestamp", "snapshot", "targets"])
async def test_tampered_top_level_role_is_refused(env: Env, tmp_path: Path, role: str) -> None:
    client = env.client()
    await client.refresh()
    if role != "targets":
        env.publish(tmp_path)
    if role == "targets":
        # targets is offline and did not change: a snapshot thief "publishes" a new one.
        version, snapshot_version = env.version("targets"), env.version("snapshot")
        env.up.replace(rf"/metadata/{snapshot_version + 1}\.snapshot\.json",
                       _resign_snapshot(env, {"targets.json": version + 1}))
        env.up.replace(r"/metadata/timestamp\.json", signed_timestamp(env.repo, snapshot_version=snapshot_version + 1))
        env.up.replace(rf"/metadata/{version + 1}\.targets\.json",
                       tampered(env.meta(f"{version}.targets.json"), lambda s: s.update(version=version + 1)))
    else:
        name = "timestamp.json" if role == "timestamp" else f"{env.version('snapshot')}.snapshot.json"
        env.up.replace(rf"/metadata/{name.replace('.', '[.]')}",
                       tampered(env.meta(name), lambda s: s.update(expires="2099-01-01T00:00:00Z")))
    persisted = {"timestamp": (), "snapshot": ("timestamp.json",), "targets": ("timestamp.json", "snapshot.json")}
    await assert_refused(env, client, BadSignature, persisted[role], role=role)


async def test_tampered_bin_is_refused(env: Env) -> None:
    client = env.client()
    name = bin_of(env, WHEEL)
    version = env.version(name)

    def evil(signed: dict) -> None:
        signed["targets"][WHEEL]["hashes"]["sha256"] = "0" * 64

    env.up.replace(rf"/metadata/{version}\.{name}\.json", tampered(env.meta(f"{version}.{name}.json"), evil))
    with pytest.raises(BadSignature) as info:
        await client.get_target(WHEEL)
    assert info.value.role == name
    assert f"{name}.json" not in env.on_disk()


def _resign_snapshot(env: Env, bumps: dict[str, int], version_bump: int = 1) -> bytes:
    """A snapshot signed with the real online key listing the versions the test says."""
    current = Metadata[Snapshot].from_bytes(env.meta(f"{env.version('snapshot')}.snapshot.json"))
    signed = current.signed
    signed.version += version_bump
    for name, version in bumps.items():
        signed.meta[name] = MetaFile(version=version)
    current.signatures.clear()
    current.sign(env.repo.keys.load(ONLINE))
    return current.to_bytes()


# -- rollback, replay, mix and match ------------------------------------------------------


async def test_timestamp_rollback_is_refused(env: Env, tmp_path: Path) -> None:
    old = env.meta("timestamp.json")
    old_version = env.version("timestamp")
    env.publish(tmp_path)
    client = env.client()
    await client.refresh()
    env.up.replace(r"/metadata/timestamp\.json", old)
    await assert_refused(env, client, Rollback, role="timestamp", expected=old_version + 1, actual=old_version)


async def test_restart_keeps_rollback_protection(env: Env, tmp_path: Path) -> None:
    old = env.meta("timestamp.json")
    env.publish(tmp_path)
    await env.client().refresh()
    restarted = env.client()  # a new process over the same directory
    env.up.replace(r"/metadata/timestamp\.json", old)
    await assert_refused(env, restarted, Rollback, role="timestamp")


async def test_timestamp_rolling_back_snapshot_is_refused(env: Env) -> None:
    client = env.client()
    await client.refresh()
    snapshot_version = env.version("snapshot")
    env.up.replace(r"/metadata/timestamp\.json", signed_timestamp(env.repo, snapshot_version=snapshot_version - 1))
    await assert_refused(env, client, Rollback, role="snapshot", expected=snapshot_version, actual=snapshot_version - 1)


async def test_snapshot_rollback_and_mix_and_match_are_refused(env: Env, tmp_path: Path) -> None:
    client = env.client()
    await client.refresh()
    old_version = env.version("snapshot")
    env.publish(tmp_path, "extra", "1.0")
    env.publish(tmp_path, "extra", "2.0")
    new_version = env.version("snapshot")
    assert new_version == old_version + 2
    # A newer snapshot than the timestamp lists (mix and match of repository states); the
    # timestamp (one version before the current one) verifies, and is kept.
    env.up.replace(r"/metadata/timestamp\.json",
                   signed_timestamp(env.repo, snapshot_version=old_version + 1, version_bump=-1))
    env.up.replace(rf"/metadata/{old_version + 1}\.snapshot\.json", env.meta(f"{new_version}.snapshot.json"))
    await assert_refused(env, client, VersionMismatch, ("timestamp.json",),
                         role="snapshot", expected=old_version + 1, actual=new_version)
    # An older snapshot served under the name the current timestamp asks for.
    env.up.clear()
    env.up.replace(rf"/metadata/{new_version}\.snapshot\.json", env.meta(f"{old_version}.snapshot.json"))
    await assert_refused(env, client, Rollback, ("timestamp.json",), role="snapshot", expected=new_version,
                         actual=old_version)


async def test_snapshot_rolling_back_a_bin_is_refused(env: Env) -> None:
    """A thief of the online key still cannot roll a bin back past what we trust."""
    client = env.client()
    await client.refresh()
    name = bin_of(env, WHEEL)
    version = env.version(name)
    env.up.replace(rf"/metadata/{env.version('snapshot') + 1}\.snapshot\.json", _resign_snapshot(env, {f"{name}.json": version - 1}))
    env.up.replace(r"/metadata/timestamp\.json", signed_timestamp(env.repo, snapshot_version=env.version("snapshot") + 1))
    await assert_refused(env, client, Rollback, ("timestamp.json",), role=name, expected=version, actual=version - 1)


async def test_bin_rollback_is_refused(env: Env, tmp_path: Path) -> None:
    """The bin that lists a new file, replayed in its previous version."""
    target = env.publish(tmp_path, "lib", "3.0")
    name = bin_of(env, target)
    version = env.version(name)
    client = env.client()
    old = env.meta(f"{version - 1}.{name}.json")
    env.up.replace(rf"/metadata/{version}\.{name}\.json", old)
    with pytest.raises(Rollback) as info:
        await client.get_target(target)
    assert (info.value.role, info.value.expected, info.value.actual) == (name, version, version - 1)
    # Once the upstream stops lying the same client finds it: nothing bad was cached.
    env.up.clear()
    assert (await client.get_target(target)).path == target


async def test_replayed_old_root_is_refused(env: Env) -> None:
    env.repo.rotate_root()
    client = env.client()
    await client.refresh()
    # Version 3 is probed next: answer with root 2 (a valid, older root).
    env.up.replace(r"/metadata/3\.root\.json", env.meta("2.root.json"))
    await assert_refused(env, client, Rollback, role="root", expected=2, actual=2)


# -- freeze / expiry ------------------------------------------------------------------------


def _clock(monkeypatch: pytest.MonkeyPatch, delta: timedelta) -> None:
    """Move the trust core's wall clock: the upstream stays frozen meanwhile."""
    monkeypatch.setattr(trust_client, "_utcnow", lambda: datetime.now(UTC) + delta)


@pytest.mark.slow
async def test_freeze_attack_fails_closed(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    client = env.client(refresh_interval=0.0)
    await client.get_target(WHEEL)
    _clock(monkeypatch, timedelta(days=2))  # past the 1-day timestamp, upstream never updates
    error = await assert_refused(env, client, ExpiredMetadata, role="timestamp")
    assert error.expires == client.status()["roles"]["timestamp"]["expires"]
    # Lookups refuse too, naming the earliest expired role they rely on.
    with pytest.raises(ExpiredMetadata) as info:
        await client.get_target(WHEEL)
    assert info.value.expires == error.expires  # online roles all expire together
    assert not client.status()["ready"]


async def test_remembered_lookup_still_refuses_once_expired(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup answered from memory (no second walk) checks expiry at every call, as a walk does."""
    client = env.client(refresh_interval=3600.0)
    first = await client.get_target(WHEEL)
    walks = []
    real_walk = trust_client.walk
    monkeypatch.setattr(trust_client, "walk", lambda *a: walks.append(a) or real_walk(*a))
    assert await client.get_target(WHEEL) == first
    assert client.remembered(WHEEL) is first and client.remembered("packages/lib/never.whl") is None
    assert walks == []  # remembered for this trusted state
    _clock(monkeypatch, timedelta(days=2))
    assert client.remembered(WHEEL) is None  # the hot path's question: past expiry, nothing at once
    with pytest.raises(ExpiredMetadata):
        await client.get_target(WHEEL)
    assert not client.status()["ready"]


async def test_expired_new_timestamp_is_refused(env: Env) -> None:
    client = env.client()
    await client.refresh()
    env.repo.refresh(now=datetime.now(UTC) - timedelta(days=3), force=True)
    await assert_refused(env, client, ExpiredMetadata, role="timestamp")


async def test_expired_bin_fails_the_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup checks the expiry of every role it used, the cached bin included."""
    repo = Repository.init(tmp_path / "repo", bins=4, expiry=Expiry(bin_n=timedelta(hours=1)))
    repo.add([build_wheel(tmp_path / "dists", "lib", "1.1")])
    with Upstream(repo.public_dir) as up:
        TrustedClient.initialize(tmp_path / "client", (repo.metadata_dir / "1.root.json").read_bytes())
        fetcher = AiohttpFetcher()
        client = TrustedClient(tmp_path / "client", [Mirror(f"{up.url}metadata/", up.url)], fetcher)
        try:
            target = await client.get_target(WHEEL)
            _clock(monkeypatch, timedelta(hours=2))  # timestamp and snapshot still valid
            with pytest.raises(ExpiredMetadata) as info:
                await client.get_target(WHEEL)
            assert info.value.role == target.role
            assert info.value.expires < datetime.now(UTC) + timedelta(hours=2)
        finally:
            client.close()
            await fetcher.close()


# -- endless data and bad sizes -------------------------------------------------------------


async def test_endless_timestamp_is_cut_off(env: Env) -> None:
    client = env.client()
    await client.refresh()
    env.up.replace(r"/metadata/timestamp\.json", b"{" + b" " * 1_000_000)
    await assert_refused(env, client, LengthMismatch, role="timestamp")


async def test_endless_bin_is_cut_off(env: Env) -> None:
    client = env.client(targets_max_length=50_000)
    name = bin_of(env, WHEEL)
    env.up.replace(rf"/metadata/\d+\.{name}\.json", b"[" * 200_000)
    with pytest.raises(LengthMismatch):
        await client.get_target(WHEEL)


async def test_same_length_target_swap_is_caught_by_hash(env: Env) -> None:
    client = env.client()
    target = await client.get_target(WHEEL)
    original = (env.repo.public_dir / WHEEL).read_bytes()
    swapped = bytes([original[0] ^ 1]) + original[1:]
    [url] = client.target_urls(target)
    env.up.replace(r"/packages/lib/[0-9a-f]{64}\.lib-1\.1-py3-none-any\.whl", swapped)
    served = await env.fetcher.fetch_bytes(url, target.length)
    assert len(served) == target.length
    with pytest.raises(HashMismatch) as info:
        target.verify(served)
    assert info.value.expected == target.hashes["sha256"]


# -- keys: rotation, thresholds, fast-forward recovery ---------------------------------------


async def test_root_rotation_with_threshold_change(env: Env) -> None:
    client = env.client()
    await client.refresh()
    env.repo.rotate_root(new_keys=3, threshold=2)
    env.repo.rotate_root(new_keys=2, threshold=2, rotate_online=True)
    await client.refresh(force=True)
    assert client.status()["roles"]["root"]["version"] == 3
    assert (await client.get_target(WHEEL)).path == WHEEL
    assert Metadata.from_bytes((env.dir / "root.json").read_bytes()).signed.version == 3


async def test_root_below_threshold_is_refused(env: Env) -> None:
    client = env.client()
    await client.refresh()
    env.repo.rotate_root(new_keys=2, threshold=2)
    doc = json.loads(env.meta("2.root.json"))
    new_keyids = set(doc["signed"]["roles"]["root"]["keyids"])
    # Keep the old root's signature, drop one of the two new ones: 1/2 for the new root.
    dropped = next(s for s in doc["signatures"] if s["keyid"] in new_keyids)
    doc["signatures"].remove(dropped)
    env.up.replace(r"/metadata/2\.root\.json", json.dumps(doc).encode())
    await assert_refused(env, client, BadSignature, role="root")


async def test_unsigned_timestamp_is_refused(env: Env, tmp_path: Path) -> None:
    client = env.client()
    await client.refresh()
    env.publish(tmp_path)
    doc = json.loads(env.meta("timestamp.json"))
    doc["signatures"] = []
    env.up.replace(r"/metadata/timestamp\.json", json.dumps(doc).encode())
    await assert_refused(env, client, BadSignature, role="timestamp")


async def test_fast_forward_recovery_after_online_key_rotation(env: Env) -> None:
    client = env.client()
    await client.refresh()
    # A thief of the online key pushes the timestamp version far ahead...
    env.up.replace(r"/metadata/timestamp\.json", signed_timestamp(env.repo, version_bump=1000))
    await client.refresh(force=True)
    assert client.status()["roles"]["timestamp"]["version"] > 1000
    # ...so the honest next timestamp looks like a rollback,
    env.up.clear()
    env.repo.refresh(force=True)
    await assert_refused(env, client, Rollback, role="timestamp")
    # until the repository rotates the online key: the old timestamp is then discarded.
    env.repo.rotate_root(rotate_online=True)
    await client.refresh(force=True)
    assert client.status()["roles"]["timestamp"]["version"] == env.version("timestamp") < 1000
    assert (await client.get_target(WHEEL)).path == WHEEL


# -- refresh policy, single flight, mirrors ---------------------------------------------------


async def test_single_flight_refresh_and_bin_load(env: Env) -> None:
    import asyncio

    client = env.client()
    results = await asyncio.gather(*(client.get_target(WHEEL) for _ in range(50)))
    assert {r.path for r in results} == {WHEEL}
    assert env.up.count(r"/metadata/timestamp\.json") == 1
    assert env.up.count(rf"/metadata/\d+\.{bin_of(env, WHEEL)}\.json") == 1
    await client.get_target(WHEEL)  # within refresh_interval: no upstream request at all
    assert env.up.count(r"/metadata/timestamp\.json") == 1


@pytest.mark.slow
async def test_refresh_sees_new_publications(env: Env, tmp_path: Path) -> None:
    client = env.client(refresh_interval=0.0)
    with pytest.raises(UnknownTarget):
        await client.get_target("packages/extra/extra-1.0-py3-none-any.whl")
    target = env.publish(tmp_path)
    assert (await client.get_target(target)).path == target
    await client.refresh()  # lookups refresh in the background: let that cycle end first
    # Unchanged timestamp: only root probe and timestamp fetched, the snapshot is kept.
    before = len(env.up.requests)
    await client.refresh(force=True)
    assert [p.rsplit("/", 1)[1] for p in env.up.requests[before:]] == ["2.root.json", "timestamp.json"]


async def test_failed_refresh_keeps_serving_the_previous_state(env: Env, tmp_path: Path) -> None:
    client = env.client(refresh_interval=0.0)
    await client.get_target(WHEEL)
    env.publish(tmp_path)
    env.up.status(r"/metadata/.*", 503)
    with pytest.raises(UpstreamUnreachable):
        await client.refresh(force=True)
    assert (await client.get_target(WHEEL)).path == WHEEL
    assert client.status()["last_error"] == "upstream-unreachable"


async def test_mirrors_in_order(env: Env, sample_repo: SampleRepo, tmp_path: Path) -> None:
    with Upstream(sample_repo.repo.public_dir) as second:
        liar_meta = f"{env.up.url}metadata/"
        env.up.replace(r"/metadata/timestamp\.json", tampered(env.meta("timestamp.json"), lambda s: s.update(version=99)))
        dead = f"http://127.0.0.1:{free_port()}/"  # nothing listens
        mirrors = [Mirror(f"{dead}metadata/", dead), Mirror(liar_meta, env.up.url), Mirror(f"{second.url}metadata/", second.url)]
        TrustedClient.initialize(tmp_path / "mirrored", sample_repo.root_bytes)
        client = TrustedClient(tmp_path / "mirrored", mirrors, env.fetcher)
        try:
            target = await client.get_target(WHEEL)
            assert client.status()["roles"]["timestamp"]["version"] == env.version("timestamp")
            assert second.count(r"/metadata/timestamp\.json") == 1
            assert [u.split("/")[2] for u in client.target_urls(target)] == [
                dead.split("/")[2],
                env.up.url.split("/")[2],
                second.url.split("/")[2],
            ]
            # Every mirror lying: the verification error, not "unreachable".
            second.replace(r"/metadata/timestamp\.json", env.meta("timestamp.json")[:-5])
            env.publish(tmp_path)
            with pytest.raises(BadSignature):
                await client.refresh(force=True)
        finally:
            client.close()


@pytest.mark.slow
async def test_lru_is_bounded(env: Env) -> None:
    client = env.client(bin_cache_size=3)
    for path in all_targets(env.repo):
        await client.get_target(path)
    assert client.status()["cached_roles"] == 3


@pytest.mark.slow
async def test_unchanged_bins_are_reused_across_cycles(env: Env, tmp_path: Path) -> None:
    client = env.client(refresh_interval=0.0)
    before = {path: (info["bin"], env.version(info["bin"])) for path, info in all_targets(env.repo).items()}
    for path in before:
        await client.get_target(path)
    # Those lookups may have started a background cycle; a forced refresh joins one in flight, so it
    # must end before the publication or the refresh below could be that older cycle.
    await client.refresh(force=True)
    env.publish(tmp_path)
    unchanged = [p for p, (name, version) in before.items() if env.version(name) == version]
    changed = [p for p, (name, version) in before.items() if env.version(name) != version]
    assert unchanged and changed
    await client.refresh(force=True)  # the new cycle, in the foreground (lookups would run it in the background)
    fetched = len(env.up.requests)
    for path in unchanged + changed:
        await client.get_target(path)
    refetched = {p.rsplit(".", 2)[1] for p in env.up.requests[fetched:] if ".bin-" in p}
    assert refetched == {before[p][0] for p in changed}


async def test_metadata_dir_is_locked_against_a_second_process(env: Env) -> None:
    from proxy.trust.metadir import MetadataDirLocked

    env.client()
    with pytest.raises(MetadataDirLocked):
        TrustedClient(env.dir, [env.mirror], env.fetcher)


async def test_a_role_verified_before_a_failure_is_kept_and_protects_after_restart(env: Env, tmp_path: Path) -> None:
    """Spec 5.4.5: the new timestamp is trusted as soon as it verifies, even if the snapshot never comes."""
    old = env.meta("timestamp.json")
    await env.client().refresh()
    env.publish(tmp_path)
    env.up.status(rf"/metadata/{env.version('snapshot')}\.snapshot\.json", 404)
    with pytest.raises(UpstreamUnreachable):
        await env.client().refresh(force=True)
    kept = Metadata.from_bytes((env.dir / "timestamp.json").read_bytes()).signed.version
    assert kept == env.version("timestamp")
    restarted = env.client()
    env.up.clear()
    env.up.replace(r"/metadata/timestamp\.json", old)
    await assert_refused(env, restarted, Rollback, role="timestamp", expected=kept)


async def test_every_trusted_root_is_kept_by_version(env: Env) -> None:
    env.repo.rotate_root()
    env.repo.rotate_root()
    await env.client().refresh()
    assert sorted(p.name for p in (env.dir / "roots").iterdir()) == ["1.root.json", "2.root.json", "3.root.json"]
    assert (env.dir / "roots" / "3.root.json").read_bytes() == (env.dir / "root.json").read_bytes()
    assert not list(env.dir.glob("*.root.json"))  # the top level holds one file per role
