"""Refresh on demand: ``TrustedClient.refresh_until`` against a real repository over HTTP.

The gateway calls it when it knows a newer timestamp was published; it must
see that version through (even past a cycle that began before the
publication), give up with MetadataPending after the timeout, and pass a
verification refusal on unchanged.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from tuf.api.metadata import Metadata

from proxy.protocol.errors import MetadataPending
from proxy.trust import BadSignature
from tests.support.poll import poll
from tests.support.sigchecks import count_signature_checks
from tests.support.trustenv import Env, env, tampered
from tests.support.upstream import Reply

TS = r"/metadata/timestamp\.json"


async def test_refresh_until_sees_a_new_publication(env: Env, tmp_path: Path) -> None:
    client = env.client()
    await client.refresh(force=True)
    before = client.timestamp_version
    assert before == env.version("timestamp")
    target = env.publish(tmp_path)
    wanted = env.version("timestamp")
    assert wanted > before
    await client.refresh_until(wanted, timeout=10)
    assert client.timestamp_version == wanted
    assert (await client.get_target(target)).path == target
    fetched = env.up.count(TS)
    await client.refresh_until(wanted, timeout=10)  # already there: no cycle at all
    assert env.up.count(TS) == fetched


async def test_a_cycle_checks_the_signatures_of_new_metadata_only(
        env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The previous snapshot is still loaded first (rollback), but not parsed and signature-checked again."""
    client = env.client()
    await client.refresh(force=True)
    checked = count_signature_checks(monkeypatch)
    target = env.publish(tmp_path)
    await client.refresh_until(env.version("timestamp"), timeout=10)
    # The trusted root verifies itself as each cycle begins; then the new timestamp and snapshot (targets did not move).
    assert sorted(checked) == ["root", "snapshot", "timestamp"]
    assert (await client.get_target(target)).path == target


async def test_a_cycle_that_predates_the_publication_is_joined_then_another_runs(env: Env, tmp_path: Path) -> None:
    client = env.client()
    await client.refresh(force=True)
    arrived, release = threading.Event(), threading.Event()

    def held(original: bytes | None) -> Reply:
        # The tree's bytes were read before this runs: the pre-publication timestamp.
        arrived.set()
        release.wait(10)
        return Reply(200, original or b"")

    env.up.override(TS, held)
    old = asyncio.create_task(client.refresh(force=True))
    assert await asyncio.to_thread(arrived.wait, 10)
    env.up.clear()
    env.publish(tmp_path)
    wanted = env.version("timestamp")
    until = asyncio.create_task(client.refresh_until(wanted, timeout=10))
    await asyncio.sleep(0)  # let it join the held cycle
    release.set()
    await old
    await until
    assert client.timestamp_version == wanted
    assert env.up.count(TS) == 3  # the first refresh, the held one, and one more


@pytest.mark.slow
async def test_refresh_until_gives_up_with_metadata_pending(env: Env) -> None:
    client = env.client()
    await client.refresh(force=True)
    never = env.version("timestamp") + 1
    started = time.monotonic()
    with pytest.raises(MetadataPending) as info:
        await client.refresh_until(never, timeout=0.5)
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 3.0
    assert info.value.retry_after >= 1
    assert info.value.reason == "metadata-pending"
    # It kept asking (bounded backoff), not once and not in a tight loop.
    assert 2 <= env.up.count(TS) <= 20


@pytest.mark.slow
async def test_refresh_until_gives_up_while_the_mirror_stalls(env: Env, tmp_path: Path) -> None:
    client = env.client()
    await client.refresh(force=True)
    release = threading.Event()
    env.up.override(TS, lambda original: (release.wait(10), Reply(200, original or b""))[1])
    env.publish(tmp_path)
    try:
        with pytest.raises(MetadataPending):
            await asyncio.wait_for(client.refresh_until(env.version("timestamp"), timeout=0.5), 5)
    finally:
        release.set()


async def test_refresh_until_reraises_a_refusal(env: Env, tmp_path: Path) -> None:
    client = env.client()
    await client.refresh(force=True)
    env.publish(tmp_path)
    wanted = env.version("timestamp")
    env.up.replace(TS, tampered(env.meta("timestamp.json"), lambda s: s.update(version=wanted + 5)))
    with pytest.raises(BadSignature):
        await client.refresh_until(wanted, timeout=10)


# -- miss-wait: an unknown target waits for the refresh in flight, but only so long ------------


@pytest.mark.slow
async def test_a_miss_waits_at_most_miss_wait_and_hits_never_wait(env: Env, tmp_path: Path) -> None:
    from proxy.trust import UnknownTarget

    client = env.client(refresh_interval=0.01, miss_wait=0.5)
    known = "packages/lib/lib-1.1-py3-none-any.whl"
    await client.get_target(known)
    fresh = env.publish(tmp_path)
    arrived, release = threading.Event(), threading.Event()

    def stalled(original: bytes | None) -> Reply:
        arrived.set()
        release.wait(30)
        return Reply(200, original or b"")

    env.up.override(TS, stalled)
    try:
        await poll(client._due, "a refresh due", timeout=10, interval=0.01)
        started = time.monotonic()
        assert (await client.get_target(known)).path == known  # a hit: starts the cycle, waits for nothing
        assert time.monotonic() - started < 0.4
        assert await asyncio.to_thread(arrived.wait, 10)
        started = time.monotonic()
        with pytest.raises(MetadataPending) as info:
            await client.get_target(fresh)
        assert 0.5 <= time.monotonic() - started < 2.0
        assert info.value.target == fresh and info.value.retry_after >= 1
    finally:
        release.set()
    env.up.clear()
    # The cycle ends: the new target is found; one absent from fresh metadata is UnknownTarget.
    await client.refresh()
    assert (await client.get_target(fresh)).path == fresh
    with pytest.raises(UnknownTarget):
        await client.get_target("packages/absent/absent-1.0-py3-none-any.whl")


async def test_a_cycle_renames_each_role_once_on_disk_in_order_and_before_its_state_is_served_or_a_refusal(
        env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each role is persisted as it verifies (spec 5.4.5, 5.5.7): written beside its name, fsynced while the cycle
    goes on, renamed only once on disk and after the role before it; the directory is fsynced once, before the new
    state answers lookups, and before a refusal of a later role is raised (the timestamp that verified keeps
    guarding against rollback after a restart)."""
    from proxy.util import atomic

    client = env.client()
    await client.refresh(force=True)
    events: list[str] = []
    real_fsync, real_dir, real_replace = atomic._fsync, atomic.fsync_dir, atomic.os.replace

    def ours(path: object) -> bool:
        return Path(str(path)).parent == env.dir or Path(str(path)) == env.dir

    def fsync(path: Path, *args: int) -> None:
        if Path(path).parent == env.dir:  # a role's temp file (the directory's own fsync is fsync_dir's event)
            events.append(f"fsync {Path(path).name.split('.')[1]}")
        real_fsync(path, *args)

    def fsync_dir(directory: Path) -> None:
        if ours(directory):
            events.append(f"fsync dir, serving {client.timestamp_version}")
        real_dir(directory)

    def replace(tmp: object, path: object) -> None:
        if ours(path):
            events.append(f"rename {Path(str(path)).name}")
        real_replace(tmp, path)  # type: ignore[arg-type]

    monkeypatch.setattr(atomic, "_fsync", fsync)
    monkeypatch.setattr(atomic, "fsync_dir", fsync_dir)
    monkeypatch.setattr(atomic.os, "replace", replace)
    before = client.timestamp_version
    env.publish(tmp_path)
    await client.refresh_until(env.version("timestamp"), timeout=10)
    assert events.index("fsync timestamp") < events.index("rename timestamp.json")
    assert events.index("fsync snapshot") < events.index("rename snapshot.json")
    assert events.index("rename timestamp.json") < events.index("rename snapshot.json")
    assert events[-1] == f"fsync dir, serving {before}"  # the old state still served
    assert sum(e.startswith("fsync dir") for e in events) == 1
    assert client.timestamp_version == env.version("timestamp") != before

    events.clear()
    env.publish(tmp_path, "another")
    snapshot = env.version("snapshot")
    env.up.replace(rf"/metadata/{snapshot}\.snapshot\.json",
                   tampered(env.meta(f"{snapshot}.snapshot.json"), lambda s: s.update(expires="2099-01-01T00:00:00Z")))
    with pytest.raises(BadSignature):
        await client.refresh_until(env.version("timestamp"), timeout=10)
    assert events == ["fsync timestamp", "rename timestamp.json", f"fsync dir, serving {client.timestamp_version}"]
    assert Metadata.from_bytes((env.dir / "timestamp.json").read_bytes()).signed.version == env.version("timestamp")


async def test_a_role_whose_fsync_fails_is_not_renamed_and_the_cycle_fails(
        env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that fails the timestamp's fsync: no torn or unsynced file takes the trusted name, no state is served
    from it, and the next cycle (the disk well again) persists it."""
    from proxy.protocol.errors import RefreshFailed
    from proxy.util import atomic

    client = env.client()
    await client.refresh(force=True)
    before, kept = client.timestamp_version, (env.dir / "timestamp.json").read_bytes()
    real = atomic._fsync

    def failing(path: Path, *args: int) -> None:
        if Path(path).parent == env.dir:
            raise OSError(5, "Input/output error")
        real(path, *args)

    monkeypatch.setattr(atomic, "_fsync", failing)
    env.publish(tmp_path)
    with pytest.raises(RefreshFailed):
        await client.refresh(force=True)
    assert client.timestamp_version == before and (env.dir / "timestamp.json").read_bytes() == kept
    assert not list(env.dir.glob(".*.tmp"))
    monkeypatch.setattr(atomic, "_fsync", real)
    await client.refresh(force=True)
    assert client.timestamp_version == env.version("timestamp")
    assert (env.dir / "timestamp.json").read_bytes() == env.meta("timestamp.json")
