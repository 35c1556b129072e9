"""The pure core: delegated-role verification, delegation lookup, graph walks.

No network except the one end-to-end test of classic ``path_hash_prefixes``
bins, which builds its own small repository with tuf's metadata API.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import (
    DelegatedRole,
    Delegations,
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    SuccinctRoles,
    TargetFile,
    Targets,
    Timestamp,
)

from proxy.protocol.tufset import TopLevelSet, Verified
from proxy.protocol.verify import DelegationIndex, VerifiedRole, verify_delegated, walk
from proxy.transport.upstream import AiohttpFetcher
from proxy.trust import (
    BadMetadata,
    BadSignature,
    ExpiredMetadata,
    HashMismatch,
    LengthMismatch,
    Mirror,
    Rollback,
    TrustedClient,
    TrustError,
    UnknownTarget,
    VersionMismatch,
)
from tests.support.sigchecks import count_signature_checks
from tests.support.upstream import Upstream

NOW = datetime.now(UTC).replace(microsecond=0)
KEY = CryptoSigner.generate_ed25519()
OTHER = CryptoSigner.generate_ed25519()
paths = st.text(alphabet="abcdefghij/._-0123456789", min_size=1, max_size=40)


def signed_bytes(signed, *signers: CryptoSigner) -> bytes:
    md = Metadata(signed)
    for s in signers:
        md.sign(s, append=True)
    return md.to_bytes()


def delegator_of(role: str, key: CryptoSigner = KEY, succinct: bool = False) -> Targets:
    if succinct:
        delegations = Delegations({key.public_key.keyid: key.public_key},
                                  succinct_roles=SuccinctRoles([key.public_key.keyid], 1, 4, "bin"))
    else:
        delegations = Delegations(
            {key.public_key.keyid: key.public_key},
            roles={role: DelegatedRole(role, [key.public_key.keyid], 1, False, paths=["*"])},
        )
    return Targets(expires=NOW + timedelta(days=1), delegations=delegations)


def a_bin(version: int = 3, expires: timedelta = timedelta(hours=1)) -> Targets:
    t = Targets(version=version, expires=NOW + expires)
    t.targets["x/y.whl"] = TargetFile.from_data("x/y.whl", b"payload")
    return t


# -- verify_delegated ------------------------------------------------------------------------


def test_verify_delegated_accepts_the_good_bin() -> None:
    data = signed_bytes(a_bin(), KEY)
    role = verify_delegated(data, "bin-3", delegator_of("bin-3"), MetaFile(3), NOW)
    assert role.signed.targets["x/y.whl"].length == 7
    assert role.fingerprint == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("data", "meta", "error"),
    [
        (signed_bytes(a_bin(), OTHER), MetaFile(3), BadSignature),
        (signed_bytes(a_bin()), MetaFile(3), BadSignature),
        (signed_bytes(a_bin(version=2), KEY), MetaFile(3), Rollback),
        (signed_bytes(a_bin(version=4), KEY), MetaFile(3), VersionMismatch),
        (signed_bytes(a_bin(expires=-timedelta(seconds=1)), KEY), MetaFile(3), ExpiredMetadata),
        (signed_bytes(a_bin(), KEY), MetaFile(3, length=5), LengthMismatch),
        (signed_bytes(a_bin(), KEY), MetaFile(3, hashes={"sha256": "0" * 64}), HashMismatch),
        (b"not json", MetaFile(3), BadMetadata),
        (signed_bytes(Snapshot(version=3, expires=NOW + timedelta(hours=1)), KEY), MetaFile(3), BadMetadata),
        (signed_bytes(a_bin(), KEY), None, BadMetadata),
    ],
)
def test_verify_delegated_refusals(data: bytes, meta: MetaFile | None, error: type[TrustError]) -> None:
    with pytest.raises(error) as info:
        verify_delegated(data, "bin-3", delegator_of("bin-3"), meta, NOW)
    assert info.value.role == "bin-3"


def test_a_role_the_delegator_does_not_delegate_is_refused() -> None:
    with pytest.raises(BadMetadata):
        verify_delegated(signed_bytes(a_bin(), KEY), "other", delegator_of("bin-3"), MetaFile(3), NOW)


GOOD_BIN = signed_bytes(a_bin(), KEY)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_bin_bytes_never_verify_as_something_else(data: st.DataObject) -> None:
    mutated = bytearray(GOOD_BIN)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(mutated) - 1))
        mutated[i] = data.draw(st.integers(0, 255))
    try:
        role = verify_delegated(bytes(mutated), "bin-3", delegator_of("bin-3"), MetaFile(3), NOW)
    except TrustError:
        return
    # Only a mutation that leaves the signed content as it was may pass (e.g. hex case in "sig").
    assert role.signed.to_dict() == Metadata.from_bytes(GOOD_BIN).signed.to_dict()


def _root_and_timestamp() -> tuple[bytes, Root, bytes]:
    root = Root(expires=NOW + timedelta(days=1))
    for r in ("root", "timestamp", "snapshot", "targets"):
        root.add_key(KEY.public_key, r)
    ts = Timestamp(version=2, expires=NOW + timedelta(hours=1), snapshot_meta=MetaFile(1))
    return signed_bytes(root, KEY), root, signed_bytes(ts, KEY)


ROOT_BYTES, _, GOOD_TIMESTAMP = _root_and_timestamp()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_timestamp_bytes_never_verify_as_something_else(data: st.DataObject) -> None:
    mutated = bytearray(GOOD_TIMESTAMP)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(mutated) - 1))
        mutated[i] = data.draw(st.integers(0, 255))
    top = TopLevelSet(ROOT_BYTES, NOW)
    try:
        ts = top.update_timestamp(bytes(mutated))
    except TrustError:
        return
    assert ts is not None
    assert ts.to_dict() == Metadata.from_bytes(GOOD_TIMESTAMP).signed.to_dict()


# -- Verified: a cycle takes back its own verified bytes -------------------------------------


def _top_level(snapshot_version: int, targets_version: int, key: CryptoSigner = KEY) -> tuple[bytes, bytes, bytes]:
    """(timestamp, snapshot, targets) bytes: timestamp and snapshot at ``snapshot_version``."""
    targets = signed_bytes(Targets(version=targets_version, expires=NOW + timedelta(hours=1)), key)
    snapshot = signed_bytes(Snapshot(version=snapshot_version, expires=NOW + timedelta(hours=1),
                                     meta={"targets.json": MetaFile(targets_version)}), key)
    ts = signed_bytes(Timestamp(version=snapshot_version, expires=NOW + timedelta(hours=1),
                                snapshot_meta=MetaFile(snapshot_version)), key)
    return ts, snapshot, targets


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The roles python-tuf checks a signature threshold for, in order."""
    return count_signature_checks(monkeypatch)


def _first_cycle(memo: Verified) -> tuple[bytes, bytes, bytes]:
    ts, snapshot, targets = _top_level(1, 1)
    top = TopLevelSet(ROOT_BYTES, NOW, memo)
    top.update_timestamp(ts)
    top.update_snapshot(snapshot)
    top.update_targets(targets)
    return ts, snapshot, targets


def test_local_bytes_verified_before_are_not_checked_again(checked: list[str]) -> None:
    memo = Verified()
    ts, snapshot, targets = _first_cycle(memo)
    new_ts, new_snapshot, _ = _top_level(2, 1)
    top = TopLevelSet(ROOT_BYTES, NOW, memo)
    checked.clear()
    assert top.load_local_timestamp(ts)
    assert top.update_timestamp(new_ts) is not None
    top.load_local_snapshot(snapshot)  # the intermediate one: loaded, then refused as not final
    assert top.has("snapshot") and top.snapshot.version == 1
    assert checked == ["timestamp"]  # the new timestamp only
    top.update_snapshot(new_snapshot)
    assert top.load_local_targets(targets)  # still listed at v1: the set's own checks accept it
    assert checked == ["timestamp", "snapshot"]
    assert memo.reused == 3


def test_taken_back_bytes_still_guard_against_rollback(checked: list[str]) -> None:
    memo = Verified()
    ts, snapshot, _ = _top_level(2, 5)
    top = TopLevelSet(ROOT_BYTES, NOW, memo)
    top.update_timestamp(ts)
    top.update_snapshot(snapshot)
    new_ts, rolled_back, _ = _top_level(3, 4)  # a newer snapshot listing an older targets
    top = TopLevelSet(ROOT_BYTES, NOW, memo)
    assert top.load_local_timestamp(ts)
    top.update_timestamp(new_ts)
    top.load_local_snapshot(snapshot)
    assert memo.reused == 2
    with pytest.raises(Rollback):
        top.update_snapshot(rolled_back)


def test_other_bytes_or_another_root_are_checked(checked: list[str]) -> None:
    memo = Verified()
    ts, _, _ = _first_cycle(memo)
    forged = signed_bytes(Metadata.from_bytes(ts).signed, OTHER)  # the same content, a key root does not trust
    top = TopLevelSet(ROOT_BYTES, NOW, memo)
    checked.clear()
    assert not top.load_local_timestamp(forged)
    assert checked == ["timestamp"] and memo.reused == 0
    root = Metadata.from_bytes(ROOT_BYTES).signed
    root.version = 2
    other_root = signed_bytes(root, KEY)  # the same keys, but other root bytes: nothing is taken back
    top = TopLevelSet(ROOT_BYTES, NOW, memo)
    top.update_root(other_root)
    checked.clear()
    assert top.load_local_timestamp(ts)
    assert checked == ["timestamp"] and memo.reused == 0


# -- delegation lookup -----------------------------------------------------------------------


def _classic_bins(prefix_len: int, count: int) -> Targets:
    keyid = KEY.public_key.keyid
    roles = {}
    for i in range(count):
        prefix = f"{i:0{prefix_len}x}"
        roles[f"bin-{prefix}"] = DelegatedRole(f"bin-{prefix}", [keyid], 1, False, path_hash_prefixes=[prefix])
    # Overlapping and mixed-length prefixes, pattern roles and terminating ones, in between.
    roles["wide"] = DelegatedRole("wide", [keyid], 1, True, path_hash_prefixes=["a", "ab", "0"])
    roles["pattern"] = DelegatedRole("pattern", [keyid], 1, False, paths=["a*", "*/b.*"])
    return Targets(expires=NOW, delegations=Delegations({keyid: KEY.public_key}, roles=roles))


@settings(max_examples=200, deadline=None)
@given(paths)
def test_index_matches_tuf_for_path_hash_prefixes_and_patterns(path: str) -> None:
    for targets in (_classic_bins(2, 256), _classic_bins(1, 16)):
        assert DelegationIndex(targets).roles_for(path) == list(targets.delegations.get_roles_for_target(path))


@given(paths)
def test_index_matches_tuf_for_succinct_roles(path: str) -> None:
    targets = delegator_of("", succinct=True)
    index = DelegationIndex(targets)
    assert index.hashed
    assert index.roles_for(path) == list(targets.delegations.get_roles_for_target(path))


def _graph(edges: dict[str, list[tuple[str, list[str], bool]]], listed: dict[str, list[str]]) -> dict[str, VerifiedRole]:
    keyid = KEY.public_key.keyid
    roles = {}
    for name in set(edges) | set(listed) | {c for kids in edges.values() for c, _, _ in kids}:
        t = Targets(expires=NOW + timedelta(hours=1))
        for p in listed.get(name, []):
            t.targets[p] = TargetFile(1, {"sha256": "0" * 64}, p)
        if edges.get(name):
            t.delegations = Delegations({keyid: KEY.public_key}, roles={
                c: DelegatedRole(c, [keyid], 1, term, paths=pats) for c, pats, term in edges[name]})
        roles[name] = VerifiedRole.of(name, t, name.encode())
    return roles


def _run(path: str, roles: dict[str, VerifiedRole], max_delegations: int = 32):
    walker = walk(path, roles["targets"], max_delegations)
    asked = []
    try:
        request = next(walker)
        while True:
            asked.append((request.role, request.delegator.name))
            request = walker.send(roles[request.role])
    except StopIteration as stop:
        return stop.value, asked


def test_walk_is_preorder_depth_first() -> None:
    roles = _graph(
        {"targets": [("a", ["p/*"], False), ("b", ["p/*"], False)], "a": [("a1", ["p/*"], False)]},
        {"b": ["p/x"], "a1": ["p/x"]},
    )
    found, asked = _run("p/x", roles)
    assert (found.role, asked) == ("a1", [("a", "targets"), ("a1", "a")])
    assert [r.name for r in found.used] == ["targets", "a", "a1"]


def test_terminating_delegation_stops_backtracking() -> None:
    roles = _graph({"targets": [("a", ["p/*"], True), ("b", ["p/*"], False)]}, {"b": ["p/x"]})
    found, asked = _run("p/x", roles)
    assert found.target is None and asked == [("a", "targets")]


def test_walk_bounds_visited_roles_and_survives_cycles() -> None:
    chain = {f"r{i}": [(f"r{i + 1}", ["p/*"], False)] for i in range(50)}
    chain["targets"] = [("r0", ["p/*"], False)]
    chain["r50"] = [("r0", ["p/*"], False)]  # a cycle back
    found, asked = _run("p/x", _graph(chain, {"r49": ["p/x"]}), max_delegations=5)
    assert found.target is None and len(asked) == 5  # targets itself counts, as in tuf
    found, asked = _run("p/x", _graph(chain, {}), max_delegations=100)
    assert found.target is None and len(asked) == 51  # r0..r50 once each, then the cycle ends


# -- classic hash-prefix bins end to end -----------------------------------------------------


def _write_classic_repo(public: Path, files: dict[str, bytes]) -> bytes:
    """A consistent-snapshot repository delegating by path_hash_prefixes to 16 bins."""
    meta = public / "metadata"
    meta.mkdir(parents=True)
    keyid = KEY.public_key.keyid
    root = Root(expires=NOW + timedelta(days=1))
    for r in ("root", "timestamp", "snapshot", "targets"):
        root.add_key(KEY.public_key, r)
    roles = {f"bin-{i:x}": DelegatedRole(f"bin-{i:x}", [keyid], 1, False, path_hash_prefixes=[f"{i:x}"]) for i in range(16)}
    top = Targets(expires=NOW + timedelta(days=1), delegations=Delegations({keyid: KEY.public_key}, roles=roles))
    bins = {name: Targets(expires=NOW + timedelta(days=1)) for name in roles}
    for path, data in files.items():
        info = TargetFile.from_data(path, data)
        bin_name = next(r for r in roles.values() if r.is_delegated_path(path)).name
        bins[bin_name].targets[path] = info
        out = public / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_name(f"{info.hashes['sha256']}.{out.name}").write_bytes(data)
    snapshot = Snapshot(expires=NOW + timedelta(days=1))
    for name, signed in [("targets", top), *bins.items()]:
        (meta / f"1.{name}.json").write_bytes(signed_bytes(signed, KEY))
        snapshot.meta[f"{name}.json"] = MetaFile(1)
    (meta / "1.snapshot.json").write_bytes(signed_bytes(snapshot, KEY))
    ts = Timestamp(expires=NOW + timedelta(days=1), snapshot_meta=MetaFile(1))
    (meta / "timestamp.json").write_bytes(signed_bytes(ts, KEY))
    root_bytes = signed_bytes(root, KEY)
    (meta / "1.root.json").write_bytes(root_bytes)
    return root_bytes


@pytest.mark.slow
async def test_classic_path_hash_prefix_bins(tmp_path: Path) -> None:
    files = {f"packages/p{i}/p{i}-1.0.tar.gz": f"sdist {i}".encode() for i in range(20)}
    root = _write_classic_repo(tmp_path / "public", files)
    TrustedClient.initialize(tmp_path / "client", root)
    with Upstream(tmp_path / "public") as up:
        fetcher = AiohttpFetcher()
        client = TrustedClient(tmp_path / "client", [Mirror(f"{up.url}metadata/", up.url)], fetcher)
        try:
            for path, data in files.items():
                target = await client.get_target(path)
                assert target.role == "bin-" + hashlib.sha256(path.encode()).hexdigest()[0]
                served = await fetcher.fetch_bytes(client.target_urls(target)[0], target.length)
                target.verify(served)
                assert served == data
            missing = "packages/none/none-1.0.tar.gz"
            with pytest.raises(UnknownTarget):
                await client.get_target(missing)
            # Each bin a lookup needed was fetched once: the prefix map went straight to it.
            wanted = {hashlib.sha256(p.encode()).hexdigest()[0] for p in [*files, missing]}
            fetched = [p for p in up.requests if ".bin-" in p]
            assert sorted(fetched) == sorted(f"/metadata/1.bin-{b}.json" for b in wanted)
        finally:
            client.close()
            await fetcher.close()


def test_taking_the_metadata_dir_sweeps_temp_files_a_crash_left(tmp_path: Path) -> None:
    from proxy.trust.metadir import MetadataStore

    (tmp_path / "meta").mkdir()
    stale = tmp_path / "meta" / ".timestamp.json.k3j4.tmp"
    stale.write_bytes(b"half a timestamp")
    kept = tmp_path / "meta" / "timestamp.json"
    kept.write_bytes(b"{}")
    store = MetadataStore(tmp_path / "meta")
    store.lock()
    try:
        assert not stale.exists() and kept.exists()
    finally:
        store.unlock()
