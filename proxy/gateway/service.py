"""The gateway's decisions: publish a project, refresh it, revoke it.

:class:`Gateway` ties the index client, the ledger, the page pipeline and
the batched publisher together, with no HTTP of its own (``app.py`` is
the HTTP face).  :meth:`Gateway.ensure` is the miss protocol's core: the
project is fetched, rendered and signed once however many callers ask
(single-flight per project), and they all get the timestamp version that
carries it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from proxy import index
from proxy.audit import AuditLog
from proxy.gateway.ledger import Ledger
from proxy.gateway.listing import IndexClient, Listing, PageRefused
from proxy.gateway.metrics import GatewayMetrics
from proxy.gateway.pages import KeepAll, PagePolicy, Rendered, render
from proxy.gateway.publisher import Publisher

log = logging.getLogger(__name__)


class NotListed(Exception):
    """No configured index lists the project (or it is revoked)."""


@dataclass(frozen=True)
class Published:
    project: str
    timestamp_version: int


class Gateway:
    """See the module docstring."""

    def __init__(self, client: IndexClient, ledger: Ledger, publisher: Publisher, audit: AuditLog,
                 metrics: GatewayMetrics, policy: PagePolicy = KeepAll()) -> None:
        self.client = client
        self.ledger = ledger
        self.publisher = publisher
        self.audit = audit
        self.metrics = metrics
        self.policy = policy
        self._inflight: dict[str, asyncio.Future[Published]] = {}
        # Projects by last use (most recent last) and when each page was last fetched (monotonic).
        self.used: OrderedDict[str, float] = OrderedDict()
        self.fetched: dict[str, float] = {}

    def touch(self, project: str) -> None:
        self.used[project] = time.monotonic()
        self.used.move_to_end(project)

    async def ensure(self, name: str) -> Published:
        """Publish ``name`` if it is not yet; the timestamp version carrying it. NotListed or PageRefused otherwise."""
        project = canonicalize_name(name)
        self.ledger.reload()
        if self.ledger.is_revoked(project):
            raise NotListed(f"{project} is revoked at this gateway")
        self.touch(project)
        if project in self.publisher.published:
            return Published(project, self.publisher.timestamp_version)
        future = self._inflight.get(project)
        if future is None:
            future = asyncio.ensure_future(self._publish_new(project))
            self._inflight[project] = future
            future.add_done_callback(lambda f: self._inflight.pop(project, None))
        # shield: a caller that gives up does not cancel the publish others wait for.
        return await asyncio.shield(future)

    async def _publish_new(self, project: str) -> Published:
        listing = await self.fetch(project)
        if listing is None:
            raise NotListed(f"no index lists {project}")
        version = await self.publisher.publish({project: self.accept(listing).page})
        return Published(project, version)

    async def fetch(self, project: str) -> Listing | None:
        """The project's listing from its index (the ledger's, else the first listing it); refusals audited."""
        try:
            listing = await self.client.listing(project, only=self.ledger.project_index.get(project))
        except PageRefused as e:
            self.metrics.pages_fetched.labels("refused" if e.reason != "upstream-unreachable" else "unreachable").inc()
            self.metrics.refusals.labels(e.reason).inc()
            self.audit.refused(reason=e.reason, target=f"simple/{project}/", upstream_url=e.url, detail=str(e))
            raise
        self.fetched[project] = time.monotonic()
        self.metrics.pages_fetched.labels("ok" if listing is not None else "not-found").inc()
        return listing

    def accept(self, listing: Listing) -> Rendered:
        """Render ``listing`` and record what it pins and what it refused, before it is signed."""
        rendered = render(listing, self.ledger, self.policy)
        records = self.ledger.pin_records(rendered.new_pins)
        if listing.project not in self.ledger.project_index:
            records.insert(0, {"kind": "project", "project": listing.project, "index": listing.index_url})
        self.ledger.append(records)
        for changed in rendered.changed:
            self.metrics.pins_refused.inc()
            self.metrics.refusals.labels("upstream-changed-file").inc()
            self.audit.refused(reason="upstream-changed-file", target=f"packages/{listing.project}/{changed.pin.filename}",
                               upstream_url=changed.pin.url, expected={"hashes": changed.pin.hashes, "size": changed.pin.size},
                               actual={"hashes": changed.hashes, "size": changed.size})
        for filename, reason in listing.dropped:
            self.metrics.refusals.labels(reason).inc()
            self.audit.refused(reason=reason, target=f"packages/{listing.project}/{filename}", upstream_url=listing.index_url)
        return rendered

    async def refresh(self, projects: list[str]) -> int:
        """Re-fetch ``projects`` and publish them in one batch (the signer skips unchanged pages)."""
        self.ledger.reload()
        pages: dict[str, index.ProjectPage | None] = {}
        for project, result in zip(projects, await asyncio.gather(*(self._fresh_page(p) for p in projects))):
            if result is not None:
                pages[project] = result
        if pages:
            await self.publisher.publish(pages)
        return len(pages)

    async def _fresh_page(self, project: str) -> index.ProjectPage | None:
        if self.ledger.is_revoked(project):
            return None
        try:
            listing = await self.fetch(project)
        except PageRefused:
            return None  # an unreachable or lying index never unpublishes what is signed
        if listing is None:
            # The index no longer lists it: its files leave the signed page.
            listing = Listing(project, self.ledger.project_index.get(project, ""), index.ProjectPage(name=project, files=()))
        return self.accept(listing).page
