"""The leader lease of gateway replicas sharing one bucket: its record and what a replica does next.

Pure decisions, no I/O.  The record is a small JSON object in the bucket
(``PREFIX/leader/lease.json``): who holds it, until when (wall-clock
seconds; replicas' clocks are assumed within a small fraction of the lease
of each other), and a generation that rises by one at every change of
holder.  The bucket's conditional PUT makes taking and renewing atomic: a
record is only ever replaced by a writer that read the version it replaces.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

LEASE_KEY = "leader/lease.json"
_MAX_RECORD = 4096


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    generation: int
    expires: float
    url: str = ""  # where the other replicas forward publish requests to the holder

    def encode(self) -> bytes:
        return json.dumps({"holder": self.holder, "generation": self.generation, "expires": self.expires,
                           "url": self.url}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> LeaseRecord | None:
        """The record, or None for bytes that are not one (a damaged lease is taken over as an expired one)."""
        if len(data) > _MAX_RECORD:
            return None
        try:
            raw = json.loads(data)
            return cls(str(raw["holder"]), int(raw["generation"]), float(raw["expires"]), str(raw.get("url", "")))
        except (ValueError, KeyError, TypeError):
            return None


class Step(Enum):
    RENEW = "renew"    # ours: extend it (same generation)
    TAKE = "take"      # expired, damaged or absent: take it (next generation)
    FOLLOW = "follow"  # someone else's and live


def next_step(record: LeaseRecord | None, me: str, now: float) -> Step:
    if record is not None and record.holder == me:
        return Step.RENEW
    if record is None or record.expires <= now:
        return Step.TAKE
    return Step.FOLLOW


def successor(record: LeaseRecord | None, step: Step, me: str, now: float, period: float,
              url: str = "") -> LeaseRecord:
    """The record to write for ``step`` (RENEW or TAKE)."""
    generation = record.generation if record is not None else 0
    return LeaseRecord(me, generation if step is Step.RENEW else generation + 1, now + period, url)


def timestamp_version(data: bytes) -> int | None:
    """The version of a timestamp.json's bytes, or None if they are not one."""
    try:
        return int(json.loads(data)["signed"]["version"])
    except (ValueError, KeyError, TypeError):
        return None
