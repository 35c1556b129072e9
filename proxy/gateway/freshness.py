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
only at the projects re-signed since its last run; what it noted survives a restart in a small record
(``run/gc-pending.json``), so its first run after a start also looks only at what was signed since,
not at every project (at 100,000 projects that first look took 39 s).  Under ``--workers N`` only the worker holding the
:class:`~proxy.util.locks.Leadership` lock does this (another takes over if it
dies); it first takes up what the other workers signed.  Its "most
recently used" is what its own requests touched: workers share no touches
(docs/concepts/gateway-design.md says so); that changes the order only, and
every due page is still refreshed at the rate bound.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from packaging.utils import canonicalize_name
from tuf.api.metadata import Metadata, Snapshot

from proxy.gateway.due import DueQueue
from proxy.gateway.service import Gateway
from proxy.protocol.hashing import new_hash
from proxy.repository import Repository, RepositoryError
from proxy.repository.catalog import repository_identity, snapshot_version
from proxy.util.atomic import atomic_write
from proxy.util.locks import Leadership

log = logging.getLogger(__name__)
_VERSIONED = re.compile(r"([0-9]+)\.(.+)\.json")
_HASHED_PAGE = re.compile(r"[0-9a-f]{64,128}\.index\.(html|json)")
# A hashed name's digest length -> the algorithm a gateway signed pages with besides sha256 before it signed one.
_LEGACY_DIGESTS = {128: "sha512"}
RECORD_FORMAT = 1  # of the collector's record (Collector.state)
# Pending pages the record keeps (about 100 bytes each); past that it says so and the next start looks at every
# project instead.
MAX_PENDING = 100_000
# A file's mtime may lag the clock a collection reads (the kernel's coarse clock; 2 s on some filesystems): a page
# written this close before it was noted counts as written after, and is kept one grace longer.
MTIME_SLACK = 2.0


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
                     grace: float, leader: Leadership | None = None, gc_state: Path | None = None) -> None:
    """Run until cancelled; see the module docstring.  ``gc_state``: the collector's record (:class:`Collector`)."""
    resign_every = repo.settings.expiry.timestamp.total_seconds() / 8
    # Incremental, so cheap: often enough that nothing outlives --gc-grace by more than a quarter of it.
    collect_every = min(resign_every, max(tick, grace / 4))
    last_resign = last_collect = -float("inf")
    seen: set[str] | None = None
    queue = DueQueue(page_ttl)
    fetched = _FetchedOrSigned(gateway.fetched, repo.public_dir / "simple")
    collector = Collector(repo, grace, gc_state)
    while True:
        if leader is not None and not leader.held():
            # Led again later, it takes up the record the leader meanwhile wrote, not what it noted before.
            collector = Collector(repo, grace, gc_state)
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
    count, not the projects).  Pages: a hashed page name no plain page of its project names any more is
    noted the first time a collection sees it unreferenced, and deleted ``grace`` seconds later if still
    unreferenced and not written again since (a page made current again and superseded anew is noted
    anew), so an edge that read the previous timestamp within ``grace`` still finds every page it names.
    Only the projects whose bins were re-signed since the last collection (``touched``) are looked at.

    With a ``state`` file, what is noted survives a restart (and a change of leader among workers): each
    collection writes it atomically, with the snapshot version up to which every superseded page is
    noted; the first collection of a new collector takes it up and looks only at the projects whose bins
    moved since that snapshot (read from the bins of both snapshots).  Without the file, or when it is
    damaged, is another repository's, says more was pending than it keeps (:data:`MAX_PENDING`), or its
    snapshot's metadata is gone, the first collection looks at every project once instead, as it always
    did.  A record older than the last collection (a crash before its write) only makes the next one look
    at more projects, never delete sooner: a page's time is when a collection saw it unreferenced.
    """

    def __init__(self, repo: Repository, grace: float, state: Path | None = None) -> None:
        self.repo = repo
        self.grace = grace
        self.state = state
        # Every digest the profile signs a page under; older names are found by their length (_unreferenced).
        self.algorithms = repo.profile.hash_algorithms
        # Project ("" for simple/ itself) -> hashed page name -> when first seen unreferenced (wall clock).
        self._pending: dict[str, dict[str, float]] = {}
        self._first = True
        # The snapshot version the previous collection read: every page superseded up to it is noted, as the
        # touched projects a collection is given cover at least what was signed until the previous one returned.
        self._read: int | None = None
        self._saved: bytes | None = None
        self.looked_at = 0  # project directories the last collection hashed the plain pages of

    def collect(self, touched: Iterable[str], now: float | None = None) -> int:
        """One collection; how many files it removed.  ``touched``: the projects whose bins moved in every
        batch signed since the previous collection returned (:meth:`Catalog.take_touched`)."""
        now = time.time() if now is None else now
        cutoff = now - self.grace
        current = snapshot_version(self.repo)
        simple = self.repo.public_dir / "simple"
        looked = set(touched)
        if self._first:
            # Before metadata collection runs: the versions the record names must still be there to compare.
            moved = self._take_up(current)
            if moved is None:
                self._pending = {}
                looked |= {entry.name for entry in os.scandir(simple) if entry.is_dir()} if simple.is_dir() else set()
                # "": simple/ itself, where the hashed root lists an earlier release signed are left unreferenced.
                looked.add("")
            else:
                looked |= moved
            noted_up_to = current
            self._first = False
        else:
            noted_up_to = self._read if self._read is not None else current
        gone = _collect_metadata(self.repo, cutoff, current)
        for project in looked:
            names = _unreferenced(simple / project, self.algorithms)
            noted = self._pending.pop(project, {})
            if names:
                # A page current again (a revoked file put back gives the same bytes) is no longer pending.
                self._pending[project] = {name: noted.get(name, now) for name in names}
        self.looked_at = len(looked)
        due: list[tuple[str, str]] = []
        for project, noted in list(self._pending.items()):
            if not any(since <= cutoff for since in noted.values()):
                continue
            # Looked at again, once per project, unless this collection just did.
            names = set(noted) if project in looked else _unreferenced(simple / project, self.algorithms)
            self._pending[project] = noted = {name: since for name, since in noted.items() if name in names}
            due += [(project, name) for name, since in noted.items() if since <= cutoff]
        removed = self._remove(simple, due, now)
        for project in [p for p, noted in self._pending.items() if not noted]:
            del self._pending[project]
        self.repo.removed(gone)  # the bucket's copies go too (proxy.storage.treepush)
        self._save(noted_up_to)
        self._read = current
        return len(gone) + removed

    def _remove(self, simple: Path, due: list[tuple[str, str]], now: float) -> int:
        """Delete the due pages not written since they were noted; how many went.  Under the signer's lock: a
        publish putting one back has either not begun or has written it (a newer mtime)."""
        if not due:
            return 0
        gone: list[Path] = []
        with self.repo.locked():
            for project, name in due:
                noted, path = self._pending[project], simple / project / name
                try:
                    written = os.stat(path).st_mtime
                except FileNotFoundError:
                    del noted[name]
                    continue
                if written > noted[name] - MTIME_SLACK:
                    # Current again after it was noted, and superseded since: from now on, as far as we know.
                    noted[name] = now
                    continue
                del noted[name]
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                gone.append(path)
        self.repo.removed(gone)
        return len(gone)

    def _take_up(self, current: int) -> set[str] | None:
        """Take up the record a previous collector left: the projects signed since it (None, said why, if only
        a look at every project will do)."""
        if self.state is None:
            return None
        fallback = "looking at every project once"
        try:
            raw = json.loads(self.state.read_bytes())
        except FileNotFoundError:
            log.info("no record of pages pending collection at %s: %s", self.state, fallback)
            return None
        except (OSError, ValueError) as e:
            log.warning("the record of pages pending collection at %s is unreadable (%s): %s", self.state, e, fallback)
            return None
        try:
            pending, noted_up_to = _parse_record(raw, repository_identity(self.repo))
        except (RepositoryError, KeyError, TypeError, ValueError) as e:
            log.warning("the record of pages pending collection at %s is damaged (%s): %s", self.state, e, fallback)
            return None
        if pending is None:
            log.info("more pages were pending collection than %s keeps (%d): %s", self.state, MAX_PENDING, fallback)
            return None
        if noted_up_to > current:
            log.warning("the record of pages pending collection at %s is of snapshot v%d, later than the current "
                        "v%d (the directory was restored from an older copy?): %s", self.state, noted_up_to, current,
                        fallback)
            return None
        try:
            moved = _moved_projects(self.repo, noted_up_to, current)
        except (RepositoryError, KeyError, TypeError, AttributeError) as e:
            log.info("the projects signed since snapshot v%d cannot be told (%s): %s", noted_up_to, e, fallback)
            return None
        self._pending = pending
        log.info("took up %d page(s) pending collection from %s; %d project(s) signed since snapshot v%d",
                 sum(map(len, pending.values())), self.state, len(moved), noted_up_to)
        return moved

    def _save(self, noted_up_to: int) -> None:
        """Write the record (atomically; unchanged, not rewritten).  A write that fails is said and only makes
        the next start look at more projects: the record left behind is older, not wrong."""
        if self.state is None:
            return
        try:
            identity = repository_identity(self.repo)
        except RepositoryError as e:
            log.warning("cannot record the pages pending collection in %s: %s", self.state, e)
            return
        record: dict[str, object] = {"format": RECORD_FORMAT, "root": identity, "snapshot": noted_up_to}
        entries = sum(map(len, self._pending.values()))
        if entries > MAX_PENDING:
            record["overflow"] = entries  # the next start looks at every project: slower, never a leak
        else:
            record["pending"] = self._pending
        data = json.dumps(record, separators=(",", ":")).encode()
        if data == self._saved:
            return
        try:
            atomic_write(self.state, data, mode=0o640)
        except OSError as e:
            log.warning("cannot record the pages pending collection in %s: %s", self.state, e)
        else:
            self._saved = data


def _parse_record(raw: object, identity: str) -> tuple[dict[str, dict[str, float]] | None, int]:
    """(pending pages, or None if the record overflowed; the snapshot version they are noted up to) of a
    collector's record; KeyError, TypeError or ValueError if it is not one of the repository ``identity``."""
    if not isinstance(raw, dict) or raw.get("format") != RECORD_FORMAT:
        raise ValueError("not a record of this release's format")
    if raw["root"] != identity:
        raise ValueError("a record of another repository (its first root differs)")
    noted_up_to = raw["snapshot"]
    if not isinstance(noted_up_to, int) or isinstance(noted_up_to, bool):
        raise TypeError("snapshot version")
    if "overflow" in raw:
        return None, noted_up_to
    pending: dict[str, dict[str, float]] = {}
    for project, names in raw["pending"].items():
        # Names are joined to simple/ and deleted: nothing but a project directory's hashed pages.
        if project and (canonicalize_name(project) != project or "/" in project):
            raise ValueError(f"project {project[:100]!r}")
        if not isinstance(names, dict):
            raise TypeError(f"pages of {project!r}")
        for name, since in names.items():
            if not _HASHED_PAGE.fullmatch(name) or not isinstance(since, int | float) or isinstance(since, bool):
                raise ValueError(f"page {name[:140]!r} of {project!r}")
        pending[project] = {name: float(since) for name, since in names.items()}
    return pending, noted_up_to


def _moved_projects(repo: Repository, before: int, after: int) -> set[str]:
    """The projects whose page targets differ between snapshots ``before`` and ``after`` (added, changed or
    removed), read from the bins whose version moved.  A bin re-signed only for its expiry (PEP 458's daily
    bin-n) moves no project.  RepositoryError if a file is gone."""
    if before == after:
        return set()
    old = repo.metadata_json("snapshot", before)["signed"]["meta"]
    new = repo.metadata_json("snapshot", after)["signed"]["meta"]
    skip = {"targets.json", f"{repo.profile.bin_delegator}.json"}

    def pages(meta: dict | None, name: str) -> dict[str, object]:
        if meta is None:
            return {}
        return repo.metadata_json(name.removesuffix(".json"), meta["version"])["signed"].get("targets", {})

    moved: set[str] = set()
    for name in (old.keys() | new.keys()) - skip:
        if old.get(name) == new.get(name):
            continue
        was, now = pages(old.get(name), name), pages(new.get(name), name)
        moved.update(p for path in was.keys() | now.keys()
                     if was.get(path) != now.get(path) and (p := repo.profile.page_project(path)) is not None)
    return moved


def _collect_metadata(repo: Repository, cutoff: float, snapshot_version: int) -> list[Path]:
    """Remove metadata versions no current metadata references (but the newest superseded one); which."""
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


def _unreferenced(project_dir: Path, algorithms: tuple[str, ...]) -> set[str]:
    """The names of the hashed pages of a project that its plain pages (the signed ones) do not name.

    A plain page is hashed with the profile's ``algorithms``, and with sha512 only while names of that
    length are there: pages a gateway signed under both digests before it signed sha256 alone stay named
    by their bins until re-signed, and must be kept until then.
    """
    try:
        hashed = [entry.name for entry in os.scandir(project_dir) if _HASHED_PAGE.fullmatch(entry.name)]
    except (FileNotFoundError, NotADirectoryError):
        return set()
    keep: set[str] = set()
    for plain in ("index.html", "index.json"):
        lengths = {len(name) - len(plain) - 1 for name in hashed if name.endswith(f".{plain}")}
        if not lengths:
            continue
        wanted = set(algorithms) | {_LEGACY_DIGESTS[n] for n in lengths if n in _LEGACY_DIGESTS}
        try:
            data = (project_dir / plain).read_bytes()
        except FileNotFoundError:
            continue  # a removed project: every hashed page of it goes
        for algorithm in wanted:
            h = new_hash(algorithm)
            h.update(data)
            keep.add(f"{h.hexdigest()}.{plain}")
    return {name for name in hashed if name not in keep}
