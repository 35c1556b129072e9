"""Leadership of gateway replicas sharing one bucket, and the fenced write of ``timestamp.json``.

:class:`LeaderLease` keeps the lease record (:mod:`proxy.protocol.lease`)
in the bucket: every third of the lease period it reads the record and
renews it (ours), takes it (expired or absent) or follows.  Both writes
are conditional (``If-None-Match: *`` / ``If-Match: ETAG``), so of two
replicas racing for an expired lease exactly one wins.  A leader counts
its lease from the moment it *asked* (monotonic clock), so it believes
itself leader for less time than any follower waits.

:class:`Fence` is the only writer of ``metadata/timestamp.json`` under a
lease: a write is refused before it leaves if the lease is not held and
valid, and is conditional on the ETag this leader last saw, so a leader
that was frozen past its lease (SIGSTOP, a long pause, a partition) and
wakes up cannot overwrite what its successor published: its write fails,
it steps down.  Each timestamp object carries the generation it was
written under (user metadata ``tufproxy-lease-generation``).  A timestamp whose version is not above the bucket's is
never written either.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

from proxy.protocol.lease import LEASE_KEY, LeaseRecord, Step, next_step, successor, timestamp_version
from proxy.transport.bucket import Bucket, BucketUnavailable

log = logging.getLogger(__name__)
TIMESTAMP_KEY = "metadata/timestamp.json"
GENERATION_META = "tufproxy-lease-generation"  # stored with each timestamp: the lease it was written under


class LeaseLost(BucketUnavailable):
    """This replica is not (or no longer) the leader: it must not publish."""

    reason = "lease-lost"


class LeaderLease:
    """One replica's view of the lease; ``elected`` runs (and must succeed) before it acts as leader."""

    def __init__(self, bucket: Bucket, period: float, *, elected: Callable[[], Awaitable[None]] | None = None,
                 changed: Callable[[bool, int], None] | None = None, lost: Callable[[], None] | None = None,
                 holder: str | None = None, url: str = "") -> None:
        self.bucket = bucket
        self.url = url
        self.leader_url: str | None = None  # the holder's, as a follower last read it
        self.period = period
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.generation = 0
        self._elected = elected
        self._changed = changed or (lambda leader, generation: None)
        self._lost = lost or (lambda: None)
        self._etag: str | None = None
        self._valid_until = 0.0  # monotonic
        self._leader = False
        self.wake = asyncio.Event()

    @property
    def leader(self) -> bool:
        """Leader now: the lease is ours and, by our own clock, not near its end."""
        return self._leader and time.monotonic() < self._valid_until

    def following(self) -> Bucket | None:
        """The group's bucket while this replica follows (the published tree is the leader's there), else None."""
        return None if self.leader else self.bucket

    async def step(self) -> bool:
        """One read-and-decide; whether this replica leads afterwards."""
        asked = time.monotonic()
        try:
            found = await self.bucket.read_tagged(LEASE_KEY)
            record = LeaseRecord.decode(found[0]) if found is not None else None
            action = next_step(record, self.holder, time.time())
            if action is Step.FOLLOW:
                assert record is not None
                self._follow(record.generation)
                self.leader_url = record.url or None
                return False
            new = successor(record, action, self.holder, time.time(), self.period, self.url)
            etag = await self.bucket.put_if(LEASE_KEY, new.encode(), found[1] if found is not None else None)
        except BucketUnavailable as e:
            if self._leader and not self.leader:
                log.warning("leader lease not renewed in time (%s): stepping down", e)
                self.step_down()
            raise
        if etag is None:  # another replica wrote the record between our read and our write
            self._follow(record.generation if record is not None else self.generation)
            return False
        self._etag = etag
        # A follower waits a whole period after the record's expiry passes; we stop a fifth earlier.
        self._valid_until = asked + self.period * 0.8
        if not self._leader:
            self.generation = new.generation
            if self._elected is not None:
                await self._elected()
            self._leader = True
            log.info("leader of %s, generation %d (%s)", self.bucket.url, self.generation, self.holder)
            self._changed(True, self.generation)
        return True

    def _follow(self, generation: int) -> None:
        if self._leader:
            log.warning("lease of %s taken by another replica (generation %d)", self.bucket.url, generation)
            self.step_down()
        if generation != self.generation:
            self.generation = generation
            self._changed(False, generation)

    def step_down(self) -> None:
        """Stop leading now (a lost lease or a failed fenced write); the next step may take it again."""
        if self._leader:
            self._leader = False
            self._lost()
            self._changed(False, self.generation)
        self.wake.set()

    async def run(self) -> None:
        """Keep stepping every third of the period; bucket failures are logged and retried."""
        while True:
            step = asyncio.ensure_future(self.step())
            while not step.done():
                # A bucket that hangs answers nothing for up to its timeout: stop leading when the lease
                # runs out by our clock, not when the request gives up.
                await asyncio.wait({step}, timeout=self.period / 10)
                if not step.done() and self._leader and not self.leader:
                    log.warning("leader lease of %s not renewed in time (the bucket has not answered): "
                                "stepping down", self.bucket.url)
                    self.step_down()
            try:
                step.result()
            except BucketUnavailable as e:
                log.warning("leader lease of %s: %s", self.bucket.url, e)
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), self.period / 3)
            except TimeoutError:
                pass

    async def release(self) -> None:
        """On a clean stop: expire the lease now so a successor need not wait a period."""
        if not self.leader or self._etag is None:
            return
        self._leader = False
        gone = LeaseRecord(self.holder, self.generation, 0.0)
        try:
            await self.bucket.put_if(LEASE_KEY, gone.encode(), self._etag)
        except BucketUnavailable as e:
            log.warning("could not release the lease of %s: %s", self.bucket.url, e)


class Fence:
    """Conditional writes of ``timestamp.json`` under ``lease`` (see the module docstring)."""

    def __init__(self, bucket: Bucket, lease: LeaderLease) -> None:
        self.bucket = bucket
        self.lease = lease
        self._etag: str | None = None
        self.version = 0  # the bucket's timestamp version as this replica last saw it

    async def load(self) -> int:
        """Read the bucket's timestamp (on election): the ETag the next write names; its version."""
        found = await self.bucket.read_tagged(TIMESTAMP_KEY)
        self._etag = found[1] if found is not None else None
        self.version = (timestamp_version(found[0]) or 0) if found is not None else 0
        return self.version

    async def write(self, data: bytes) -> None:
        """Publish a timestamp, or raise :class:`LeaseLost` (stepping down) if this replica may not."""
        if not self.lease.leader:
            raise LeaseLost(f"not the leader of {self.bucket.url}: timestamp not written")
        version = timestamp_version(data) or 0
        if version <= self.version:
            raise LeaseLost(f"timestamp v{version} is not above v{self.version} in {self.bucket.url}: not written")
        etag = await self.bucket.put_if(TIMESTAMP_KEY, data, self._etag, {GENERATION_META: str(self.lease.generation)})
        if etag is None:
            self.lease.step_down()
            raise LeaseLost(f"{self.bucket.url} timestamp changed under generation {self.lease.generation}: "
                            "another replica leads; stepped down")
        self._etag = etag
        self.version = version
