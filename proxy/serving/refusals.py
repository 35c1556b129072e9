"""The edge's refusals applied: the one table's row -> audit record, metric, and the answer to send.

Which row a refusal gets is decided in :mod:`proxy.protocol.refusals` (the
gateway answers from the same table).  :class:`Refusals` applies it: it
writes the audit record (when the row says so), counts the metric by whose
fault, and returns what the HTTP layer sends.  Nothing here knows aiohttp.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from proxy.protocol.errors import Fault, MetadataPending
from proxy.protocol.refusals import UNEXPECTED, fault_of, phrase, reason_of, row
from proxy.storage.audit import AuditLog, AuditWriteError
from proxy.trust import TrustedClient
from proxy.util.metrics import Metrics

log = logging.getLogger(__name__)


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
    """Applies the one table (:func:`proxy.protocol.refusals.row`): audit record, metric, answer."""

    def __init__(self, audit: AuditLog, metrics: Metrics, trust: TrustedClient) -> None:
        self.audit = audit
        self.metrics = metrics
        self.trust = trust

    def answer(self, asker: Asker, error: BaseException) -> Answer:
        """Record ``error`` as the table says and return what to send."""
        r = row(error)
        slug = reason_of(error)
        if isinstance(error, AuditWriteError):
            log.error("failing closed: %s", error)
            text = r.prefix
        elif r is UNEXPECTED:
            log.error("%s: internal error", asker.path, exc_info=error)
            text = f"{r.prefix} ({type(error).__name__})"
        else:
            detail = f" ({slug})" if r.fault in (Fault.REPOSITORY, Fault.OPERATOR) else ""
            text = f"{r.prefix}{detail}: {error}"
        self.metrics.refusals.labels(r.kind, slug).inc()
        if r.audit and not asker.audited:
            self.record(asker, error, None)
        if r.status >= 500:
            log.warning("%s -> %d %s", asker.path, r.status, text)
        headers = {"X-Tufproxy-Reason": slug}
        if isinstance(error, MetadataPending):
            headers["Retry-After"] = str(error.retry_after)
        return Answer(r.status, phrase(text), slug, text, headers)

    def record(self, asker: Asker, error: BaseException, url: str | None) -> None:
        """One audit record of a refusal (a mirror's lie, or the request's answer)."""
        slug = reason_of(error)
        if fault_of(error) is Fault.REPOSITORY:
            self.metrics.verification_failures.labels(slug).inc()
        self.audit.refused(
            request_id=asker.request_id,
            client=asker.client,
            request_path=asker.path,
            target=getattr(error, "target", None) or asker.target,
            role=getattr(error, "role", None),
            upstream_url=url,
            reason=slug,
            fault=fault_of(error).value,
            message=str(error),
            expected=getattr(error, "expected", None),
            actual=getattr(error, "actual", None),
            trusted_versions=self.trusted_versions(),
        )
        asker.audited = True

    def refresh_refused(self, error: BaseException) -> None:
        """A refresh cycle refused metadata: that update is aborted and the live state kept (audited, counted)."""
        self.record(Asker(request_id="refresh", client=None, path="(metadata refresh)"), error, None)

    def trusted_versions(self) -> dict[str, int]:
        status = self.trust.status()
        return {role: info["version"] for role, info in status.get("roles", {}).items()}
