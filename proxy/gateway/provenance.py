"""PEP 740 provenance at the gateway: fetch, verify, pin the publisher, leave files out.

:meth:`ProvenanceGate.screen` is the gateway's one hook (called by
:meth:`proxy.gateway.service.Gateway.fetch` on every listing before it is
rendered and signed).  For each file not yet pinned in the ledger (so
verification runs once per file, at its first publish, never per
request) it fetches the file's provenance object through the index client
(bounded size, timeouts, the index's and ``--files-origin`` origins only,
redirects checked), all of a page's at once, and verifies each
attestation (:meth:`proxy.trust.provenance.SigstoreTrust.verify`, which
also says which Sigstore trust root is used).  :func:`proxy.protocol.provenance.decide` then says which files are
left out; each one gets an audit record (rule, project, file, expected and
seen publisher) and a ``tufproxy_gateway_refusals_total`` label.  The
ledger learns the project's pinned publisher (``kind: publisher``) and, per
file, the verified publisher and the provenance object's sha256 (``kind:
provenance``).  Each verified provenance object is queued as a signed
target beside its page (:func:`proxy.protocol.layout.provenance_target`),
its ``custom`` field naming the verified publisher and the file's sha256,
so edges can serve and re-verify it, and so a ledger that lost a project's
pin gets it back from what is signed (:func:`signed_publisher`) instead of
trusting the next publisher it sees.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Any

from proxy.gateway.ledger import Ledger
from proxy.gateway.listing import Listing
from proxy.gateway.metrics import GatewayMetrics
from proxy.gateway.publisher import Targets
from proxy.protocol import provenance as rules
from proxy.protocol.index import DistFile
from proxy.protocol.layout import provenance_target
from proxy.protocol.options import Option
from proxy.protocol.provenance import Outcome, ProvenancePolicy, PublisherSpec
from proxy.repository import Repository
from proxy.storage.audit import AuditLog
from proxy.transport.indexhttp import IndexHTTP, origin
from proxy.transport.upstream import DownloadError, DownloadLengthError
from proxy.trust.provenance import SIGSTORE_OPTIONS, SigstoreTrust

log = logging.getLogger(__name__)
MAX_PROVENANCE_SIZE = 1 * 2**20  # PyPI's are a few KiB; anything near this is junk
CONCURRENCY = 16
MAX_REMEMBERED = 100_000  # outcomes of files left out, kept so a refresh neither re-verifies nor re-audits them


OPTIONS: tuple[Option, ...] = (
    Option("provenance", "PEP 740: off, verify (invalid provenance leaves a file out), pin (also pin each project's "
           "first verified publisher; files without provenance or from another publisher leave) or require "
           "(every file needs valid provenance)", "pin", rules.parse_mode, metavar="MODE"),
    Option("trusted_publisher", "pin PROJECT's publisher up front: github:OWNER/REPO[@WORKFLOW], "
           "gitlab:NAMESPACE/PROJECT[@WORKFLOW] or google:EMAIL; repeatable", [], rules.parse_trusted_publishers,
           repeat=True, metavar="PROJECT=SPEC"),
    Option("provenance_project", "the --provenance mode for the projects PATTERN matches (first match wins); "
           "repeatable", [], rules.parse_project_modes, repeat=True, metavar="PATTERN=MODE"),
    *SIGSTORE_OPTIONS,
)


def policy_of(values: dict[str, Any]) -> ProvenancePolicy:
    return ProvenancePolicy(values["provenance"], values["trusted_publisher"] or {}, tuple(values["provenance_project"] or ()))


@dataclass(frozen=True)
class LeftOut:
    filename: str
    rule: str
    outcome: Outcome
    expected: PublisherSpec | None


class ProvenanceGate:
    """See the module docstring."""

    def __init__(self, http: IndexHTTP, ledger: Ledger, audit: AuditLog, metrics: GatewayMetrics,
                 policy: ProvenancePolicy, trust: SigstoreTrust, sign: Callable[[Targets], None],
                 max_size: int = MAX_PROVENANCE_SIZE, repo: Repository | None = None,
                 published: AbstractSet[str] | None = None) -> None:
        self.sign = sign  # queues signed targets for the next batch (Publisher.add_targets)
        self.repo = repo  # what is signed: the pins a lost ledger forgot are read back from it
        # The projects signed now (the publisher's catalog): a new one has no signed page to read a pin back from.
        self.published = published
        self.http = http
        self.ledger = ledger
        self.audit = audit
        self.metrics = metrics
        self.policy = policy
        self.trust = trust
        self.max_size = max_size
        self._slots = asyncio.Semaphore(CONCURRENCY)
        # (file URL, filename, sha256, provenance URL) -> outcome, for files not pinned (left out); unavailable
        # ones are not kept (the next refresh tries again), and a left-out file is audited when its rule changes.
        self._outcomes: dict[tuple[str, str, str, str], Outcome] = {}
        self._audited: dict[tuple[str, str], tuple[str, str]] = {}

    def pinned(self, project: str) -> PublisherSpec | None:
        record = self.ledger.publisher(project)
        return rules.parse_spec(record["spec"]) if record else None

    async def screen(self, listing: Listing) -> Listing:
        """``listing`` without the files the policy leaves out; ledger and audit log updated."""
        project = listing.project
        mode = self.policy.mode_for(project)
        if mode == "off":
            return listing
        pins = self.ledger.project(project).pins
        new = [d for d in listing.page.files if d.filename not in pins]
        if not new:
            return listing
        outcomes, fetched = await self._screened(new)
        records: list[dict[str, Any]] = []
        pinned = None
        if mode in ("pin", "require"):
            pinned = self.pinned(project)
            if pinned is None and self.repo is not None and (self.published is None or project in self.published) \
                    and (signed := await asyncio.to_thread(signed_publisher, self.repo, project)) is not None:
                pinned, filename = signed
                log.warning("ledger %s lacked the publisher pin of %s that its signed provenance names (%s, from %s): "
                            "rebuilt it", self.ledger.path, project, pinned, filename)
                records.append({"kind": "publisher", "project": project, "spec": str(pinned), "filename": filename,
                                "accepted": False, "rebuilt": True})
        expected = self.policy.expected(project, pinned)
        left: list[LeftOut] = []
        for dist, outcome in zip(new, outcomes, strict=True):
            rule = rules.decide(mode, expected, outcome)
            if rule is not None:
                left.append(LeftOut(dist.filename, rule, outcome, expected))
                continue
            if outcome.state != "verified":
                continue
            assert outcome.publisher is not None
            if expected is None and mode in ("pin", "require"):
                expected = outcome.publisher  # the first verified publisher: pinned from here on
                records.append({"kind": "publisher", "project": project, "spec": str(expected),
                                "filename": dist.filename, "accepted": False})
            records.append({"kind": "provenance", "project": project, "filename": dist.filename,
                            "publisher": str(outcome.publisher), "sha256": outcome.digest, "url": dist.provenance})
        self.ledger.append(records)
        gone = {out.filename for out in left}
        self.sign({provenance_target(project, d.filename): (data, {"provenance": {
                       "publisher": str(o.publisher), "file": d.filename, "file_sha256": d.hashes["sha256"]}})
                   for d, o, data in zip(new, outcomes, fetched, strict=True)
                   if o.state == "verified" and data is not None and d.filename not in gone})
        for out in left:
            if self._audited.get((project, out.filename)) == (out.rule, out.outcome.detail):
                continue
            if len(self._audited) >= MAX_REMEMBERED:
                self._audited.clear()
            self._audited[(project, out.filename)] = (out.rule, out.outcome.detail)
            fault = self.metrics.refused(out.rule)
            self.audit.refused(reason=out.rule, fault=fault.value, target=f"packages/{project}/{out.filename}", project=project,
                               file=out.filename, expected=str(out.expected) if out.expected else None,
                               seen=str(out.outcome.publisher) if out.outcome.publisher else None,
                               detail=out.outcome.detail or None)
        if not left:
            return listing
        return replace(listing, page=replace(listing.page, files=tuple(d for d in listing.page.files if d.filename not in gone)))

    async def _screened(self, dists: list[DistFile]) -> tuple[list[Outcome], list[bytes | None]]:
        """Each file's outcome, and the provenance object's bytes where they were fetched just now: all of the
        page's fetched at once, then verified together."""
        outcomes: list[Outcome | None] = [None] * len(dists)
        keys = [(d.url, d.filename, d.hashes["sha256"], d.provenance or "") for d in dists]
        for i, dist in enumerate(dists):
            if dist.provenance is None:
                outcomes[i] = Outcome("missing")
            else:
                outcomes[i] = self._outcomes.get(keys[i])
        asked = [i for i, o in enumerate(outcomes) if o is None]
        fetched: list[bytes | None] = [None] * len(dists)
        arrived: list[tuple[int, bytes]] = []
        for i, got in zip(asked, await asyncio.gather(*(self._fetch(dists[i]) for i in asked)), strict=True):
            if isinstance(got, Outcome):
                outcomes[i] = got
            else:
                fetched[i] = got
                arrived.append((i, got))
        checked = await self.trust.check_all([(data, dists[i].filename, dists[i].hashes["sha256"]) for i, data in arrived])
        for (i, _), verified in zip(arrived, checked, strict=True):
            outcomes[i] = verified
        for i in asked:
            if (found := outcomes[i]) is not None and found.state != "unavailable":
                if len(self._outcomes) >= MAX_REMEMBERED:
                    self._outcomes.clear()
                self._outcomes[keys[i]] = found
        done = [o for o in outcomes if o is not None]
        assert len(done) == len(dists)  # every file: missing, known, not fetched, or verified just now
        return done, fetched

    async def _fetch(self, dist: DistFile) -> bytes | Outcome:
        """The file's provenance object, or why there is none to verify."""
        assert dist.provenance is not None
        url = dist.provenance  # absolute and credential-free since the listing was validated
        allowed = (*self.http.index_urls, *self.http.files_origins)
        if not url.startswith(("http://", "https://")) or origin(url) not in {origin(a) for a in allowed}:
            return Outcome("invalid", f"provenance at {origin(url)[:200]}, neither the index nor a --files-origin")
        async with self._slots:
            try:
                async with self.http.get(url, self.max_size, allowed, accept="application/json") as response:
                    return b"".join([chunk async for chunk in response.body])
            except DownloadLengthError:
                return Outcome("invalid", f"provenance object larger than {self.max_size} bytes")
            except DownloadError as e:
                return Outcome("unavailable", f"provenance not fetched: {str(e)[:300]}")


def signed_publisher(repo: Repository, project: str) -> tuple[PublisherSpec, str] | None:
    """The publisher the signed provenance targets of ``project``'s signed page name, and from which file: the
    newest upload's (a change accepted later names the new one).  None if nothing signed names one."""
    page = repo.current_page(project)
    if page is None:
        return None
    signed = repo.signed_targets(provenance_target(project, f.filename) for f in page.files)
    named: list[tuple[str, int, PublisherSpec, str]] = []
    for order, dist in enumerate(page.files):
        info = signed.get(provenance_target(project, dist.filename))
        custom = info.unrecognized_fields.get("custom") if info is not None else None
        spec = custom.get("provenance", {}).get("publisher") if isinstance(custom, dict) else None
        try:
            named.append((dist.upload_time or "", order, rules.parse_spec(spec), dist.filename))
        except ValueError:
            continue  # not ours to guess: an entry that names no valid publisher pins nothing
    if not named:
        return None
    _, _, spec, filename = max(named)
    return spec, filename
