"""The one error table: each refusal type -> HTTP status, reason slug, audit record, metric label.

Whose fault it was decides everything, in one place.  :data:`TABLE` is read
top to bottom and the first row whose type matches wins; every refusal the
proxy can give has a row.  :class:`Refusals` applies a row: it writes the
audit record (when the row says so) and counts the metric, and returns
what the HTTP layer sends.  Nothing here knows aiohttp.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from proxy.storage.audit import AuditLog, AuditWriteError
from proxy.transport.bucket import BucketUnavailable
from proxy.util.metrics import Metrics
from proxy.protocol.errors import BadPath, Busy, ClientMistake, NotAcceptable, StoreError, StoreFull
from proxy.trust import TrustedClient
from proxy.protocol.errors import (
    ExpiredMetadata,
    MetadataPending,
    NotFound,
    RepositoryError,
    TrustError,
    UpstreamUnreachable,
)

log = logging.getLogger(__name__)
# Reason phrases travel in the status line: printable ASCII, bounded.
_REASON_RE = re.compile(r"[^\x20-\x7e]")




@dataclass(frozen=True)
class Row:
    """What one kind of refusal becomes.  ``kind``: the metric label (whose fault)."""

    status: int
    kind: str
    prefix: str  # reason phrase: "<prefix>: <error>"
    audit: bool  # write a refusal record to the audit log


TABLE: tuple[tuple[type[BaseException], Row], ...] = (
    (MetadataPending, Row(503, "pending", "trusted metadata is being refreshed, retry", audit=False)),
    (ExpiredMetadata, Row(503, "repository", "trusted metadata expired and cannot be refreshed", audit=True)),
    (NotFound, Row(404, "not-found", "not found", audit=False)),
    (RepositoryError, Row(502, "repository", "refused by TUF verification", audit=True)),
    (UpstreamUnreachable, Row(502, "upstream", "upstream unreachable", audit=True)),
    (TrustError, Row(503, "upstream", "no trusted metadata yet", audit=True)),
    (StoreFull, Row(503, "resources", "cache full, cannot store new files", audit=False)),
    (BucketUnavailable, Row(503, "resources", "shared bucket unreachable, retry", audit=False)),
    (Busy, Row(503, "resources", "too many downloads in progress, retry", audit=False)),
    (StoreError, Row(500, "resources", "internal store error", audit=False)),
    (AuditWriteError, Row(500, "resources", "audit log unwritable: refusing to serve", audit=False)),
    (NotAcceptable, Row(406, "client", "none of the Accept types is served: try "
                                       "application/vnd.pypi.simple.v1+json or text/html", audit=False)),
    (ClientMistake, Row(404, "client", "not found", audit=False)),
)


def row(error: BaseException) -> Row:
    """The table's row for ``error`` (every refusal type has one)."""
    for kind, found in TABLE:
        if isinstance(error, kind):
            return found
    raise TypeError(f"no refusal row for {type(error).__name__}")


def reason_slug(error: BaseException) -> str:
    return getattr(error, "reason", type(error).__name__)


@dataclass(frozen=True)
class Answer:
    """What the HTTP layer sends for a refusal."""

    status: int
    phrase: str  # the status line's reason (pip prints it)
    slug: str  # X-Tufproxy-Reason
    text: str  # the body
    headers: dict[str, str]


@dataclass
class Asker:
    """Who asked, for audit records; ``audited`` once a record names this request's refusal."""

    request_id: str
    client: str | None
    path: str
    target: str | None = None
    audited: bool = False


class Refusals:
    """Applies :data:`TABLE`: audit record, metric, and the answer to send."""

    def __init__(self, audit: AuditLog, metrics: Metrics, trust: TrustedClient) -> None:
        self.audit = audit
        self.metrics = metrics
        self.trust = trust

    def answer(self, asker: Asker, error: BaseException) -> Answer:
        """Record ``error`` as the table says and return what to send."""
        r = row(error)
        slug = reason_slug(error)
        if isinstance(error, AuditWriteError):
            log.error("failing closed: %s", error)
            text = r.prefix
        else:
            detail = f" ({slug})" if isinstance(error, RepositoryError) else ""
            text = f"{r.prefix}{detail}: {error}"
        self.metrics.refusals.labels(r.kind, slug).inc()
        if r.audit and not asker.audited:
            self.record(asker, error, None)
        if r.status >= 500:
            log.warning("%s -> %d %s", asker.path, r.status, text)
        headers = {"X-Tufproxy-Reason": slug}
        if isinstance(error, MetadataPending):
            headers["Retry-After"] = str(error.retry_after)
        return Answer(r.status, _REASON_RE.sub("?", text)[:300], slug, text, headers)

    def record(self, asker: Asker, error: BaseException, url: str | None) -> None:
        """One audit record of a refusal (a mirror's lie, or the request's answer)."""
        slug = reason_slug(error)
        if isinstance(error, RepositoryError):
            self.metrics.verification_failures.labels(slug).inc()
        self.audit.refused(
            request_id=asker.request_id,
            client=asker.client,
            request_path=asker.path,
            target=getattr(error, "target", None) or asker.target,
            role=getattr(error, "role", None),
            upstream_url=url,
            reason=slug,
            message=str(error),
            expected=getattr(error, "expected", None),
            actual=getattr(error, "actual", None),
            trusted_versions=self.trusted_versions(),
        )
        asker.audited = True

    def refresh_refused(self, error: RepositoryError) -> None:
        """A refresh cycle refused metadata: that update is aborted and the live state kept (audited, counted)."""
        self.record(Asker(request_id="refresh", client=None, path="(metadata refresh)"), error, None)

    def trusted_versions(self) -> dict[str, int]:
        status = self.trust.status()
        return {role: info["version"] for role, info in status.get("roles", {}).items()}
