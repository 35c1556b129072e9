"""The merge a replica group's shared ledger rests on, with plain bytes: records are compared without their
time, a torn last line and junk are not records, and what is taken keeps the giver's order, each once."""

from __future__ import annotations

import json

from proxy.gateway.shared import lacking, record_key, records


def _line(**record: object) -> bytes:
    return json.dumps(record, sort_keys=True).encode() + b"\n"


def test_a_record_is_the_same_whenever_and_wherever_it_was_written() -> None:
    a = _line(kind="revoke", project="gone", filename=None, time="2026-12-05T10:00:00+00:00")
    b = b'{"filename": null, "time": "2026-12-06T11:00:00+00:00", "project": "gone", "kind": "revoke"}'
    assert record_key(a) == record_key(b) is not None
    assert record_key(_line(kind="revoke", project="other")) != record_key(a)
    assert record_key(b"not json") is None and record_key(b'{"no": "kind"}') is None and record_key(b"[1]") is None


def test_junk_and_a_torn_last_line_are_not_records() -> None:
    data = _line(kind="project", project="a", index="i") + b"garbage\n" + _line(kind="pin", project="a") + b'{"kind": "pi'
    assert [r["kind"] for _, r in records(data)] == ["project", "pin"]


def test_what_is_taken_keeps_their_order_each_once() -> None:
    theirs = records(_line(kind="project", project="a", index="i") + _line(kind="pin", project="a", filename="x")
                     + _line(kind="pin", project="a", filename="x", time="later") + _line(kind="revoke", project="b"))
    ours = {key for key, _ in records(_line(kind="project", project="a", index="i", time="earlier"))}
    taken = lacking(theirs, ours)
    assert [(r["kind"], r.get("filename")) for r in taken] == [("pin", "x"), ("revoke", None)]
