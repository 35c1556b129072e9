"""Keeping the signed tree fresh: page refreshes, timestamp re-signing, old metadata removal.

Every ``tick`` seconds the gateway first applies revocations recorded
since the last tick (:meth:`Gateway.apply_revocations`), then re-fetches the published projects whose
page is older than ``page_ttl`` (fetch times survive restarts:
:mod:`proxy.gateway.fetchtimes`; a priority queue by due time,
:mod:`proxy.gateway.due`, not a scan of every project), most recently used first, at most
``rate`` pages a second, and publishes what changed in one batch.  Online
roles are re-signed (through the same publisher) every eighth of their
lifetime, so the timestamp never expires even when nothing changes.
Every quarter of ``grace`` (at most as seldom as that re-signing),
:class:`Collector` drops metadata versions and page files nothing current
references, ``grace`` after they were superseded (an edge that read the
previous timestamp a moment ago can still finish its refresh), looking
only at the projects re-signed since its last run.  Under ``--workers N`` only the worker holding the
:class:`~proxy.util.locks.Leadership` lock does this (another takes over if it
dies); it first takes up what the other workers signed.  Its "most
recently used" is what its own requests touched: workers share no touches
(docs/concepts/gateway-design.md says so); that changes the order only, and
every due page is still refreshed at the rate bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
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


class _FetchedOrSigned(Mapping[str, float]):
    """When each published project's page was last fetched (monotonic), or where the bounded record of fetch
    times has none (a gateway holding more projects than it keeps), when its page was last signed: the
    plain page's mtime, a bound no later than the fetch.  Past the bound a restart would otherwise find
    those projects due at once whatever ``--page-ttl`` says."""

    def __init__(self, fetched: Mapping[str, float], simple: Path) -> None:
        self.fetched, self.simple = fetched, simple

    def __getitem__(self, project: str) -> float:
        when = self.fetched.get(project)
        if when is not None:
            return when
        try:
            signed = os.stat(self.simple / project / "index.json").st_mtime
        except (FileNotFoundError, NotADirectoryError):
            raise KeyError(project) from None
        return time.monotonic() - max(0.0, time.time() - signed)

    def __iter__(self) -> Iterator[str]:
        return iter(self.fetched)

    def __len__(self) -> int:
        return len(self.fetched)


async def keep_fresh(gateway: Gateway, repo: Repository, *, page_ttl: float, rate: float, tick: float,
                     grace: float, leader: Leadership | None = None) -> None:
    """Run until cancelled; see the module docstring."""
    resign_every = repo.settings.expiry.timestamp.total_seconds() / 8
    # Incremental, so cheap: often enough that nothing outlives --gc-grace by more than a quarter of it.
    collect_every = min(resign_every, max(tick, grace / 4))
    last_resign = last_collect = -float("inf")
    seen: set[str] | None = None
    queue = DueQueue(page_ttl)
    fetched = _FetchedOrSigned(gateway.fetched, repo.public_dir / "simple")
    collector = Collector(repo, grace)
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
        queue.add(gateway.publisher.published - queue.queued, fetched)
        if now - last_resign >= resign_every:
            try:
                await gateway.publisher.resign()
            except Exception as e:  # noqa: BLE001 - keep the loop alive; the next tick retries
                log.error("re-signing online roles failed: %s", e)
            else:
                last_resign = now
        if now - last_collect >= collect_every:
            try:
                await asyncio.to_thread(collector.collect, gateway.publisher.take_touched())
            except Exception as e:  # noqa: BLE001 - keep the loop alive; the next tick retries
                log.error("garbage collection failed: %s", e)
            else:
                last_collect = now
        batch = queue.take(now, fetched, gateway.publisher.published.__contains__, max(1, int(rate * tick)),
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


class Collector:
    """Garbage collection that costs what changed, not what is published.

    Metadata: versions older than the newest superseded one of each role, ``grace`` after they were
    superseded (their successor's write; a scan of the metadata directory, whose size follows the bin
    count, not the projects).  Pages: a hashed
    page name no plain page of its project names any more is noted the first time a collection sees it
    unreferenced, and deleted ``grace`` seconds later if still unreferenced, so an edge that read the
    previous timestamp within ``grace`` still finds every page it names.  Only the projects whose bins were
    re-signed since the last collection (``touched``) are looked at, every project once at the first.
    """

    def __init__(self, repo: Repository, grace: float) -> None:
        self.repo = repo
        self.grace = grace
        self._unreferenced: dict[Path, float] = {}  # hashed page -> when first seen unreferenced (wall clock)
        self._first = True

    def collect(self, touched: Iterable[str], now: float | None = None) -> int:
        """One collection; how many files it removed."""
        now = time.time() if now is None else now
        cutoff = now - self.grace
        gone = _collect_metadata(self.repo, cutoff)
        simple = self.repo.public_dir / "simple"
        if self._first:
            touched = [entry.name for entry in os.scandir(simple) if entry.is_dir()] if simple.is_dir() else []
            # "": simple/ itself, where the hashed root lists an earlier release signed are left unreferenced.
            touched.append("")
            self._first = False
        for project in touched:
            for path in _unreferenced(simple / project):
                self._unreferenced.setdefault(path, now)
        due = [path for path, since in self._unreferenced.items() if since <= cutoff]
        for path in due:
            del self._unreferenced[path]
        # Looked at again, once per project: a page can be current again (a revoked file put back gives the
        # same bytes).
        still: dict[Path, list[Path]] = {}
        for path in due:
            if path.parent not in still:
                still[path.parent] = _unreferenced(path.parent)
        self.repo.removed(gone)  # the bucket's copies go too (proxy.storage.treepush)
        return len(gone) + self.repo.unlink(p for p in due if p in still[p.parent])


def _collect_metadata(repo: Repository, cutoff: float) -> list[Path]:
    """Remove metadata versions no current metadata references (but the newest superseded one); which."""
    timestamp: Metadata[Timestamp] = Metadata.from_bytes((repo.metadata_dir / "timestamp.json").read_bytes())
    snapshot_version = timestamp.signed.snapshot_meta.version
    snapshot: Metadata[Snapshot] = Metadata.from_bytes((repo.metadata_dir / f"{snapshot_version}.snapshot.json").read_bytes())
    current = {"snapshot": snapshot_version} | {k.removesuffix(".json"): v.version for k, v in snapshot.signed.meta.items()}
    versions: dict[str, list[tuple[int, os.DirEntry[str]]]] = {}
    for entry in os.scandir(repo.metadata_dir):
        m = _VERSIONED.fullmatch(entry.name)
        if m is not None and m.group(2) in current and int(m.group(1)) < current[m.group(2)]:
            versions.setdefault(m.group(2), []).append((int(m.group(1)), entry))
    removed = []
    for older in versions.values():
        # The newest superseded version stays: an edge that read the previous timestamp may still want it.  An
        # older one goes grace after it was superseded, which is when its successor was written (its own age
        # says nothing: a version current for a day is as old as that the moment it is replaced).
        ordered = [entry for _, entry in sorted(older, key=lambda v: v[0])]
        for entry, successor in itertools.pairwise(ordered):
            if successor.stat().st_mtime < cutoff:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    for entry in os.scandir(repo.metadata_dir):
        # Temp files of a publish killed mid-write (atomic_write's names).
        if entry.name.startswith(".") and entry.name.endswith(".tmp") and entry.stat().st_mtime < cutoff:
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def _unreferenced(project_dir: Path) -> list[Path]:
    """The hashed pages of a project that its plain pages (the signed ones) do not name."""
    keep = set()
    for plain in ("index.html", "index.json"):
        path = project_dir / plain
        with contextlib.suppress(FileNotFoundError):
            keep |= {f"{file_digest(a, path)}.{plain}" for a in ("sha256", "sha512")}
    try:
        entries = list(os.scandir(project_dir))
    except FileNotFoundError:
        return []
    return [Path(e.path) for e in entries if _HASHED_PAGE.fullmatch(e.name) and e.name not in keep]
