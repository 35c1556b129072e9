"""Every refusal's type, and whose fault it is.

Each error class of ``proxy`` carries a ``reason`` slug (stable: metric
labels, audit records, ``X-Tufproxy-Reason``) and a :class:`Fault`: who is
to blame.  :mod:`proxy.protocol.refusals` turns the pair into the HTTP
status, the audit decision and the metric label, for the edge and the
gateway alike; an exception without a fault is a bug of ours.

The trust core's three families.  :class:`RepositoryError` means the upstream served something
its keys do not vouch for (or vouch for no longer): a lie, a replay, a
freeze.  :class:`UpstreamUnreachable` means no mirror answered usably.
:class:`NotFound` means the thing does not exist (no signed target, or no
mirror holds it).  Every class has a stable ``reason`` slug
for metrics and audit labels, and carries what it knows (role, target,
expected, actual) as attributes so callers never parse messages.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar


class Fault(StrEnum):
    """Whose fault a refusal is: the metric label ``kind`` and the audit record's ``fault``."""

    REPOSITORY = "repository"  # the repository or index served what its keys or pages do not vouch for
    UPSTREAM = "upstream"  # unreachable, broken, or not ready yet
    NOT_FOUND = "not-found"  # the thing does not exist
    OURS = "ours"  # our resources (disk, cache, bucket, load) or our bug
    OPERATOR = "operator"  # our configuration does not allow it
    CLIENT = "client"  # the client asked badly


class TrustError(Exception):
    """Root of every refusal the trust core raises."""

    reason: ClassVar[str] = "trust-error"
    fault: ClassVar[Fault] = Fault.UPSTREAM

    def __init__(
        self,
        message: str,
        *,
        role: str | None = None,
        target: str | None = None,
        expected: Any = None,
        actual: Any = None,
    ) -> None:
        super().__init__(message)
        self.role = role
        self.target = target
        self.expected = expected
        self.actual = actual


class RepositoryError(TrustError):
    """The upstream served metadata or data we must not trust."""

    reason = "repository-error"
    fault = Fault.REPOSITORY


class BadSignature(RepositoryError):
    """Fewer valid signatures than the delegator's threshold."""

    reason = "bad-signature"


class Rollback(RepositoryError):
    """An older version than one we already trust (or the snapshot lists)."""

    reason = "rollback"

    def __init__(self, role: str, trusted: int, offered: int | None) -> None:
        super().__init__(
            f"{role}: offered version {offered}, trusted version is {trusted}",
            role=role,
            expected=trusted,
            actual=offered,
        )
        self.trusted_version = trusted
        self.offered_version = offered


class VersionMismatch(RepositoryError):
    """A newer version than the one its parent metadata lists (mix and match)."""

    reason = "version-mismatch"

    def __init__(self, role: str, expected: int, actual: int) -> None:
        super().__init__(
            f"{role}: version {actual} served, version {expected} is listed",
            role=role,
            expected=expected,
            actual=actual,
        )


class ExpiredMetadata(RepositoryError):
    """Metadata past its expiry: a freeze attack or a stalled repository."""

    reason = "expired"

    def __init__(self, role: str, expires: datetime) -> None:
        super().__init__(
            f"{role} metadata expired at {expires.isoformat()}",
            role=role,
            expected=expires,
        )
        self.expires = expires


class LengthMismatch(RepositoryError):
    """Bytes of another length than signed (or more than the bound allows)."""

    reason = "length-mismatch"


class HashMismatch(RepositoryError):
    """Bytes of the right length whose digest differs from the signed one."""

    reason = "hash-mismatch"


class BadMetadata(RepositoryError):
    """Not well-formed metadata of the expected type."""

    reason = "bad-metadata"


class NotFound(TrustError):
    """What was asked for does not exist: a 404, nobody's fault."""

    reason = "not-found"
    fault = Fault.NOT_FOUND


class UnknownTarget(NotFound):
    """No trusted role lists this target.  ``detail``: why, when someone said (a hint)."""

    reason = "unknown-target"

    def __init__(self, target: str, detail: str | None = None) -> None:
        message = f"no trusted metadata lists {target!r}"
        super().__init__(f"{message}: {detail}" if detail else message, target=target)
        self.detail = detail


class NotInitialized(TrustError):
    """The metadata directory holds no trusted root to start from."""

    reason = "not-initialized"


class UpstreamUnreachable(TrustError):
    """Every mirror failed at the transport level (wraps their errors)."""

    reason = "upstream-unreachable"

    def __init__(self, what: str, errors: list[Exception]) -> None:
        detail = "; ".join(str(e) for e in errors) or "no mirrors"
        super().__init__(f"{what}: all mirrors failed: {detail}", target=what)
        self.errors = errors


class MetadataPending(TrustError):
    """Whether the target exists is not known yet: a refresh is still running. Ask again shortly."""

    reason = "metadata-pending"

    def __init__(self, target: str, retry_after: int) -> None:
        super().__init__(f"{target}: trusted metadata is still being refreshed; retry in {retry_after}s",
                         target=target)
        self.retry_after = retry_after


class RefreshFailed(TrustError):
    """A refresh cycle failed for a reason of ours, not the repository's (a full disk, a bug): logged and retried."""

    reason = "refresh-failed"
    fault = Fault.OURS


# Our resources: never the upstream's fault.

class StoreError(Exception):
    """Base of every error the store raises (our resources, never the upstream's fault)."""

    reason = "store-error"
    fault = Fault.OURS


class StoreFull(StoreError):
    """The size limit or the disk is full: the request cannot be cached."""

    reason = "cache-full"


class StoreUnwritable(StoreError):
    """The cache directory cannot be created or written at open."""

    reason = "cache-unwritable"


class ClientMistake(Exception):
    """The client asked badly (a path or an Accept header we do not serve)."""

    reason = "client-error"
    fault = Fault.CLIENT
    status = 400


class BadPath(ClientMistake):
    reason = "bad-path"
    status = 404


class NotAcceptable(ClientMistake):
    reason = "not-acceptable"
    status = 406


class Busy(StoreError):
    """Too many downloads of unknown length at once: our resources, for now."""

    reason = "busy"


class Unsent(StoreError):
    """A download ended before any byte of the answer went out, for a reason of ours (its verified file
    evicted before it was read, its fetch cancelled): asking again fetches it anew."""

    reason = "unsent"


# The command line: every subcommand raises CommandError for a failure the user can act on;
# proxy.cli.main prints it as one line on stderr.
# Exit statuses, as grep has them: 1 is a negative answer (refusals, an unsound
# tree), 2 an error that stopped the command (always one line on stderr).
EXIT_REFUSED = 1
EXIT_ERROR = 2


class CommandError(Exception):
    """A user-facing failure: printed as one line on stderr, exit status ``exit_status``.

    :data:`EXIT_ERROR` unless the command's contract says otherwise (``tufproxy
    client`` answers a refused update with :data:`EXIT_REFUSED`, as TUF's
    conformance CLI requires).
    """

    reason = "command-error"
    fault = Fault.OPERATOR

    def __init__(self, message: str, exit_status: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_status = exit_status
