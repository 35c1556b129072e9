"""The one failover loop over mirrors, and the one reading of what a mirror's answer means.

Every caller that asks several mirrors (or indexes) for one thing goes
through :func:`failover`: trusted metadata (:mod:`proxy.trust.client`),
signed targets (:mod:`proxy.trust.fetch`) and the gateway's project pages
(:mod:`proxy.gateway.listing`).  What each failure means is decided once,
by :func:`classify`:

=============================================  ===============  ==========================
a mirror's answer                              outcome          what happens next
=============================================  ===============  ==========================
the bytes (and, where checked, they verified)  ``SERVED``       done
HTTP 404 or 410 for the whole file             ``MISSING``      ask the next mirror
HTTP 403                                       ``DENIED``       ask the next mirror
any other status (a redirect the fetcher       ``UNREACHABLE``  ask the next mirror
does not follow included), a 404 for a
resumed body, a transport failure, a
timeout, a stall
a body longer than allowed, a redirect to      ``LIE``          refused (never kept); ask
an origin no page may come from, bytes that                     the next mirror
do not verify (errors of fault REPOSITORY)
anything else (our store, a bug, a cancel)     (none)           raised unchanged at once
=============================================  ===============  ==========================

When no mirror served, :meth:`Tried.verdict` says what asking them all
found, in one of two questions:

* **fetch** (the file is signed to exist: a target, a role the snapshot
  lists): missing only when every mirror said ``MISSING`` for the whole
  file; a mirror that was unreachable or refused us may well have it.
* **probe** (whether the file exists is the question: the next root,
  spec 5.3.3): a mirror's clean "not here", a 403 included (python-tuf's
  reading: S3 answers 403 for a key that does not exist), answers it;
  an unreachable mirror beside it does not stop the chain.

Any lie wins over both: the first mirror's lie is the verdict.  Which
mirror is asked next is the caller's ``choose`` (all of them in order
by default; the gateway's first-index policy stops at the first index
that did not answer cleanly).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from proxy.protocol.errors import Fault, RepositoryError
from proxy.transport.upstream import DownloadError, DownloadHTTPError

T = TypeVar("T")


class Outcome(enum.Enum):
    """What one mirror's answer means; ``label`` is the attempts metric's value for it."""

    SERVED = "served"
    MISSING = "missing"
    DENIED = "denied"
    UNREACHABLE = "unreachable"
    LIE = "lie"

    @property
    def label(self) -> str:
        """``ok``, ``refused`` or ``error``: the bounded label set of every attempts metric."""
        return {Outcome.SERVED: "ok", Outcome.LIE: "refused"}.get(self, "error")


MISSING_STATUSES = frozenset({404, 410})
DENIED_STATUSES = frozenset({403})


def classify(error: BaseException, *, resumed: bool = False) -> Outcome | None:
    """What ``error`` says about the mirror that raised it; None when it is not the mirror's doing.

    ``resumed``: the request continued a body another mirror began, so the
    file exists and a "not here" is this mirror failing, not an answer.
    """
    if isinstance(error, RepositoryError):
        return Outcome.LIE
    if isinstance(error, DownloadHTTPError) and not resumed:
        if error.status in MISSING_STATUSES:
            return Outcome.MISSING
        if error.status in DENIED_STATUSES:
            return Outcome.DENIED
    if isinstance(error, DownloadError):
        # The transport's errors say whose fault they are: a body longer than allowed, a
        # redirect to where no page may come from, is the mirror lying; the rest is its failing.
        return Outcome.LIE if error.fault is Fault.REPOSITORY else Outcome.UNREACHABLE
    return None


@dataclass(frozen=True)
class Attempt:
    """One mirror asked: its position, URL, outcome, and the error (None when it served)."""

    mirror: int
    url: str
    outcome: Outcome
    error: Exception | None = None


@dataclass
class Tried:
    """Every attempt of one :func:`failover`, in the order asked."""

    urls: Sequence[str]
    attempts: list[Attempt] = field(default_factory=list)

    def outcomes(self) -> list[Outcome | None]:
        """Per mirror, the last outcome of asking it (None: not asked)."""
        found: list[Outcome | None] = [None] * len(self.urls)
        for a in self.attempts:
            found[a.mirror] = a.outcome
        return found

    @property
    def lies(self) -> list[Exception]:
        return [a.error for a in self.attempts if a.outcome is Outcome.LIE and a.error is not None]

    @property
    def failures(self) -> list[Exception]:
        """The errors that were not lies (for an "all mirrors failed" message)."""
        return [a.error for a in self.attempts if a.outcome is not Outcome.LIE and a.error is not None]

    def verdict(self, *, probe: bool = False) -> Outcome:
        """``LIE``, ``MISSING`` or ``UNREACHABLE``: what asking every mirror found (module docstring)."""
        if self.lies:
            return Outcome.LIE
        said = [a.outcome for a in self.attempts]
        if probe:
            missing = any(o in (Outcome.MISSING, Outcome.DENIED) for o in said)
        else:
            missing = bool(self.urls) and len(said) == len(self.urls) and all(o is Outcome.MISSING for o in said)
        return Outcome.MISSING if missing else Outcome.UNREACHABLE


class Exhausted(Exception):
    """No mirror served; ``tried`` says what each answered (callers turn it into their typed refusal)."""

    reason = "upstream-unreachable"
    fault = Fault.UPSTREAM

    def __init__(self, tried: Tried) -> None:
        super().__init__(f"no mirror served ({len(tried.attempts)} asked)")
        self.tried = tried


def in_order(tried: Tried) -> int | None:
    """Every mirror once, in the order given."""
    asked = len(tried.attempts)
    return asked if asked < len(tried.urls) else None


async def failover(
    urls: Sequence[str],
    attempt: Callable[[int, str], Awaitable[T]],
    *,
    choose: Callable[[Tried], int | None] = in_order,
    after: Callable[[Attempt], Awaitable[None]] | None = None,
    resumed: Callable[[], bool] = lambda: False,
) -> T:
    """The first result of ``attempt(i, urls[i])`` for the mirrors ``choose`` picks, one at a time.

    A failure :func:`classify` reads as the mirror's is recorded and the
    next mirror asked (``after`` hears of every attempt, served or not,
    before that); any other error is raised at once.  ``resumed`` says
    whether the next request continues a body begun by an earlier mirror.
    Raises :class:`Exhausted` when ``choose`` picks no more mirrors.
    """
    tried = Tried(urls)
    while (i := choose(tried)) is not None:
        continuing = resumed()
        try:
            result = await attempt(i, urls[i])
        except Exception as e:
            outcome = classify(e, resumed=continuing)
            if outcome is None:
                raise
            done = Attempt(i, urls[i], outcome, e)
            tried.attempts.append(done)
            if after is not None:
                await after(done)
            continue
        if after is not None:
            await after(Attempt(i, urls[i], Outcome.SERVED))
        return result
    raise Exhausted(tried)
