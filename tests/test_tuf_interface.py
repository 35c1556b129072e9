"""Fails loudly when the python-tuf internals that proxy.protocol.tufset drives change.

``TrustedMetadataSet`` is internal API; tuf is pinned to one minor version
and this test pins the exact surface and behaviour we depend on, so a tuf
upgrade breaks here, with a clear message, rather than in an attack test.
"""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta

import pytest
import tuf
from securesystemslib.signer import CryptoSigner
from tuf.api import exceptions as tuf_exc
from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, Targets, Timestamp
from tuf.ngclient._internal.trusted_metadata_set import TrustedMetadataSet
from tuf.ngclient.config import EnvelopeType


def test_tuf_minor_version_is_the_one_we_pinned() -> None:
    major, minor, patch = (int(part) for part in tuf.__version__.split(".")[:3])
    assert (major, minor) == (7, 0) and patch >= 1, f"tuf {tuf.__version__}: re-check proxy/protocol/tufset.py"


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("__init__", ["self", "root_data", "envelope_type"]),
        ("update_root", ["self", "data"]),
        ("update_timestamp", ["self", "data"]),
        ("update_snapshot", ["self", "data", "trusted"]),
        ("update_targets", ["self", "data"]),
        ("update_delegated_targets", ["self", "data", "role_name", "delegator_name"]),
    ],
)
def test_trusted_metadata_set_signatures(method: str, params: list[str]) -> None:
    assert list(inspect.signature(getattr(TrustedMetadataSet, method)).parameters) == params


def test_trusted_metadata_set_properties_and_mapping() -> None:
    for prop in ("root", "timestamp", "snapshot", "targets"):
        assert isinstance(inspect.getattr_static(TrustedMetadataSet, prop), property)
    assert hasattr(TrustedMetadataSet, "get") and hasattr(TrustedMetadataSet, "__contains__")


def _sign(signed, signer: CryptoSigner) -> bytes:
    md = Metadata(signed)
    md.sign(signer)
    return md.to_bytes()


def test_behaviour_we_rely_on() -> None:
    """reference_time is assignable; intermediate roles load then raise; equal versions raise."""
    key = CryptoSigner.generate_ed25519()
    now = datetime.now(UTC).replace(microsecond=0)
    root = Root(expires=now + timedelta(days=1))
    for role in ("root", "timestamp", "snapshot", "targets"):
        root.add_key(key.public_key, role)
    ts = TrustedMetadataSet(_sign(root, key), EnvelopeType.METADATA)
    assert isinstance(ts.reference_time, datetime)  # we overwrite it with our clock

    # An expired timestamp is loaded as intermediate (rollback protection) and raises.
    ts2 = TrustedMetadataSet(_sign(root, key), EnvelopeType.METADATA)
    ts2.reference_time = now
    stale = _sign(Timestamp(version=2, expires=now - timedelta(seconds=1), snapshot_meta=MetaFile(1)), key)
    with pytest.raises(tuf_exc.ExpiredMetadataError):
        ts2.update_timestamp(stale)
    assert ts2.timestamp.version == 2
    fresh = _sign(Timestamp(version=2, expires=now + timedelta(hours=1), snapshot_meta=MetaFile(1)), key)
    with pytest.raises(tuf_exc.EqualVersionNumberError):
        ts2.update_timestamp(fresh)
    older = _sign(Timestamp(version=1, expires=now + timedelta(hours=1), snapshot_meta=MetaFile(1)), key)
    with pytest.raises(tuf_exc.BadVersionNumberError):
        ts2.update_timestamp(older)

    ts3 = TrustedMetadataSet(_sign(root, key), EnvelopeType.METADATA)
    ts3.reference_time = now
    ts3.update_timestamp(fresh)
    snapshot = Snapshot(version=1, expires=now + timedelta(hours=1), meta={"targets.json": MetaFile(1)})
    ts3.update_snapshot(_sign(snapshot, key), trusted=True)
    targets = ts3.update_targets(_sign(Targets(version=1, expires=now + timedelta(hours=1)), key))
    assert ts3.targets is targets and "targets" in ts3
    # Unsigned data raises UnsignedMetadataError (mapped to BadSignature).
    other = CryptoSigner.generate_ed25519()
    ts4 = TrustedMetadataSet(_sign(root, key), EnvelopeType.METADATA)
    with pytest.raises(tuf_exc.UnsignedMetadataError):
        ts4.update_timestamp(_sign(Timestamp(version=2, expires=now + timedelta(hours=1), snapshot_meta=MetaFile(1)), other))


def test_the_loader_tufset_remembers_is_an_instance_attribute_with_this_signature() -> None:
    """proxy.protocol.tufset.Verified wraps the set's ``_load_data`` (parse, type check, signature threshold)."""
    from tuf.ngclient._internal import trusted_metadata_set as tms

    source = inspect.getsource(TrustedMetadataSet.__init__)
    assert "self._load_data = _load_from_metadata" in source
    assert list(inspect.signature(tms._load_from_metadata).parameters) == ["role", "data", "delegator", "role_name"]
    for method in ("update_timestamp", "update_snapshot", "update_delegated_targets"):
        assert "self._load_data(" in inspect.getsource(getattr(TrustedMetadataSet, method))
