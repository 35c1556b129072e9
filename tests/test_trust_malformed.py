"""Whatever bytes a repository sends for any role, only a typed refusal comes out.

Property tests over one small, consistent set of top-level metadata and a
delegated bin: arbitrary bytes, mutated bytes of the real document, and
correctly signed documents of another role's type (or unsigned, or of odd
structure) fed at every role.  Each must verify or raise a
:class:`~proxy.protocol.errors.RepositoryError`: never AttributeError and
friends, which used to kill the refresh untyped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from securesystemslib.formats import encode_canonical
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import DelegatedRole, Delegations, Metadata, MetaFile, Root, Snapshot, TargetFile, Targets, Timestamp

from proxy.protocol.errors import RepositoryError
from proxy.protocol.tufset import TopLevelSet
from proxy.protocol.verify import verify_delegated

NOW = datetime.now(UTC).replace(microsecond=0)
KEY = CryptoSigner.generate_ed25519()
LATER = NOW + timedelta(days=1)


def _sign(signed) -> bytes:
    md = Metadata(signed)
    md.sign(KEY)
    return md.to_bytes()


def _root() -> Root:
    root = Root(expires=LATER)
    for role in ("root", "timestamp", "snapshot", "targets"):
        root.add_key(KEY.public_key, role)
    return root


def _targets() -> Targets:
    targets = Targets(expires=LATER)
    targets.targets["a.whl"] = TargetFile.from_data("a.whl", b"a")
    targets.delegations = Delegations({KEY.public_key.keyid: KEY.public_key},
                                      roles={"bin-3": DelegatedRole("bin-3", [KEY.public_key.keyid], 1, False, paths=["*"])})
    return targets


DOCS = {
    "root": _sign(_root()),
    "root2": _sign(Root(version=2, expires=LATER, keys=_root().keys, roles=_root().roles)),
    "timestamp": _sign(Timestamp(version=2, expires=LATER, snapshot_meta=MetaFile(2))),
    "snapshot": _sign(Snapshot(version=2, expires=LATER, meta={"targets.json": MetaFile(1), "bin-3.json": MetaFile(1)})),
    "targets": _sign(_targets()),
    "bin": _sign(Targets(expires=LATER)),
}
OLD_SNAPSHOT = _sign(Snapshot(version=1, expires=LATER, meta={"targets.json": MetaFile(1), "bin-3.json": MetaFile(1)}))


def _feed(role: str) -> Callable[[bytes], object]:
    """The verification step of ``role``, with every role before it loaded as in a real cycle."""
    top = TopLevelSet(DOCS["root"], NOW)
    if role == "root":
        return top.update_root
    top.update_timestamp(DOCS["timestamp"])
    if role == "timestamp":
        return top.update_timestamp
    if role == "snapshot-after-local":
        assert not top.load_local_snapshot(OLD_SNAPSHOT)  # loaded, but not final: the rollback reference
        return top.update_snapshot
    if role == "snapshot":
        return top.update_snapshot
    top.update_snapshot(DOCS["snapshot"])
    if role == "targets":
        return top.update_targets
    top.update_targets(DOCS["targets"])
    return lambda data: verify_delegated(data, "bin-3", top.targets, top.snapshot.meta["bin-3.json"], NOW)


ROLES = ["root", "timestamp", "snapshot", "snapshot-after-local", "targets", "bin"]
REAL = {"root": "root2", "snapshot-after-local": "snapshot"}


def _only_typed_refusals(role: str, data: bytes) -> None:
    try:
        _feed(role)(data)
    except RepositoryError:
        pass


def _signed_json(signed: object, sign: bool) -> bytes:
    """An envelope around any JSON, signed (over its canonical form) by the repository's own key."""
    signatures = []
    if sign:
        signature = KEY.sign(encode_canonical(signed).encode())
        signatures = [{"keyid": signature.keyid, "sig": signature.signature}]
    return json.dumps({"signed": signed, "signatures": signatures}).encode()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("role", ROLES)
@SETTINGS
@given(data=st.binary(max_size=2048))
def test_arbitrary_bytes(role: str, data: bytes) -> None:
    _only_typed_refusals(role, data)


@pytest.mark.parametrize("role", ROLES)
@SETTINGS
@given(draw=st.data())
def test_mutated_bytes_of_the_real_document(role: str, draw: st.DataObject) -> None:
    mutated = bytearray(DOCS[REAL.get(role, role)])
    for _ in range(draw.draw(st.integers(1, 6))):
        i = draw.draw(st.integers(0, len(mutated) - 1))
        mutated[i] = draw.draw(st.integers(0, 255))
    _only_typed_refusals(role, bytes(mutated))


@pytest.mark.parametrize("role", ROLES)
@SETTINGS
@given(draw=st.data())
def test_signed_documents_of_another_type_or_odd_structure(role: str, draw: st.DataObject) -> None:
    """Correctly signed, so they get past the signature: the type-confusion and field-level cases."""
    signed = dict(json.loads(DOCS[draw.draw(st.sampled_from(sorted(DOCS)))])["signed"])
    if draw.draw(st.booleans()):
        field = draw.draw(st.sampled_from(sorted(signed)))
        if draw.draw(st.booleans()):
            del signed[field]
        else:
            signed[field] = draw.draw(json_values)
    _only_typed_refusals(role, _signed_json(signed, sign=draw.draw(st.booleans())))


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("served", sorted(DOCS))
def test_every_real_document_served_as_every_role(role: str, served: str) -> None:
    """The finding, exactly: e.g. the current timestamp served as N.snapshot.json (was AttributeError)."""
    _only_typed_refusals(role, DOCS[served])


@pytest.mark.parametrize("role", ["timestamp", "snapshot", "targets"])
@SETTINGS
@given(data=st.binary(max_size=512))
def test_local_files_never_raise(role: str, data: bytes) -> None:
    """A corrupt file in the metadata dir (bit rot, a writable volume) is just not used."""
    top = TopLevelSet(DOCS["root"], NOW)
    if role != "timestamp":
        top.update_timestamp(DOCS["timestamp"])
    if role == "targets":
        top.update_snapshot(DOCS["snapshot"])
    load = {"timestamp": top.load_local_timestamp, "snapshot": top.load_local_snapshot,
            "targets": top.load_local_targets}[role]
    assert load(data) in (True, False)
