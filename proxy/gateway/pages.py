"""From an index's listing to the page the gateway signs.

:func:`render` is the one place that decides what a project's signed page
says.  In order: each file listed for the first time gets the time its
cooldown counts from (:meth:`Policy.counts_from`, remembered in the
ledger); the policy (:mod:`proxy.gateway.policy`) leaves out the
files uploaded after its cut-off at the time given, and the PEP 700
versions it left with no file; revoked files leave; files an imported
OSV advisory blocks under the policy's advisory rules leave
(:func:`withheld`); pinned files keep
their pinned hashes and size (so a listed file whose contents differ from
its pin stays signed as pinned; the change is reported, never signed).
Every link is rewritten to the gateway's own relative ``../../packages/<p>/<file>``,
every field pip and uv use is kept (requires-python, yanked and reason,
PEP 658/714 core-metadata hashes, PEP 700 size, upload-time, versions,
PEP 792 project status and reason).  A project its index marks
``quarantined`` is not rendered at all (:func:`quarantined`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime

from proxy.gateway.ledger import Ledger, Pin, Project
from proxy.gateway.listing import Listing
from proxy.gateway.policy import Policy, Refusal, Trimmed
from proxy.protocol import index
from proxy.protocol.errors import Fault
from proxy.protocol.hashing import ACCEPTED
from proxy.protocol.layout import PROVENANCE_SUFFIX, page_file_href
from proxy.protocol.osv import AdvisorySet, Block


@dataclass(frozen=True)
class Changed:
    """A pinned file the index now lists with other contents."""

    pin: Pin
    hashes: dict[str, str]
    size: int | None


@dataclass
class Rendered:
    """A page ready to sign, and what the ledger and audit log must learn from it."""

    page: index.ProjectPage
    trimmed: Trimmed
    new_pins: list[Pin] = field(default_factory=list)
    new_seen: dict[str, datetime | None] = field(default_factory=dict)  # files listed for the first time
    changed: list[Changed] = field(default_factory=list)
    blocked: list[Block] = field(default_factory=list)  # left out, or kept under --allow-advisory (``allowed``)


def _accepted(hashes: dict[str, str]) -> dict[str, str]:
    return {a: v for a, v in hashes.items() if a in ACCEPTED}


RULE_QUARANTINED = "project-quarantined"


def quarantined(listing: Listing) -> Refusal | None:
    """PEP 792: an index must offer no file of a quarantined project; neither do we (and we unpublish it)."""
    if listing.page.status != "quarantined":
        return None
    why = f": {listing.page.status_reason}" if listing.page.status_reason else ""
    return Refusal(Fault.NOT_FOUND, RULE_QUARANTINED, f"{listing.project}: quarantined by its index{why}")


def withheld(advisories: AdvisorySet | None, policy: Policy, project: str, dist: index.DistFile, pin: Pin | None) -> Block | None:
    """The advisory block on this file, by its name or by its listed or pinned sha256; None if it may stay."""
    if advisories is None or not len(advisories):
        return None
    hashes = {h for h in (pin.hashes.get("sha256") if pin else None, dist.hashes.get("sha256")) if h}
    return advisories.block(policy.advisory_rules, project, dist.filename, hashes)


def _first_sight(listing: Listing, known: Project, policy: Policy,
                 now: datetime) -> tuple[dict[str, datetime | None], dict[str, datetime | None]]:
    """When each listed file's cooldown counts from, and which of them are listed for the first time."""
    listed_before = known.listed
    counted: dict[str, datetime | None] = {}
    new: dict[str, datetime | None] = {}
    for dist in listing.page.files:
        if dist.filename in known.seen:
            counted[dist.filename] = known.seen[dist.filename]
        elif dist.filename in known.pins:
            counted[dist.filename] = None  # pinned before first sights were recorded: as it was published
        else:
            counted[dist.filename] = new[dist.filename] = policy.counts_from(dist.upload_time, now, listed_before)
    return counted, new


def render(listing: Listing, ledger: Ledger, policy: Policy, now: datetime, advisories: AdvisorySet | None = None) -> Rendered:
    """The page to sign for ``listing`` at ``now``; see the module docstring."""
    project = listing.project
    known = ledger.project(project)
    counted, new_seen = _first_sight(listing, known, policy, now)
    trimmed = policy.apply(listing.page, now, counted)
    listing = dataclasses.replace(listing, page=trimmed.page)
    out = Rendered(page=index.ProjectPage(name=project, files=()), trimmed=trimmed, new_seen=new_seen)
    files: list[index.DistFile] = []
    for dist in listing.page.files:
        if ledger.is_revoked(project, dist.filename):
            continue
        hashes = _accepted(dist.hashes)
        core = _accepted(dist.core_metadata) if isinstance(dist.core_metadata, dict) else {}
        pin = known.pins.get(dist.filename)
        if pin is None:
            pin = Pin(project, dist.filename, hashes, dist.size, listing.index_url, dist.url, core or None)
            out.new_pins.append(pin)
        elif pin.differs_from(hashes, dist.size):
            # The pinned entry stays signed; the index's new contents never are.
            out.changed.append(Changed(pin, hashes, dist.size))
        elif not pin.url:  # rebuilt from the signed page: the same contents, now with the index's URL
            out.new_pins.append(dataclasses.replace(pin, url=dist.url, index=listing.index_url))
        # Pinned even when blocked: the ledger remembers every file seen (what a lifted block brings back).
        if (block := withheld(advisories, policy, project, dist, pin)) is not None:
            out.blocked.append(block)
            if not block.allowed:
                continue
        files.append(dataclasses.replace(
            dist,
            url=(href := page_file_href(project, dist.filename)),
            hashes=dict(pin.hashes),
            size=pin.size if pin.size is not None else dist.size,
            # A .metadata file the page gives no hash for could not be checked: let pip read the wheel instead.
            core_metadata=dict(pin.core_metadata) if pin.core_metadata and "sha256" in pin.core_metadata else False,
            # Never the index's URL: ours, to the signed provenance target, for the files verified.
            provenance=f"{href}{PROVENANCE_SUFFIX}" if dist.filename in known.provenance else None,
        ))
    files.sort(key=lambda f: f.filename)
    out.page = index.ProjectPage(name=project, files=tuple(files), versions=listing.page.versions).with_status(
        listing.page.status, listing.page.status_reason)
    return out
