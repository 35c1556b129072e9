"""The gateway's decisions: publish a project, refresh it, revoke it.

:class:`Gateway` ties the index client, the ledger, the page pipeline and
the batched publisher together, with no HTTP of its own (``app.py`` is
the HTTP face).  :meth:`Gateway.ensure` is the miss protocol's core: the
project is fetched, rendered and signed once however many callers ask
(single-flight per project), and they all get the timestamp version that
carries it.  Under ``--workers N`` the single flight spans the workers: a
cross-process lock per project (:class:`~proxy.util.locks.FetchLocks`) is held
while its page is fetched and signed, and a worker that waited for it
re-reads what was signed (:meth:`Publisher.reload`) before fetching, so
the index is asked once.

The policy (:mod:`proxy.gateway.policy`) is applied here before anything
is signed: a project it denies is a 404 with an audit record, and is
unpublished at its next refresh if it was signed before; a page it
trimmed gets one audit record each time what it hides changes, and the
``tufproxy_gateway_policy_hidden_files`` gauge counts what it hides now.
Files an imported OSV advisory blocks (:mod:`proxy.gateway.advisories`)
leave the page the same way, each with its own audit record, and
:meth:`Gateway.watch_advisories` republishes at once the projects an
import changes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from proxy.gateway.advisories import AdvisoryWatch
from proxy.gateway.fetchtimes import FetchTimes
from proxy.gateway.ledger import Ledger
from proxy.gateway.listing import IGNORED, IndexClient, Listing, PageRefused
from proxy.gateway.metrics import GatewayMetrics
from proxy.gateway.pages import Rendered, quarantined, render, withheld
from proxy.gateway.policy import FILE_RULES, RULE_PRIVATE, Policy, Refusal, Trimmed
from proxy.gateway.prefetch import Keep, Prefetcher, Wave
from proxy.gateway.provenance import ProvenanceGate
from proxy.gateway.publisher import Foresight, Publisher, signed_page
from proxy.protocol import index
from proxy.protocol.access import not_listed
from proxy.protocol.errors import Fault
from proxy.protocol.osv import RULES as ADVISORY_RULES
from proxy.protocol.osv import Block
from proxy.storage.audit import AuditLog
from proxy.util import timing
from proxy.util.locks import FetchLocks, Leadership
from proxy.util.recent import Recent

log = logging.getLogger(__name__)
ABSENT_TTL = 60.0
# Bounds on what the gateway remembers per project name (oldest evicted first): names come from
# unauthenticated requests, so every structure keyed by them is bounded (tufproxy_gateway_usage_entries).
MAX_ABSENT = 10_000
MAX_TRACKED = 100_000
# Past this, a worker stops waiting for another's publish of the same project and fetches it too.
PUBLISH_LOCK_WAIT = 60.0
# Projects an advisory change republishes per round (a second): each is one index fetch.
REPUBLISH_BATCH = 100


def rebuild_pins(ledger: Ledger, public_dir: Path, projects: Iterable[str]) -> tuple[int, int]:
    """Append the pins the signed pages of ``projects`` list and the ledger lacks; (pins, projects)."""
    records: list[dict[str, Any]] = []
    touched = 0
    for project in projects:
        signed = signed_page(public_dir, project)
        missing = ledger.missing_pins(project, signed) if signed is not None else []
        if missing:
            touched += 1
            records += ledger.pin_records(missing)
    ledger.append(records)
    return len(records), touched


class NotListed(Exception):
    """No configured index lists the project (or it is revoked)."""

    reason = "not-found"
    fault = Fault.NOT_FOUND


@dataclass(frozen=True)
class Published:
    project: str
    timestamp_version: int
    foresight: Foresight | None = None  # what the edge's next lookup reads, if this process signed it lately


class Gateway:
    """See the module docstring."""

    def __init__(self, client: IndexClient, ledger: Ledger, publisher: Publisher, audit: AuditLog,
                 metrics: GatewayMetrics, policy: Policy = Policy(), locks: FetchLocks | None = None,
                 prefetch_depth: int = 0, prefetch_max: int = 0,
                 advisories: AdvisoryWatch | None = None, provenance: ProvenanceGate | None = None,
                 fetch_times: Path | None = None, read_ahead: Keep | None = None) -> None:
        self.client = client
        self.locks = locks
        self.ledger = ledger
        self.publisher = publisher
        # accept() appends a page's pins unsynced: the batch that signs the page makes them durable first.
        if ledger.path not in publisher.flush_also:
            publisher.flush_also += (ledger.path,)
        self.audit = audit
        self.metrics = metrics
        self.policy = policy
        self.provenance = provenance
        self._inflight: dict[str, asyncio.Future[Published]] = {}
        self._asked: set[str] = set()  # of those in flight, the ones a client waits for (the others: prefetches)
        # Published projects by last use, and when each page was last fetched (monotonic).
        self.used = Recent(MAX_TRACKED)
        self.fetched = FetchTimes(MAX_TRACKED, fetch_times)  # kept across restarts when given a path
        # Projects no index listed, and when: a stream of misses for absent names costs one index fetch a minute.
        self._absent = Recent(MAX_ABSENT)
        self._hidden: dict[str, Trimmed] = {}  # what the policy hides now, by project
        # Revocations this process has applied (those recorded before it started were signed by the command).
        self._revocations = set(ledger.revoked)
        self.prefetcher = Prefetcher(self._fetch_bytes, self._prefetch, prefetch_depth, prefetch_max,
                                     lambda outcome: metrics.prefetches.labels(outcome).inc(),
                                     keep=read_ahead)
        self.advisories = advisories
        self._blocked: dict[str, tuple[Block, ...]] = {}  # what advisories block now, by project

    def touch(self, project: str) -> None:
        """Record a use of a published project (the refresh order); any other name is not recorded."""
        if project in self.publisher.published:
            self.used[project] = time.monotonic()

    def usage_sizes(self) -> dict[str, int]:
        """Entries of each per-name structure (the ``tufproxy_gateway_usage_entries`` gauge)."""
        return {"used": len(self.used), "fetched": len(self.fetched), "absent": len(self._absent)}

    async def ensure(self, name: str, prefetch: Wave | None = None) -> Published:
        """Publish ``name`` if it is not yet; the timestamp version carrying it. NotListed or PageRefused otherwise.

        ``prefetch`` (where it stands) marks a dependency prefetch rather than a client's request.
        """
        project = canonicalize_name(name)
        self.ledger.reload()
        if self.ledger.is_revoked(project):
            raise NotListed(f"{project} is revoked at this gateway")
        refusal = self.policy.admit(project)
        if refusal is not None:
            self._refused_by_policy(project, refusal)
            raise NotListed(refusal.message)
        if project not in self.publisher.published:
            self.publisher.reload()  # another worker may have signed it
        if project in self.publisher.published:
            self.touch(project)
            return self._published(project, self.publisher.timestamp_version)
        if time.monotonic() - self._absent.get(project, -ABSENT_TTL) < ABSENT_TTL:
            raise NotListed(not_listed(project))
        future = self._inflight.get(project)
        joining = future is not None
        if future is None:
            future = asyncio.ensure_future(self._publish_new(project, prefetch))
            self._inflight[project] = future
            future.add_done_callback(lambda f: self._settled(project))
        if prefetch is None and project not in self._asked:  # a client waits for it
            self._asked.add(project)
            if joining:  # a guess under way: its batch waits for no other guess now, a client's waits for it
                self.publisher.urge(project)
        # shield: a caller that gives up does not cancel the publish others wait for.
        return await asyncio.shield(future)

    def _settled(self, project: str) -> None:
        self._inflight.pop(project, None)
        self._asked.discard(project)

    def _published(self, project: str, version: int) -> Published:
        """The answer to a publish of ``project``: the version carrying it, and what an edge reads next."""
        return Published(project, version, self.publisher.foresight(project))

    async def _publish_new(self, project: str, prefetch: Wave | None) -> Published:
        if self.locks is None:
            return await self._fetch_and_publish(project, prefetch)
        async with self.locks.hold(f"publish {project}", wait=PUBLISH_LOCK_WAIT):
            self.publisher.reload()
            if project in self.publisher.published:  # a worker we waited for signed it
                return self._published(project, self.publisher.timestamp_version)
            self.ledger.reload()
            return await self._fetch_and_publish(project, prefetch)

    async def _fetch_and_publish(self, project: str, prefetch: Wave | None) -> Published:
        # A guess (prefetch) holds no client's batch back, until a client asks for it (ensure: urge).
        with timing.phase("index"), self.publisher.preparing(project, urgent=project in self._asked):
            listing = await self.fetch(project)
        accepting = time.monotonic()
        if isinstance(listing, Listing) and (refusal := quarantined(listing)) is not None:
            self._refused_by_policy(project, refusal)
            listing = refusal  # remembered as absent, like a project no index lists
        if isinstance(listing, Refusal):
            if listing.rule == RULE_PRIVATE:
                self._refused_by_policy(project, listing)
            if listing.kind is Fault.NOT_FOUND:
                self._absent[project] = time.monotonic()
            raise NotListed(listing.message)
        rendered = self.accept(listing)
        kept = {f.filename for f in rendered.page.files}
        # Dependencies are read from the files the policy let through, at the index's own URLs.
        self.prefetcher.schedule(dataclasses.replace(listing.page, files=tuple(
            f for f in listing.page.files if f.filename in kept)), prefetch or self.prefetcher.first_wave())
        timing.record("accept", time.monotonic() - accepting)
        # Under --workers a guess's batch waits for no other guess: it holds the cross-process lock on the project
        # (_publish_new), which a client on another worker waits for without any way to urge it.
        signed = await self.publisher.publish({project: rendered.page},
                                              urgent=project in self._asked or self.locks is not None)
        for name, seconds in (("batch-wait", signed.waited), ("sign", signed.signing), ("write", signed.writing)):
            timing.record(name, seconds)
        self.touch(project)
        return self._published(project, signed.version)

    async def _prefetch(self, name: str, wave: Wave) -> None:
        """Publish a dependency as a request would (policy, pins, checks); never raise."""
        try:
            await self.ensure(name, wave)
        except (NotListed, PageRefused):
            self.metrics.prefetches.labels("refused").inc()
        else:
            self.metrics.prefetches.labels("published").inc()

    async def _fetch_bytes(self, url: str, limit: int) -> bytes:
        """A file of an index (prefetch reads metadata): bounded, from an allowed origin, credentials kept to it."""
        async with self.client.http.get(url, limit, (*self.client.index_urls, *self.client.files_origins)) as response:
            return b"".join([chunk async for chunk in response.body])

    async def fetch(self, project: str) -> Listing | Refusal:
        """The project's listing from the index the policy picks, or why none may supply it; refusals audited."""
        try:
            listing = await self.client.listing(project, self.policy, only=self.ledger.index_of(project))
        except PageRefused as e:
            self.metrics.pages_fetched.labels("refused" if e.reason != "upstream-unreachable" else "unreachable").inc()
            fault = self.metrics.refused(e.reason, e.fault)
            self.audit.refused(reason=e.reason, fault=fault.value, target=f"simple/{project}/", upstream_url=e.url,
                               detail=str(e))
            raise
        if isinstance(listing, Listing) and self.provenance is not None:
            listing = await self.provenance.screen(listing)  # PEP 740: files left out before render and signing
        if isinstance(listing, Listing) or project in self.publisher.published:
            self.fetched.record(project)
        self.metrics.pages_fetched.labels("ok" if isinstance(listing, Listing) else "not-found").inc()
        return listing

    def _refused_by_policy(self, project: str, refusal: Refusal) -> None:
        fault = self.metrics.refused(refusal.rule, refusal.kind)
        self.audit.refused(reason=refusal.rule, fault=fault.value, target=f"simple/{project}/", detail=refusal.message)

    def _record_trimmed(self, project: str, trimmed: Trimmed | None) -> None:
        """One audit record when what the policy hides from a page changes; the gauge by rule."""
        before = self._hidden.pop(project, None)
        if trimmed is not None and trimmed.hidden:
            self._hidden[project] = trimmed
            if before is None or before.hidden != trimmed.hidden:
                self.audit.refused(reason="policy-hidden", target=f"simple/{project}/", **trimmed.audit_fields())
        totals = Counter[str]()
        for kept in self._hidden.values():
            totals.update(kept.by_rule())
        for rule in FILE_RULES:
            self.metrics.policy_hidden.labels(rule).set(totals[rule])

    async def why(self, project: str) -> dict[str, Any]:
        """What a publish of ``project`` would offer now and what the policy would hide, by which rule (for
        ``tufproxy why``); reads the index as a publish does, records and signs nothing."""
        project = canonicalize_name(project)
        answer: dict[str, Any] = {"project": project, "revoked": self.ledger.is_revoked(project)}
        refusal = self.policy.admit(project)
        if refusal is None:
            try:
                listing = await self.client.listing(project, self.policy, only=self.ledger.index_of(project))
            except PageRefused as e:
                return {**answer, "refused": f"{e.reason}: {e}", "rule": e.reason}
            if isinstance(listing, Refusal):
                refusal = listing
            else:
                trimmed = self.policy.apply(listing.page, datetime.now(UTC))
                hidden = [dataclasses.asdict(h) for h in trimmed.hidden]
                offered = []
                advisories = self.advisories.advisories if self.advisories is not None else None
                for dist in trimmed.page.files:
                    if self.ledger.is_revoked(project, dist.filename):
                        hidden.append({"filename": dist.filename, "rule": "revoked", "upload_time": dist.upload_time})
                    elif (block := withheld(advisories, self.policy, project, dist,
                                            self.ledger.pins.get((project, dist.filename)))) is not None \
                            and not block.allowed:
                        hidden.append({"filename": dist.filename, "rule": block.rule, "advisory": block.id,
                                       "upload_time": dist.upload_time})
                    else:
                        offered.append(dist.filename)
                return {**answer, "offered": offered, "hidden": hidden,
                        "cutoff": trimmed.cutoff.when.isoformat() if trimmed.cutoff else None}
        return {**answer, "refused": refusal.message, "rule": refusal.rule}

    def _record_blocked(self, project: str, blocked: list[Block]) -> None:
        """One audit record per file an advisory newly blocks; the gauge of blocks in force by rule."""
        before = set(self._blocked.pop(project, ()))
        if blocked:
            self._blocked[project] = tuple(blocked)
        for block in blocked:
            if block in before:
                continue
            if block.allowed:  # the organisation accepted this risk: served, and on the record
                self.audit.refused(reason="advisory-allowed", target=f"packages/{project}/{block.filename}",
                                   detail=f"advisory {block.id} accepted by --allow-advisory", **block.audit_fields())
                continue
            fault = self.metrics.refused(block.rule)
            self.audit.refused(reason=block.rule, fault=fault.value, target=f"packages/{project}/{block.filename}",
                               detail=f"blocked by advisory {block.id}", **block.audit_fields())
        totals = Counter(b.rule for blocks in self._blocked.values() for b in blocks if not b.allowed)
        for rule in ADVISORY_RULES:
            self.metrics.advisory_blocks.labels(rule).set(totals[rule])

    def accept(self, listing: Listing) -> Rendered:
        """Render ``listing`` and record what it pins and what it refused, before it is signed."""
        rebuilt, _ = rebuild_pins(self.ledger, self.publisher.repo.public_dir, [listing.project])
        if rebuilt:
            log.warning("ledger %s lacked %d pin(s) of %s that its signed page lists: rebuilt them from the signed page",
                        self.ledger.path, rebuilt, listing.project)
        advisories = self.advisories.advisories if self.advisories is not None else None
        rendered = render(listing, self.ledger, self.policy, datetime.now(UTC), advisories)
        self._record_trimmed(listing.project, rendered.trimmed)
        self._record_blocked(listing.project, rendered.blocked)
        records = self.ledger.seen_records(listing.project, rendered.new_seen) + self.ledger.pin_records(rendered.new_pins)
        if self.ledger.index_of(listing.project) is None:
            records.insert(0, {"kind": "project", "project": listing.project, "index": listing.index_url})
        # Made durable by the signing batch that publishes the page, before its commit point (the publisher's
        # flush_also, set in __init__): a page never names a pin a power loss could take back, and a miss does not
        # wait for an fsync of its own on the loop.
        self.ledger.append(records, durable=False)
        for changed in rendered.changed:
            self.metrics.pins_refused.inc()
            fault = self.metrics.refused("upstream-changed-file")
            self.audit.refused(reason="upstream-changed-file", fault=fault.value,
                               target=f"packages/{listing.project}/{changed.pin.filename}", upstream_url=changed.pin.url,
                               expected={"hashes": changed.pin.hashes, "size": changed.pin.size},
                               actual={"hashes": changed.hashes, "size": changed.size})
        ignored = [filename for filename, reason in listing.dropped if reason == IGNORED]
        if ignored:
            # Left out by design (old .egg files, names of another project): one line, not an audit record each.
            self.metrics.ignored_files.inc(len(ignored))
            log.info("%s: left out %d entr%s that are not distributions of %s (e.g. %s)", listing.page_url or
                     listing.index_url, len(ignored), "y" if len(ignored) == 1 else "ies", listing.project, ignored[0])
        for filename, reason in listing.dropped:
            if reason != IGNORED:
                fault = self.metrics.refused(reason)
                self.audit.refused(reason=reason, fault=fault.value, target=f"packages/{listing.project}/{filename}",
                                   upstream_url=listing.page_url or listing.index_url)
        return rendered

    async def apply_revocations(self) -> int:
        """Unpublish what revocations recorded since the last call name, in one publish; one log line each.

        ``tufproxy gateway revoke`` beside a running gateway records the
        revocation and waits for the timestamp this publishes.
        """
        self.ledger.reload()
        new = sorted(self.ledger.revoked - self._revocations, key=lambda r: (r[0], r[1] or ""))
        if not new:
            return 0
        pages: dict[str, index.ProjectPage | None] = {}
        for project, _ in new:
            if project not in self.publisher.published or project in pages:
                continue
            signed = None if self.ledger.is_revoked(project) else signed_page(self.publisher.repo.public_dir, project)
            pages[project] = signed and dataclasses.replace(
                signed, files=tuple(f for f in signed.files if not self.ledger.is_revoked(project, f.filename)))
        version = (await self.publisher.publish(pages)).version if pages else self.publisher.timestamp_version
        self._revocations |= set(new)
        for project, filename in new:
            log.info("revocation applied: %s %s (timestamp v%d)", project, filename or "(whole project)", version)
        return len(new)

    async def refresh(self, projects: list[str]) -> int:
        """Re-fetch ``projects`` and publish them in one batch (the signer skips unchanged pages); how many of
        them were signed anew (changed, or unpublished)."""
        self.ledger.reload()
        pages: dict[str, index.ProjectPage | None] = {}
        for project, result in zip(projects, await asyncio.gather(*(self._fresh_page(p) for p in projects)), strict=True):
            if isinstance(result, Refusal):
                # Denied or claimed since it was signed (a new rule): unpublished now.
                self._refused_by_policy(project, result)
                self._record_trimmed(project, None)
                pages[project] = None
            elif result is not None:
                pages[project] = result
        if not pages:
            return 0
        version = (await self.publisher.publish(pages)).version
        return sum(1 for p in pages if self.publisher.resigned_at.get(p) == version)

    async def watch_advisories(self, interval: float = 1.0, leader: Leadership | None = None) -> None:
        """Run until cancelled: reload the advisory store when it changes and republish the published
        projects it names at once (all of them the first time: the rules may have changed since they
        were signed).  Under workers, every worker reloads; the leader republishes."""
        if self.advisories is None:
            return
        due = set(self.advisories.advisories.projects())
        while True:
            due |= self.advisories.check()
            if due and (leader is None or leader.held()):
                self.publisher.reload()
                # A project being published now may have been rendered with the old set: it is due next time.
                # At most REPUBLISH_BATCH a round: the first round after a start may name thousands.
                published = sorted(due & self.publisher.published)
                batch, rest = published[:REPUBLISH_BATCH], published[REPUBLISH_BATCH:]
                due = (due & self._inflight.keys()) | set(rest)
                if batch:
                    try:
                        changed = await self.refresh(batch)
                        log.info("advisories changed: republished %d of %d project(s)", changed, len(batch))
                    except Exception as e:  # noqa: BLE001 - keep watching; the page ttl refreshes them anyway
                        log.error("republishing after an advisory change failed: %s", e)
            elif leader is not None and not leader.held():
                due = set()
            await asyncio.sleep(interval)

    def _withhold_from_signed(self, project: str) -> index.ProjectPage | None:
        """The signed page less the files advisories now block, when there are any (else None: keep it)."""
        advisories = self.advisories.advisories if self.advisories is not None else None
        page = self.publisher.repo.current_page(project) if advisories and project in advisories.projects() else None
        if page is None:
            return None
        blocked = [b for d in page.files if (b := withheld(advisories, self.policy, project, d, None)) is not None
                   and not b.allowed]
        if not blocked:
            return None
        self._record_blocked(project, blocked)
        gone = {b.filename for b in blocked}
        return dataclasses.replace(page, files=tuple(f for f in page.files if f.filename not in gone))

    async def _fresh_page(self, project: str) -> index.ProjectPage | Refusal | None:
        if self.ledger.is_revoked(project):
            return None
        refusal = self.policy.admit(project)
        if refusal is not None:
            return refusal
        try:
            listing = await self.fetch(project)
        except PageRefused:
            # An unreachable or lying index never unpublishes what is signed, nor delays a block.
            return self._withhold_from_signed(project)
        if isinstance(listing, Refusal) and listing.rule == RULE_PRIVATE:
            return listing
        if isinstance(listing, Listing) and (refusal := quarantined(listing)) is not None:
            return refusal
        if isinstance(listing, Refusal):
            # The index no longer lists it: its files leave the signed page.
            listing = Listing(project, self.ledger.index_of(project) or "", index.ProjectPage(name=project, files=()))
        return self.accept(listing).page
