"""Keeping the signed tree fresh: page refreshes, timestamp re-signing, old metadata removal.

Every ``tick`` seconds the gateway first applies revocations recorded
since the last tick (:meth:`Gateway.apply_revocations`), then re-fetches the published projects whose
page is older than ``page_ttl`` (fetch times survive restarts:
:mod:`proxy.gateway.fetchtimes`; a priority queue by due time,
:mod:`proxy.gateway.due`, not a scan of every project), most recently used first, at most
``rate`` pages a second, and publishes what changed in one batch.  Online
roles are re-signed (through the same publisher) every eighth of their
lifetime, so the timestamp never expires even when nothing changes.
After that, :func:`collect_garbage` drops metadata versions and page
files nothing current references, once they are older than ``grace``
(an edge that read the previous timestamp a moment ago can still finish
its refresh).  Under ``--workers N`` only the worker holding the
:class:`~proxy.util.locks.Leadership` lock does this (another takes over if it
dies); it first takes up what the other workers signed.  Its "most
recently used" is what its own requests touched: workers share no touches
(docs/concepts/gateway-design.md says so); that changes the order only, and
every due page is still refreshed at the rate bound.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from pathlib import Path

from tuf.api.metadata import Metadata, Snapshot, Timestamp

from proxy.gateway.due import DueQueue
from proxy.gateway.service import Gateway
from proxy.protocol.model import file_digest
from proxy.repository import Repository
from proxy.util.locks import Leadership

log = logging.getLogger(__name__)
_VERSIONED = re.compile(r"([0-9]+)\.(.+)\.json")
_HASHED_PAGE = re.compile(r"[0-9a-f]{64,128}\.index\.(html|json)")


async def keep_fresh(gateway: Gateway, repo: Repository, *, page_ttl: float, rate: float, tick: float,
                     grace: float, leader: Leadership | None = None) -> None:
    """Run until cancelled; see the module docstring."""
    resign_every = repo.settings.expiry.timestamp.total_seconds() / 8
    last_resign = -float("inf")
    seen: set[str] | None = None
    queue = DueQueue(page_ttl)
    while True:
        if leader is not None and not leader.held():
            await asyncio.sleep(tick)
            continue
        gateway.publisher.reload()
        try:
            await gateway.apply_revocations()
        except Exception as e:  # noqa: BLE001 - keep the loop alive; the next tick retries
            log.error("applying revocations failed: %s", e)
        now = time.monotonic()
        # What was signed before we led is due when its fetch time says; what another worker signs since was
        # fetched just now.
        if seen is None:
            seen = set(gateway.publisher.published)
        for project in gateway.publisher.published - seen:
            gateway.fetched.setdefault(project, now)
        seen |= gateway.publisher.published
        queue.add(gateway.publisher.published - queue.queued, gateway.fetched)
        if now - last_resign >= resign_every:
            try:
                await gateway.publisher.resign()
                await asyncio.to_thread(collect_garbage, repo, grace)
            except Exception as e:  # noqa: BLE001 - keep the loop alive; the next tick retries
                log.error("re-signing online roles failed: %s", e)
            else:
                last_resign = now
        batch = queue.take(now, gateway.fetched, gateway.publisher.published.__contains__, max(1, int(rate * tick)),
                           lambda p: gateway.used.get(p, 0.0))
        if batch:
            try:
                changed = await gateway.refresh(batch)
                # Said when something changed; an unchanged check every tick is only for debugging.
                log.log(logging.INFO if changed else logging.DEBUG, "re-signed %d of %d page(s) checked; %d unchanged",
                        changed, len(batch), len(batch) - changed)
            except Exception as e:  # noqa: BLE001 - keep the loop alive; the next tick retries
                log.error("page refresh failed: %s", e)
        await asyncio.sleep(tick)


def collect_garbage(repo: Repository, grace: float) -> int:
    """Remove metadata versions and hashed pages no current metadata references; how many files."""
    cutoff = time.time() - grace
    timestamp: Metadata[Timestamp] = Metadata.from_bytes((repo.metadata_dir / "timestamp.json").read_bytes())
    snapshot_version = timestamp.signed.snapshot_meta.version
    snapshot: Metadata[Snapshot] = Metadata.from_bytes((repo.metadata_dir / f"{snapshot_version}.snapshot.json").read_bytes())
    current = {"snapshot": snapshot_version} | {k.removesuffix(".json"): v.version for k, v in snapshot.signed.meta.items()}
    versions: dict[str, list[tuple[int, os.DirEntry[str]]]] = {}
    for entry in os.scandir(repo.metadata_dir):
        m = _VERSIONED.fullmatch(entry.name)
        if m is not None and m.group(2) in current and int(m.group(1)) < current[m.group(2)]:
            versions.setdefault(m.group(2), []).append((int(m.group(1)), entry))
    removed = 0
    for older in versions.values():
        # The newest superseded version stays: an edge that read the previous timestamp may still want it.
        for _, entry in sorted(older, key=lambda v: v[0])[:-1]:
            if entry.stat().st_mtime < cutoff:
                os.unlink(entry.path)
                removed += 1
    for entry in os.scandir(repo.metadata_dir):
        # Temp files of a publish killed mid-write (atomic_write's names).
        if entry.name.startswith(".") and entry.name.endswith(".tmp") and entry.stat().st_mtime < cutoff:
            os.unlink(entry.path)
            removed += 1
    simple = repo.public_dir / "simple"
    for project in (simple.iterdir() if simple.is_dir() else ()):
        if project.is_dir():
            removed += _collect_pages(project, cutoff)
    return removed


def _collect_pages(project_dir: Path, cutoff: float) -> int:
    keep = set()
    for plain in ("index.html", "index.json"):
        path = project_dir / plain
        if path.is_file():
            keep |= {f"{file_digest(a, path)}.{plain}" for a in ("sha256", "sha512")}
    removed = 0
    for entry in os.scandir(project_dir):
        if _HASHED_PAGE.fullmatch(entry.name) and entry.name not in keep and entry.stat().st_mtime < cutoff:
            os.unlink(entry.path)
            removed += 1
    return removed
