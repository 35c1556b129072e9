"""A replica group's shared state in the bucket: the authority each replica's DIR caches.

Under ``PREFIX/state/``:

- ``ledger/head.json`` and ``ledger/LOG/SEQ-GENERATION.jsonl``: the
  ledger (pins, revocations, the project-to-index memory, provenance and
  publisher pins, first sights) as a log of segments.  The leader writes
  one segment per batch holding what it appended since the last (the
  records its index has not yet noted as the group's), then the head
  (``{"log", "count", "runs", "base"}``: how many segments, and from which
  one on each generation wrote them).  A replica reads the head (a
  conditional GET: nothing while it is unchanged) and only the segments
  past the one it read last, which it notes in its ledger index
  (:meth:`~proxy.gateway.ledger.Ledger.group_position`).  So a batch costs
  what it wrote, whatever the ledger holds (the whole file was uploaded,
  and read whole by each follower, before).  ``ledger.jsonl`` beside it is
  that older form: a log whose head says ``"base": true`` starts with it;
- ``advisories.json``: the advisory store;
- ``inbox/REPLICA/ledger.jsonl`` and ``inbox/REPLICA/advisories.json``:
  what a follower holds that the authority lacks (a revocation or an import
  run on its host, a publish made while no leader answered), for the leader
  to take in.

Only the leader writes the head and the advisories, each conditional on
the ETag it last saw, so a leader frozen past its lease fails this write
as it fails its timestamp's, and steps down; a segment it wrote before
that is named by no head, and read by nobody.  It writes them before the
tree (:class:`~proxy.storage.treepush.TreePush` calls :meth:`SharedState.sync`
first), so the pins a page relies on are in the bucket before the page is.

Ledger records are facts that only accumulate, and each kind applies
idempotently, so two ledgers merge by keeping every record of both, each
once (records compared without their time,
:func:`~proxy.gateway.ledger.record_key`).  A replica appends what the
bucket's log has and its own lacks, in the log's order: the file only
ever grows, and for the one kind where the later record wins (a project's
publisher pin) the bucket's, read later, wins.  Advisory stores merge by
:meth:`~proxy.protocol.osv.AdvisorySet.add` (a newer ``modified`` wins).
A replica becoming leader pulls and takes in the inboxes before it signs
anything.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.gateway.advisories import Store, merge_into, parse_store, sign_store
from proxy.gateway.ledger import Ledger
from proxy.protocol.osv import AdvisorySet
from proxy.repository import Repository
from proxy.storage.leader import LeaderLease, LeaseLost
from proxy.transport.bucket import Bucket, BucketUnavailable
from proxy.util.atomic import file_stamp

log = logging.getLogger(__name__)

STATE = "state/"
HEAD_KEY = STATE + "ledger/head.json"
BASE_KEY = STATE + "ledger.jsonl"  # the whole-file ledger of older versions: a log's first part if its head says so
ADVISORIES_KEY = STATE + "advisories.json"
INBOX = STATE + "inbox/"
REFRESH_EVERY = 1.0
OFFERS_EVERY = 5.0
SEGMENT_BYTES = 4 << 20  # a segment (and an offer) holds about this much at most: a backlog goes up in several
READ_AHEAD = 8  # segments read at once by a replica catching up


def records(data: bytes) -> list[dict[str, Any]]:
    """Each whole record line of a ledger's bytes, in order (junk and a torn last line are not records)."""
    found = []
    for line in data[:data.rfind(b"\n") + 1].splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "kind" in record:
            found.append(record)
    return found


@dataclass(frozen=True)
class Head:
    """The ledger log's head: ``count`` segments, segment ``runs[i][0]`` on written under generation ``runs[i][1]``."""

    log: str
    count: int = 0
    runs: tuple[tuple[int, int], ...] = ()
    base: bool = False  # the log starts with BASE_KEY

    @classmethod
    def decode(cls, data: bytes) -> Head | None:
        """The head in ``data``, or None if it is not one."""
        try:
            raw = json.loads(data)
            head = cls(str(raw["log"]), int(raw["count"]), tuple((int(f), int(g)) for f, g in raw["runs"]),
                       bool(raw.get("base", False)))
        except (ValueError, KeyError, TypeError):
            return None
        firsts = [f for f, _ in head.runs]
        if not head.log.isalnum() or head.count < 0 or firsts != sorted(set(firsts)) \
                or (head.count and (not firsts or firsts[0] != 0 or firsts[-1] >= head.count)):
            return None
        return head

    def encode(self) -> bytes:
        return json.dumps({"log": self.log, "count": self.count, "runs": self.runs, "base": self.base}).encode()

    def segment(self, seq: int) -> str:
        """The key of segment ``seq`` (below ``count``)."""
        generation = next(g for f, g in reversed(self.runs) if f <= seq)
        return f"{STATE}ledger/{self.log}/{seq:012d}-{generation}.jsonl"

    def appended(self, generation: int) -> Head:
        """This head with one more segment, written under ``generation``."""
        runs = self.runs if self.runs and self.runs[-1][1] == generation else (*self.runs, (self.count, generation))
        return Head(self.log, self.count + 1, runs, self.base)

    def position(self) -> dict[str, Any]:
        """What a replica notes once it holds every segment of this head."""
        return {"log": self.log, "read": self.count, "base": self.base}


async def segments(bucket: Bucket, head: Head, start: int) -> AsyncIterator[tuple[int, bytes | None]]:
    """(seq, bytes or None if missing) of each segment from ``start``, in order, READ_AHEAD read at once."""
    for first in range(start, head.count, READ_AHEAD):
        seqs = range(first, min(first + READ_AHEAD, head.count))
        for seq, data in zip(seqs, await asyncio.gather(*(bucket.read(head.segment(s)) for s in seqs)), strict=True):
            yield seq, data


async def group_ledger(bucket: Bucket) -> bytes:
    """The group's whole ledger as the bucket holds it (for a look by hand, and tests)."""
    found = await bucket.read(HEAD_KEY)
    head = Head.decode(found) if found is not None else None
    if head is None:
        return await bucket.read(BASE_KEY) or b""
    parts = [await bucket.read(BASE_KEY) or b""] if head.base else []
    parts += [data or b"" async for _, data in segments(bucket, head, 0)]
    return b"".join(parts)


class SharedState:
    """One replica's side of the shared state (see the module docstring)."""

    def __init__(self, bucket: Bucket, lease: LeaderLease, ledger: Ledger, advisories: Path, repo: Repository,
                 replica: str) -> None:
        self.bucket = bucket
        self.lease = lease
        self.ledger = ledger
        self.advisories = advisories
        self.repo = repo
        self.inbox = f"{INBOX}{hashlib.sha256(replica.encode()).hexdigest()[:16]}/"
        self._etags: dict[str, str | None] = {}  # key -> the ETag this replica last read or wrote
        self._head: Head | None = None  # the ledger log's head as last read or written (None: none, or junk)
        self._read: dict[str, str] = {}  # inbox key -> the ETag last taken in
        self._offered: dict[str, bytes] = {}  # this replica's inbox key -> the bytes last offered
        self._published: bytes | None = None  # the sha256 of the advisory store this leader last wrote
        self._lock = asyncio.Lock()
        self._refreshed = float("-inf")  # loop time of the last out-of-turn pull
        self._took = float("-inf")  # loop time the leader last listed the offers
        self._theirs: Store | None = None  # the bucket's advisory store as last read
        # What a follower offered, decided again only when its files or the bucket's changed.
        self._offer_basis: tuple[object, ...] | None = None

    async def pull(self) -> int:
        """Take in the bucket's ledger and advisories (if they changed); how many records and advisories."""
        taken = await self._pull_ledger()
        found = await self.bucket.read_tagged(ADVISORIES_KEY, unless=self._etags.get(ADVISORIES_KEY))
        if found is None:
            self._etags[ADVISORIES_KEY] = None
        elif found[1] != self._etags.get(ADVISORIES_KEY):
            self._theirs = await asyncio.to_thread(self._parse_advisories, found[0], ADVISORIES_KEY)
            if self._theirs is not None:
                taken += await asyncio.to_thread(merge_into, self.advisories, self._theirs)
            self._etags[ADVISORIES_KEY] = found[1]
        return taken

    async def _pull_ledger(self) -> int:
        """Take in the segments of the bucket's log past the last one this replica read; how many records."""
        found = await self.bucket.read_tagged(HEAD_KEY, unless=self._etags.get(HEAD_KEY))
        if found is not None and HEAD_KEY in self._etags and found[1] == self._etags[HEAD_KEY]:
            return 0
        if found is None:  # no log yet: the older whole file, if any, is the group's ledger
            self._head = self._etags[HEAD_KEY] = None
            base = await self.bucket.read_tagged(BASE_KEY, unless=self._etags.get(BASE_KEY))
            if base is None or base[1] == self._etags.get(BASE_KEY):
                return 0
            taken = await asyncio.to_thread(self.ledger.take, records(base[0]), True)
            self._etags[BASE_KEY] = base[1]
            return taken
        head = Head.decode(found[0])
        if head is None:
            log.warning("%s%s is not a ledger head: left alone (the next leader starts a new log)", self.bucket.url,
                        HEAD_KEY)
            self._head, self._etags[HEAD_KEY] = None, found[1]
            return 0
        at = await asyncio.to_thread(self.ledger.group_position)
        if at.get("log") != head.log or not 0 <= at.get("read", 0) <= head.count:
            if at.get("log") == head.log:
                log.warning("%s%s names %d segment(s), fewer than this replica read: reading them all again",
                            self.bucket.url, HEAD_KEY, head.count)
            at = {"log": head.log, "read": 0, "base": False}
        taken = 0
        if head.base and not at.get("base"):
            at["base"] = True
            taken += await asyncio.to_thread(self.ledger.take, records(await self.bucket.read(BASE_KEY) or b""),
                                             True, dict(at))
        async for seq, data in segments(self.bucket, head, int(at["read"])):
            if data is None:  # the head names it, so it was written: lost since, and its records with it
                log.warning("%s%s is missing: its records are not taken in", self.bucket.url, head.segment(seq))
            at["read"] = seq + 1
            taken += await asyncio.to_thread(self.ledger.take, records(data or b""), True, dict(at))
        self._head, self._etags[HEAD_KEY] = head, found[1]
        return taken

    def _parse_advisories(self, data: bytes, key: str) -> Store | None:
        try:
            return parse_store(data)
        except ValueError as e:
            log.warning("%s%s is not an advisory store (%s): left out", self.bucket.url, key, e)
            return None

    async def _merge_advisories(self, data: bytes, key: str) -> int:
        store = await asyncio.to_thread(self._parse_advisories, data, key)
        return await asyncio.to_thread(merge_into, self.advisories, store) if store is not None else 0

    async def take_inboxes(self) -> tuple[int, int]:
        """The leader takes in what followers offered; how many records, and advisories, were new."""
        taken = advised = 0
        for key, etag in await self.bucket.list(INBOX):
            if key.startswith(self.inbox) or self._read.get(key) == etag:
                continue
            data = await self.bucket.read(key)
            if data is None:
                continue
            if key.endswith("/ledger.jsonl"):
                # Not noted as the group's: they are, once the next segment holds them.
                new = await asyncio.to_thread(self.ledger.take, records(data), False)
                if new:
                    log.info("took %d ledger record(s) a follower offered (%s)", new, key)
                    taken += new
            elif key.endswith("/advisories.json"):
                advised += await self._merge_advisories(data, key)
            self._read[key] = etag
        return taken, advised

    async def _publish_ledger(self) -> None:
        """The leader's segments of what its ledger holds and the group's lacks, each followed by the head
        naming it (conditional: another leader's head steps this one down)."""
        if HEAD_KEY not in self._etags:
            await self._pull_ledger()
        while lines := await asyncio.to_thread(self.ledger.unshared, SEGMENT_BYTES):
            head = self._head
            if head is None:  # the first segment of a new log, which the older whole file starts if there is one
                head = Head(secrets.token_hex(8), base=await self.bucket.exists(BASE_KEY))
            generation = self.lease.generation
            new = head.appended(generation)
            # Unconditional: only this leader writes under its generation; a head names it only once written.
            await self.bucket.replace(new.segment(head.count), b"".join(line + b"\n" for _, line in lines))
            await self._put_as_leader(HEAD_KEY, new.encode())
            self._head = new
            await asyncio.to_thread(self.ledger.mark_shared, [key for key, _ in lines], new.position())

    async def _publish_advisories(self) -> None:
        """The leader's advisory store, if it changed, conditional on the ETag last seen."""
        data = await asyncio.to_thread(_read, self.advisories)
        digest = hashlib.sha256(data).digest() if data is not None else None
        if data is None or digest == self._published:
            return
        if ADVISORIES_KEY not in self._etags:
            found = await self.bucket.read_tagged(ADVISORIES_KEY)
            self._etags[ADVISORIES_KEY] = found[1] if found is not None else None
            if found is not None and found[0] == data:
                self._published = digest
                return
        await self._put_as_leader(ADVISORIES_KEY, data)
        self._published = digest  # the same bytes are not sent again

    async def _put_as_leader(self, key: str, data: bytes) -> None:
        """Write ``key`` if it still has the ETag this replica last saw; else another replica leads since:
        step down (LeaseLost), as a stale leader's timestamp write does."""
        etag = await self.bucket.put_if(key, data, self._etags.get(key))
        if etag is None:
            self.lease.step_down()
            raise LeaseLost(f"{self.bucket.url}{key} changed under generation {self.lease.generation}: "
                            "another replica leads; stepped down")
        self._etags[key] = etag

    async def _offer(self, key: str, data: bytes | None) -> None:
        """A follower's offer: ``data`` under its inbox ``key`` (None: nothing to offer, the object goes)."""
        if self._offered.get(key, b"") == (data or b""):
            return
        if data:
            await self.bucket.replace(key, data)
        else:
            await self.bucket.delete(key)
        self._offered[key] = data or b""

    async def sync(self) -> None:
        """Leader: take in the offers, then publish the ledger and advisories.  Follower: pull, then offer
        what the bucket lacks.  :class:`~proxy.transport.bucket.BucketUnavailable` is the caller's to retry."""
        async with self._lock:
            if self.lease.leader:
                # Offers are rare: listed at most every OFFERS_EVERY, not at each publish's push.
                now = asyncio.get_running_loop().time()
                if now - self._took >= OFFERS_EVERY:
                    self._took = now
                    if (await self.take_inboxes())[1]:
                        # Signed as the advisory target, as an import here would (mirror sync carries it).
                        await asyncio.to_thread(sign_store, self.repo, self.advisories)
                await self._publish_ledger()
                await self._publish_advisories()
                return
            await self.pull()
            basis = (file_stamp(self.ledger.path), file_stamp(self.advisories), self._etags.get(HEAD_KEY),
                     self._etags.get(ADVISORIES_KEY))
            if basis == self._offer_basis:
                return  # nothing changed here or there since the last offer
            offer = await asyncio.to_thread(self.ledger.unshared, SEGMENT_BYTES)
            await self._offer(self.inbox + "ledger.jsonl", b"".join(line + b"\n" for _, line in offer) or None)
            await self._offer(self.inbox + "advisories.json", await asyncio.to_thread(self._advisories_to_offer))
            self._offer_basis = basis

    def _advisories_to_offer(self) -> bytes | None:
        """The local store, if it holds an advisory the bucket's lacks or has older."""
        local = _read(self.advisories)
        if local is None:
            return None
        if self._etags.get(ADVISORIES_KEY) is None or self._theirs is None:
            return local
        try:
            ours = parse_store(local)
        except ValueError:
            return None
        probe = AdvisorySet()
        probe.add(self._theirs.advisories.by_id.values())
        return local if probe.add(ours.advisories.by_id.values()) else None

    async def refresh(self) -> None:
        """A follower's pull out of turn (a file whose pin the leader wrote a moment ago), at most once a second:
        a client asking for unknown files cannot make it read the bucket's ledger more often."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._refreshed < REFRESH_EVERY or self.lease.leader:
            return
        self._refreshed = loop.time()
        try:
            async with self._lock:
                await self.pull()
        except BucketUnavailable as e:
            log.warning("cannot read the group's state from %s: %s", self.bucket.url, e)

    async def elected(self) -> None:
        """Before a new leader signs: the bucket's state and every offer, taken in."""
        async with self._lock:
            pulled = await self.pull()
            offered = sum(await self.take_inboxes())
        if pulled or offered:
            log.info("leader: took in %d record(s) and advisories from the bucket and %d offered by followers",
                     pulled, offered)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None

