"""The one error model: every error class of ``proxy`` says whose fault it is, and the one table answers it.

The table (:mod:`proxy.protocol.refusals`) is what the edge and the gateway
both answer from; these tests pin its rows by whose fault each refusal is,
and walk every module so that a new error class without a fault fails here
rather than turning into an "internal error" in production.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from proxy.gateway.listing import IndexUnreachable, PageRefused
from proxy.gateway.service import NotListed
from proxy.protocol import refusals
from proxy.protocol.errors import (
    BadPath,
    BadSignature,
    Busy,
    CommandError,
    ExpiredMetadata,
    Fault,
    MetadataPending,
    NotAcceptable,
    NotInitialized,
    RefreshFailed,
    Rollback,
    StoreError,
    StoreFull,
    UnknownTarget,
    UpstreamUnreachable,
)
from proxy.protocol.hashing import UnsupportedHashes
from proxy.storage.audit import AuditWriteError
from proxy.transport.bucket import BucketUnavailable
from proxy.trust.fetch import MissingUpstream
from proxy.trust.metadir import MetadataDirLocked
from proxy.trust.pagefiles import ForeignLink

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))
import gen_ref

ERRORS = list(gen_ref.error_classes())


def test_the_walk_finds_the_error_classes() -> None:
    assert len(ERRORS) > 40 and ForeignLink in ERRORS and CommandError in ERRORS


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_error_class_has_a_fault_a_reason_and_a_row(cls: type[BaseException]) -> None:
    assert isinstance(getattr(cls, "fault", None), Fault), f"{cls.__qualname__} says no fault"
    assert isinstance(getattr(cls, "reason", None), str) and cls.reason, f"{cls.__qualname__} has no reason slug"
    assert refusals.row(cls.__new__(cls)) is not refusals.UNEXPECTED


def _answer(error: BaseException) -> tuple[int, str]:
    r = refusals.row(error)
    return r.status, r.kind


@pytest.mark.parametrize(("error_type", "status", "kind"), [
    (UnknownTarget, 404, "not-found"), (MissingUpstream, 404, "not-found"), (NotListed, 404, "not-found"),
    (BadSignature, 502, "repository"), (Rollback, 502, "repository"), (UnsupportedHashes, 502, "repository"),
    (ExpiredMetadata, 503, "repository"),
    (UpstreamUnreachable, 502, "upstream"), (MetadataPending, 503, "upstream"), (NotInitialized, 503, "upstream"),
    (StoreFull, 503, "ours"), (Busy, 503, "ours"), (BucketUnavailable, 503, "ours"), (StoreError, 500, "ours"),
    (AuditWriteError, 500, "ours"),
    # Blamed on the repository or the upstream before the one error model; ours or the operator's.
    (RefreshFailed, 503, "ours"), (MetadataDirLocked, 503, "ours"), (ForeignLink, 502, "operator"),
    (BadPath, 404, "client"), (NotAcceptable, 406, "client"),
])
def test_the_table_types_every_refusal_by_whose_fault(error_type: type[BaseException], status: int,
                                                      kind: str) -> None:
    assert _answer(error_type.__new__(error_type)) == (status, kind)


def test_a_gateway_page_refusal_is_typed_by_its_reason() -> None:
    assert _answer(PageRefused("bad-page", "x")) == (502, "repository")
    assert _answer(PageRefused("foreign-origin", "x")) == (502, "operator")
    assert _answer(IndexUnreachable("x")) == (502, "upstream")
    assert refusals.reason_of(PageRefused("foreign-origin", "x")) == "foreign-origin"


def test_an_undeclared_exception_is_ours_never_the_repositorys() -> None:
    for bug in (KeyError("x"), RuntimeError("x"), ValueError("x"), AssertionError()):
        assert refusals.row(bug) is refusals.UNEXPECTED
        assert (refusals.row(bug).status, refusals.fault_of(bug)) == (500, Fault.OURS)
        assert refusals.reason_of(bug) == "internal"
    disk = OSError(28, "No space left on device")
    assert (_answer(disk), refusals.reason_of(disk)) == ((503, "ours"), "storage")
    gone = ConnectionResetError()
    assert (refusals.fault_of(gone), refusals.reason_of(gone)) == (Fault.CLIENT, "client-gone")


def test_a_reason_phrase_is_printable_and_bounded() -> None:
    assert refusals.phrase("a\r\nb\x00" + "c" * 400) == "a??b?" + "c" * 295
