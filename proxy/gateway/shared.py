"""A replica group's shared state in the bucket: the authority each replica's DIR caches.

Under ``PREFIX/state/``:

- ``ledger.jsonl``: the ledger (pins, revocations, the project-to-index
  memory, provenance and publisher pins, first sights);
- ``advisories.json``: the advisory store;
- ``inbox/REPLICA/ledger.jsonl`` and ``inbox/REPLICA/advisories.json``:
  what a follower holds that the authority lacks (a revocation or an import
  run on its host, a publish made while no leader answered), for the leader
  to take in.

Only the leader writes the first two, each conditional on the ETag it last
saw, so a leader frozen past its lease fails this write as it fails its
timestamp's, and steps down.  It writes them before the tree
(:class:`~proxy.storage.treepush.TreePush` calls :meth:`SharedState.sync`
first), so the pins a page relies on are in the bucket before the page is.

Ledger records are facts that only accumulate, and each kind applies
idempotently, so two ledgers merge by keeping every record of both, each
once (records compared without their time).  A replica appends what the
bucket's ledger has and its own lacks, in the bucket's order: the file
only ever grows, and for the one kind where the later record wins (a
project's publisher pin) the bucket's, read later, wins.  Advisory
stores merge by :meth:`~proxy.protocol.osv.AdvisorySet.add` (a newer
``modified`` wins).  A replica becoming leader pulls and takes in the
inboxes before it signs anything.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Iterable
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
LEDGER_KEY = STATE + "ledger.jsonl"
ADVISORIES_KEY = STATE + "advisories.json"
INBOX = STATE + "inbox/"
REFRESH_EVERY = 1.0
OFFERS_EVERY = 5.0


def record_key(line: bytes) -> bytes | None:
    """What identifies a ledger record whatever its time (None: not a record)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or "kind" not in record:
        return None
    record.pop("time", None)
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).digest()


def records(data: bytes) -> list[tuple[bytes, dict[str, Any]]]:
    """(key, record) of each whole record line of a ledger's bytes, in order."""
    found = []
    for line in data[:data.rfind(b"\n") + 1].splitlines():
        key = record_key(line)
        if key is not None:
            found.append((key, json.loads(line)))
    return found


def lacking(theirs: Iterable[tuple[bytes, dict[str, Any]]], ours: set[bytes]) -> list[dict[str, Any]]:
    """Their records that ``ours`` lacks, in their order, each once."""
    taken: list[dict[str, Any]] = []
    seen = set(ours)
    for key, record in theirs:
        if key not in seen:
            seen.add(key)
            taken.append(record)
    return taken


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
        self._read: dict[str, str] = {}  # inbox key -> the ETag last taken in
        self._offered: dict[str, bytes] = {}  # this replica's inbox key -> the bytes last offered
        self._published: dict[str, bytes | None] = {}  # key -> the sha256 of the bytes this leader last wrote
        self._bucket_keys: set[bytes] = set()  # the records of the bucket's ledger as last read
        self._lock = asyncio.Lock()
        self._refreshed = float("-inf")  # loop time of the last out-of-turn pull
        self._took = float("-inf")  # loop time the leader last listed the offers
        self._local_cache: tuple[tuple[int, int, int] | None, list[tuple[bytes, dict[str, Any]]]] = (None, [])
        self._theirs: Store | None = None  # the bucket's advisory store as last read
        # What a follower offered, decided again only when its files or the bucket's changed.
        self._offer_basis: tuple[object, ...] | None = None

    def _local(self) -> list[tuple[bytes, dict[str, Any]]]:
        """This replica's ledger records, parsed again only when the file changed."""
        stamp = file_stamp(self.ledger.path)
        if self._local_cache[0] != stamp:
            self._local_cache = (stamp, records(_read(self.ledger.path) or b""))
        return self._local_cache[1]

    def _local_keys(self) -> set[bytes]:
        return {key for key, _ in self._local()}

    async def pull(self) -> int:
        """Take in the bucket's ledger and advisories (if they changed); how many records and advisories."""
        taken = 0
        found = await self.bucket.read_tagged(LEDGER_KEY, unless=self._etags.get(LEDGER_KEY))
        if found is None:
            self._etags[LEDGER_KEY] = None
        elif found[1] != self._etags.get(LEDGER_KEY):
            theirs = await asyncio.to_thread(records, found[0])
            self._bucket_keys = {key for key, _ in theirs}
            new = lacking(theirs, await asyncio.to_thread(self._local_keys))
            if new:
                await asyncio.to_thread(self.ledger.append, new)
                taken += len(new)
            self._etags[LEDGER_KEY] = found[1]
        found = await self.bucket.read_tagged(ADVISORIES_KEY, unless=self._etags.get(ADVISORIES_KEY))
        if found is None:
            self._etags[ADVISORIES_KEY] = None
        elif found[1] != self._etags.get(ADVISORIES_KEY):
            self._theirs = await asyncio.to_thread(self._parse_advisories, found[0], ADVISORIES_KEY)
            if self._theirs is not None:
                taken += await asyncio.to_thread(merge_into, self.advisories, self._theirs)
            self._etags[ADVISORIES_KEY] = found[1]
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
                new = lacking(await asyncio.to_thread(records, data), await asyncio.to_thread(self._local_keys))
                if new:
                    await asyncio.to_thread(self.ledger.append, new)
                    log.info("took %d ledger record(s) a follower offered (%s)", len(new), key)
                    taken += len(new)
            elif key.endswith("/advisories.json"):
                advised += await self._merge_advisories(data, key)
            self._read[key] = etag
        return taken, advised

    async def _publish(self, key: str, data: bytes) -> None:
        """Write ``key`` as the leader, conditional on the ETag last seen; step down if another wrote it."""
        if key not in self._etags:
            found = await self.bucket.read_tagged(key)
            self._etags[key] = found[1] if found is not None else None
            if found is not None and found[0] == data:
                return
        etag = await self.bucket.put_if(key, data, self._etags[key])
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
                for key, path in ((LEDGER_KEY, self.ledger.path), (ADVISORIES_KEY, self.advisories)):
                    data = await asyncio.to_thread(_read, path)
                    digest = hashlib.sha256(data).digest() if data is not None else None
                    if data is not None and digest != self._published.get(key):
                        await self._publish(key, data)
                        self._published[key] = digest  # the same bytes are not sent again
                return
            await self.pull()
            basis = (file_stamp(self.ledger.path), file_stamp(self.advisories), self._etags.get(LEDGER_KEY),
                     self._etags.get(ADVISORIES_KEY))
            if basis == self._offer_basis:
                return  # nothing changed here or there since the last offer
            offer = await asyncio.to_thread(lambda: lacking(self._local(), self._bucket_keys))
            await self._offer(self.inbox + "ledger.jsonl",
                              b"".join(json.dumps(r, sort_keys=True).encode() + b"\n" for r in offer) or None)
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

