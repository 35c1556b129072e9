"""The one refusal table: an error's fault and reason -> HTTP status, audit decision, metric label.

Every error class of ``proxy`` declares ``fault`` (a :class:`~proxy.protocol.errors.Fault`)
and ``reason`` (a slug).  :func:`row` reads them: a reason with a row of its
own (a full cache is 503, not 500) wins, else the fault's row.  The edge
(:mod:`proxy.serving.refusals`) and the gateway (:mod:`proxy.gateway.app`)
both answer from here, so a refusal means the same status, audit record and
metric label wherever it happens.  An exception that declares no fault is a
bug of ours: 500, logged with its traceback by the caller, never blamed on
the repository.  Pure data: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.protocol.errors import Fault

__all__ = ["Row", "fault_of", "phrase", "reason_of", "row", "rule_fault"]


@dataclass(frozen=True)
class Row:
    """What one kind of refusal becomes."""

    status: int
    fault: Fault
    prefix: str  # the reason phrase starts "<prefix>: <error>"
    audit: bool  # write a refusal record to the audit log

    @property
    def kind(self) -> str:
        """The metric label: whose fault."""
        return self.fault.value


BY_FAULT: dict[Fault, Row] = {
    Fault.REPOSITORY: Row(502, Fault.REPOSITORY, "refused by TUF verification", audit=True),
    Fault.UPSTREAM: Row(502, Fault.UPSTREAM, "upstream unreachable", audit=True),
    Fault.NOT_FOUND: Row(404, Fault.NOT_FOUND, "not found", audit=False),
    Fault.OURS: Row(500, Fault.OURS, "internal error", audit=False),
    Fault.OPERATOR: Row(502, Fault.OPERATOR, "refused by this server's configuration", audit=True),
    Fault.CLIENT: Row(400, Fault.CLIENT, "bad request", audit=False),
}

# Reasons whose answer differs from their fault's: retryable 503s, and what a client may change.
BY_REASON: dict[str, Row] = {
    "gateway-refused": Row(502, Fault.UPSTREAM, "refused by the gateway", audit=True),
    "metadata-pending": Row(503, Fault.UPSTREAM, "trusted metadata is being refreshed, retry", audit=False),
    "expired": Row(503, Fault.REPOSITORY, "trusted metadata expired and cannot be refreshed", audit=True),
    "trust-error": Row(503, Fault.UPSTREAM, "no trusted metadata yet", audit=True),
    "not-initialized": Row(503, Fault.UPSTREAM, "no trusted metadata yet", audit=True),
    "refresh-failed": Row(503, Fault.OURS, "trusted metadata could not be refreshed here", audit=True),
    "metadata-dir-locked": Row(503, Fault.OURS, "trusted metadata directory busy", audit=True),
    "cache-full": Row(503, Fault.OURS, "cache full, cannot store new files", audit=False),
    "bucket-unavailable": Row(503, Fault.OURS, "shared bucket unreachable, retry", audit=False),
    "bucket-denied": Row(503, Fault.OURS, "shared bucket unreachable, retry", audit=False),
    "busy": Row(503, Fault.OURS, "too many downloads in progress, retry", audit=False),
    "unsent": Row(503, Fault.OURS, "the file could not be sent this time, retry", audit=False),
    "storage": Row(503, Fault.OURS, "storage error, retry", audit=False),
    # The gateway's online key cannot sign (token removed, KMS unreachable); what is signed is still served.
    "signing-unavailable": Row(503, Fault.OURS, "the signing key is unavailable, retry", audit=True),
    "audit-unwritable": Row(500, Fault.OURS, "audit log unwritable: refusing to serve", audit=False),
    "not-acceptable": Row(406, Fault.CLIENT, "none of the Accept types is served: try "
                                             "application/vnd.pypi.simple.v1+json or text/html", audit=False),
    "bad-path": Row(404, Fault.CLIENT, "not found", audit=False),
    "client-error": Row(404, Fault.CLIENT, "not found", audit=False),
    # Access control (proxy.serving.guard): every one audited, for whoever watches for attacks.
    "unauthenticated": Row(401, Fault.CLIENT, "authentication required", audit=True),
    "forbidden": Row(403, Fault.CLIENT, "forbidden", audit=True),
    "throttled": Row(429, Fault.CLIENT, "too many failed attempts", audit=True),
    "bad-credentials": Row(400, Fault.CLIENT, "malformed credentials", audit=True),
}

UNEXPECTED = Row(500, Fault.OURS, "internal error", audit=False)

# The gateway's rules that leave a project or file out of what it signs are the organisation's policy
# (operator), except these: each caught the index contradicting what was already trusted or attested,
# or listing a file it gave no hash for,
REPOSITORY_RULES = frozenset({"upstream-changed-file", "hash-mismatch", "provenance-invalid", "publisher-changed",
                              "missing-hash"})
# and these, which could not check a file now because something upstream did not answer;
UPSTREAM_RULES = frozenset({"provenance-unavailable"})
# and this one, which leaves nothing out: a file the gateway kept that no longer matches the pin it matched when
# kept, changed by its own storage (a rewritten volume, a failing disk), removed and fetched again.
OURS_RULES = frozenset({"kept-file-changed"})

# Reason phrases travel in the status line: printable ASCII, bounded.
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


def fault_of(error: BaseException) -> Fault:
    """Whose fault ``error`` is; an error that does not say is ours (a bug)."""
    fault = getattr(error, "fault", None)
    if isinstance(fault, Fault):
        return fault
    if isinstance(error, OSError) and not isinstance(error, ConnectionError):
        return Fault.OURS  # a disk or descriptor of ours
    if isinstance(error, ConnectionError):
        return Fault.CLIENT  # the client hung up
    return Fault.OURS


def reason_of(error: BaseException) -> str:
    """The reason slug: the error's own, else ``storage`` for our OSErrors, else ``internal``."""
    reason = getattr(error, "reason", None)
    if isinstance(reason, str) and isinstance(getattr(error, "fault", None), Fault):
        return reason
    if isinstance(error, ConnectionError):
        return "client-gone"
    return "storage" if isinstance(error, OSError) else "internal"


def row(error: BaseException) -> Row:
    """The table's row for ``error``: its reason's, else its fault's; an undeclared error is :data:`UNEXPECTED`."""
    fault = fault_of(error)
    reason = reason_of(error)
    found = BY_REASON.get(reason)
    if found is not None and found.fault is fault:
        return found
    if reason == "internal":
        return UNEXPECTED
    return BY_FAULT[fault]


def rule_fault(rule: str) -> Fault:
    """Whose decision a gateway rule that left something out was (its metric's ``kind``, its audit's ``fault``)."""
    if rule in UPSTREAM_RULES:
        return Fault.UPSTREAM
    if rule in OURS_RULES:
        return Fault.OURS
    return Fault.REPOSITORY if rule in REPOSITORY_RULES else Fault.OPERATOR


def phrase(text: str) -> str:
    """``text`` fit for an HTTP status line."""
    return _UNPRINTABLE.sub("?", text)[:300]
