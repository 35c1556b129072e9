"""A replica group's shared ledger: the merge it rests on, with plain bytes (records are compared without their
time, a torn last line and junk are not records, what is taken keeps the giver's order, each once); the
index's notes of what the group holds; and the log of segments in a real bucket (SeaweedFS), where a batch
costs what it wrote whatever the ledger holds."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from proxy.gateway.ledger import Ledger, record_key
from proxy.gateway.shared import BASE_KEY, HEAD_KEY, SEGMENT_BYTES, Head, SharedState, group_ledger, records
from proxy.repository import Repository
from proxy.storage.leader import LeaderLease, LeaseLost
from proxy.transport.bucket import Bucket
from proxy.util.metrics import BucketMetrics
from tests.support.seaweed import BUCKET, Seaweed


def _line(**record: object) -> bytes:
    return json.dumps(record, sort_keys=True).encode() + b"\n"


def _pin(project: str, filename: str, **extra: object) -> dict[str, Any]:
    return {"kind": "pin", "project": project, "filename": filename, "hashes": {"sha256": "ab" * 32}, "size": 1,
            "index": "https://index.example/simple/", "url": f"https://files.example/{filename}", **extra}


def test_a_record_is_the_same_whenever_and_wherever_it_was_written() -> None:
    a = {"kind": "revoke", "project": "gone", "filename": None, "time": "2026-12-05T10:00:00+00:00"}
    b = json.loads(b'{"filename": null, "time": "2026-12-06T11:00:00+00:00", "project": "gone", "kind": "revoke"}')
    assert record_key(a) == record_key(b)
    assert record_key({"kind": "revoke", "project": "other"}) != record_key(a)


def test_junk_and_a_torn_last_line_are_not_records() -> None:
    data = (_line(kind="project", project="a", index="i") + b"garbage\n" + b"[1]\n" + b'{"no": "kind"}\n'
            + _line(kind="pin", project="a") + b'{"kind": "pi')
    assert [r["kind"] for r in records(data)] == ["project", "pin"]


def test_a_head_names_each_segment_by_the_generation_that_wrote_it_and_junk_is_no_head() -> None:
    head = Head("0123abcd")
    for generation in (3, 3, 5, 5, 5, 9):
        head = head.appended(generation)
    assert head.count == 6 and head.runs == ((0, 3), (2, 5), (5, 9))
    assert [head.segment(s).rsplit("/", 1)[1] for s in (0, 1, 2, 4, 5)] == [
        "000000000000-3.jsonl", "000000000001-3.jsonl", "000000000002-5.jsonl", "000000000004-5.jsonl",
        "000000000005-9.jsonl"]
    assert head.segment(0).startswith("state/ledger/0123abcd/")
    assert Head.decode(head.encode()) == head
    assert Head.decode(Head("x", base=True).encode()) == Head("x", base=True)
    for junk in (b"", b"{", b"[]", b'{"log": "a"}', b'{"log": "../x", "count": 0, "runs": []}',
                 b'{"log": "a", "count": 2, "runs": []}', b'{"log": "a", "count": 2, "runs": [[1, 3]]}',
                 b'{"log": "a", "count": 2, "runs": [[0, 3], [0, 4]]}', b'{"log": "a", "count": 1, "runs": [[0, 3], [1, 4]]}',
                 b'{"log": "a", "count": -1, "runs": []}', b'{"log": "a", "count": 1, "runs": [["x", 1]]}'):
        assert Head.decode(junk) is None, junk


def test_what_is_taken_keeps_the_givers_order_each_once_and_only_own_records_are_unshared(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.append([{"kind": "project", "project": "a", "index": "i"}, _pin("a", "a-1.whl")])
    theirs = records(_line(kind="project", project="a", index="i", time="earlier") + _line(**_pin("a", "a-2.whl"))
                     + _line(**_pin("a", "a-2.whl"), time="later") + _line(kind="revoke", project="b"))
    assert ledger.take(theirs, shared=True) == 2
    assert ledger.pins.get(("a", "a-2.whl")) is not None and ledger.is_revoked("b")
    # What the group holds is noted (even "project a", which was ours first); our pin of a-1 is not the group's.
    assert [json.loads(line)["filename"] for _, line in ledger.unshared(SEGMENT_BYTES)] == ["a-1.whl"]
    # Records that no line holds any more (a file replaced under a running process) are not offered, and
    # forgotten, so the group's copy is appended again.
    ledger.append([_pin("c", f"c-{i}.whl") for i in range(5)])
    assert [json.loads(line)["filename"] for _, line in ledger.unshared(200)] == ["a-1.whl"]  # about 200 bytes
    assert len(ledger.unshared(SEGMENT_BYTES)) == 6
    ledger.mark_shared([record_key(_pin("c", "c-0.whl"))], {"log": "x", "read": 1, "base": False})
    assert len(ledger.unshared(SEGMENT_BYTES)) == 5 and ledger.group_position()["read"] == 1
    replaced = tmp_path / "other.jsonl"
    replaced.write_bytes(_line(**_pin("a", "a-1.whl")))
    replaced.replace(ledger.path)
    assert [json.loads(line)["filename"] for _, line in ledger.unshared(SEGMENT_BYTES)] == ["a-1.whl"]
    assert ledger.lacking([_pin("c", "c-1.whl"), _pin("c", "c-0.whl")]) == [_pin("c", "c-1.whl")]


def test_an_index_from_before_the_record_keys_is_built_again_quietly(tmp_path: Path) -> None:
    Ledger(tmp_path).append([_pin("a", "a-1.whl"), _pin("a", "a-2.whl")])
    db = sqlite3.connect(tmp_path / "ledger.sqlite")
    db.execute("DELETE FROM records")
    db.execute("UPDATE meta SET value = '1' WHERE key = 'layout'")
    db.commit()
    db.close()
    again = Ledger(tmp_path)
    assert not again.reindexed  # the file lost nothing: no cross-check of the signed pages
    assert again.lines_read == 2 and len(again.unshared(SEGMENT_BYTES)) == 2


# -- the log in a bucket -----------------------------------------------------------------------------


def _bucket(seaweed: Seaweed, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    return Bucket(f"s3://{BUCKET}/{prefix}", BucketMetrics(CollectorRegistry()), endpoint_url=seaweed.endpoint,
                  timeout=5.0)


def _transferred(bucket: Bucket, op: str) -> float:
    return bucket.metrics.bytes.labels(op)._value.get()  # type: ignore[attr-defined, no-any-return]


class _Replica:
    def __init__(self, seaweed: Seaweed, prefix: str, directory: Path, name: str,
                 monkeypatch: pytest.MonkeyPatch) -> None:
        self.bucket = _bucket(seaweed, prefix, monkeypatch)
        self.lease = LeaderLease(self.bucket, 30.0, holder=name)
        self.ledger = Ledger(directory / "gateway")
        # No advisory is offered in these tests, so nothing is signed: no repository is needed.
        self.state = SharedState(self.bucket, self.lease, self.ledger, directory / "gateway" / "advisories.json",
                                 cast(Repository, None), name)


def _two(seaweed: Seaweed, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[_Replica, _Replica]:
    """Replicas "a" and "b" of one group on ``prefix``, neither leading yet."""
    return (_Replica(seaweed, prefix, tmp_path / "a", "a", monkeypatch),
            _Replica(seaweed, prefix, tmp_path / "b", "b", monkeypatch))


@pytest.mark.slow
def test_a_batch_costs_what_it_wrote_and_followers_read_only_new_segments(
        seaweed: Seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    leader, follower = _two(seaweed, "log", tmp_path, monkeypatch)

    async def scenario() -> None:
        assert await leader.lease.step() and not await follower.lease.step()
        leader.ledger.append([_pin(f"p{i}", f"p{i}-1.0.whl") for i in range(3000)])
        await leader.state.sync()  # the backlog goes up in segments of SEGMENT_BYTES at most
        found = await leader.bucket.read(HEAD_KEY)
        assert found is not None
        head = Head.decode(found)
        assert head is not None and head.count >= 1 and not head.base and leader.ledger.unshared(SEGMENT_BYTES) == []
        await follower.state.sync()
        assert follower.ledger.pins.get(("p2999", "p2999-1.0.whl")) is not None
        assert follower.ledger.unshared(SEGMENT_BYTES) == []  # nothing to offer: every record is the group's

        # One batch of 3 records: one small segment and the head go up; the follower reads only those.
        put, got = _transferred(leader.bucket, "put"), _transferred(follower.bucket, "get")
        leader.ledger.append([_pin("new", f"new-{i}.whl") for i in range(3)])
        await leader.state.sync()
        await follower.state.sync()
        assert _transferred(leader.bucket, "put") - put < 1500
        assert _transferred(follower.bucket, "get") - got < 1500
        assert follower.ledger.pins.get(("new", "new-2.whl")) is not None
        # Nothing new: the follower's look costs a conditional GET that downloads nothing.
        got = _transferred(follower.bucket, "get")
        await follower.state.sync()
        assert _transferred(follower.bucket, "get") == got

        # A revocation on the follower's host is offered, taken in by the leader, published in the next
        # segment, and once the follower has read it, no longer offered.
        follower.ledger.append([{"kind": "revoke", "project": "p7", "filename": None}])
        await follower.state.sync()
        inbox = follower.state.inbox + "ledger.jsonl"
        assert b'"revoke"' in (await follower.bucket.read(inbox) or b"")
        leader.state._took = float("-inf")  # offers are listed at most every OFFERS_EVERY
        await leader.state.sync()
        assert leader.ledger.is_revoked("p7")
        await follower.state.sync()
        assert await follower.bucket.read(inbox) is None
        whole = await group_ledger(leader.bucket)
        assert len(records(whole)) == 3000 + 3 + 1

        # A restarted follower (a new process on the same DIR) goes on from the segment it read last.
        again = _Replica(seaweed, "log", tmp_path / "b", "b", monkeypatch)
        await again.state.sync()
        assert _transferred(again.bucket, "get") < 1500

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_stale_leaders_segment_is_named_by_no_head_and_it_steps_down(
        seaweed: Seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = _two(seaweed, "fence", tmp_path, monkeypatch)

    async def scenario() -> None:
        assert await first.lease.step()
        first.ledger.append([_pin("a", "a-1.whl")])
        await first.state.sync()
        # ``first`` freezes; ``second`` takes over (the record is released here to skip the wait) and publishes.
        await first.lease.release()
        assert await second.lease.step() and second.lease.generation == first.lease.generation + 1
        await second.state.elected()
        second.ledger.append([_pin("b", "b-1.whl")])
        await second.state.sync()
        # ``first`` wakes believing it leads: its segment goes up under its own generation, its head fails.
        first.lease._leader, first.lease._valid_until = True, float("inf")
        first.ledger.append([_pin("stale", "stale-1.whl")])
        with pytest.raises(LeaseLost):
            await first.state.sync()
        assert not first.lease.leader
        whole = await group_ledger(second.bucket)
        assert b"b-1.whl" in whole and b"a-1.whl" in whole and b"stale-1.whl" not in whole
        # As a follower it offers the record, and the leader publishes it as the group's.
        await first.state.sync()
        second.state._took = float("-inf")
        await second.state.sync()
        assert b"stale-1.whl" in await group_ledger(second.bucket)

    asyncio.run(scenario())


@pytest.mark.slow
def test_the_older_whole_file_starts_the_log_and_a_missing_segment_or_junk_head_is_survived(
        seaweed: Seaweed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    leader, follower = _two(seaweed, "older", tmp_path, monkeypatch)

    async def scenario() -> None:
        # A bucket written by a version that kept the whole file: read by both, and the new log starts with it.
        await leader.bucket.replace(BASE_KEY, _line(**_pin("old", "old-1.whl")) + _line(**_pin("old", "old-2.whl")))
        await follower.state.sync()
        assert follower.ledger.pins.get(("old", "old-2.whl")) is not None
        assert await leader.lease.step()
        await leader.state.elected()
        assert leader.ledger.unshared(SEGMENT_BYTES) == []  # what the file held is the group's already
        leader.ledger.append([_pin("new", "new-1.whl")])
        await leader.state.sync()
        head = Head.decode(await leader.bucket.read(HEAD_KEY) or b"")
        assert head is not None and head.base and head.count == 1
        fresh = _Replica(seaweed, "older", tmp_path / "c", "c", monkeypatch)
        await fresh.state.sync()
        assert {p for (p, _), _ in fresh.ledger.pins.items()} == {"old", "new"}

        # A segment lost from the bucket: named in a warning, and the reader goes on past it.
        leader.ledger.append([_pin("lost", "lost-1.whl")])
        await leader.state.sync()
        leader.ledger.append([_pin("kept", "kept-1.whl")])
        await leader.state.sync()
        head = Head.decode(await leader.bucket.read(HEAD_KEY) or b"")
        assert head is not None
        await leader.bucket.delete(head.segment(1))
        await follower.state.sync()
        assert follower.ledger.pins.get(("kept", "kept-1.whl")) is not None
        assert follower.ledger.pins.get(("lost", "lost-1.whl")) is None
        assert any(head.segment(1) in r.getMessage() for r in caplog.records)

        # A junk head: left alone by readers, replaced by the leader's next write with a new log, which
        # every replica then reads from its start (records it holds already are not appended twice).
        await leader.bucket.replace(HEAD_KEY, b"{junk")
        await follower.state.sync()
        leader.state._etags.pop(HEAD_KEY)
        leader.ledger.append([_pin("after", "after-1.whl")])
        await leader.state.sync()
        again = Head.decode(await leader.bucket.read(HEAD_KEY) or b"")
        assert again is not None and again.log != head.log and again.count == 1 and again.base
        lines = follower.ledger.path.read_bytes().count(b"\n")
        await follower.state.sync()
        assert follower.ledger.pins.get(("after", "after-1.whl")) is not None
        assert follower.ledger.path.read_bytes().count(b"\n") == lines + 1

    asyncio.run(scenario())
