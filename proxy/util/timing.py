"""Where one request's time went, phase by phase: the ``Server-Timing`` header (W3C) of miss answers.

The server starts a list for each request (:func:`collect`); the code
doing a phase records it there (:func:`phase`, :func:`record`), and the
server's middleware sends what was recorded with a successful answer
not yet on the wire (:func:`header_for`) as ``Server-Timing: index;dur=41.2,
sign;dur=9.8``, so an operator (``curl -v``, a browser's developer tools)
or ``bench/install.py`` sees where a slow miss spent its time without
a profiler.  Outside a request, and in background work told to
:func:`detach`, nothing is kept.

Phases are recorded by the caller that waits for them, never inside work
other requests share (a refresh, a download), so each request names only
its own waits.  A header relayed from another server (an edge relaying
its gateway's) is read with bounds (:func:`parse`): plain names, digits
for durations, at most :data:`MAX_PHASES`, of which at most
:data:`MAX_RELAYED` are kept (:func:`relay`); anything else is dropped.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from contextvars import ContextVar

MAX_PHASES = 16
MAX_RELAYED = 8  # of them another server's, so it cannot crowd out this one's own
MAX_HEADER = 1024  # a relayed header longer than this is not read
_NAME = re.compile(r"[a-z][a-z0-9-]{0,47}")  # a relayed name (at most 32 characters) under its prefix
_ENTRY = re.compile(r"\s*([a-z][a-z0-9-]{0,31})\s*;\s*dur\s*=\s*([0-9]{1,9}(?:\.[0-9]{1,6})?)\s*")

Phases = list[tuple[str, float]]  # (name, seconds), in the order recorded

_phases: ContextVar[Phases | None] = ContextVar("server_timing", default=None)


def collect() -> Phases:
    """Start this request's phases (call in the request's own task); the list they are recorded in."""
    phases: Phases = []
    _phases.set(phases)
    return phases


def detach() -> None:
    """Record nothing more in this task: background work started by a request (a prefetch) is not its wait."""
    _phases.set(None)


def record(name: str, seconds: float) -> None:
    phases = _phases.get()
    if phases is not None and len(phases) < MAX_PHASES and _NAME.fullmatch(name):
        phases.append((name, max(0.0, seconds)))


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Record the time the block took as ``name`` (a refusal's time too: it was waited for)."""
    start = time.monotonic()
    try:
        yield
    finally:
        record(name, time.monotonic() - start)


def header(phases: Phases) -> str | None:
    """The ``Server-Timing`` value of ``phases`` (milliseconds), or None when there are none."""
    return ", ".join(f"{name};dur={1000 * seconds:.1f}" for name, seconds in phases) or None


def header_for(status: int, phases: Phases) -> str | None:
    """The ``Server-Timing`` value an answer of ``status`` carries: none for a refusal, since what a 404
    waited for (a miss asking the gateway, or not) would tell a private project from one no index lists."""
    return header(phases) if status < 400 else None


def parse(value: str | None) -> Phases:
    """The phases of another server's ``Server-Timing`` value: each well-formed ``name;dur=MS`` entry, at most
    :data:`MAX_PHASES`; an entry with other parameters, a name out of the plain set or a long header is dropped."""
    if not value or len(value) > MAX_HEADER:
        return []
    found: Phases = []
    for entry in value.split(",")[:MAX_PHASES]:
        if (m := _ENTRY.fullmatch(entry)) is not None:  # digits only: finite, not negative
            found.append((m.group(1), float(m.group(2)) / 1000))
    return found


def relay(phases: Phases, prefix: str) -> None:
    """Record another server's ``phases`` in this request's (at most :data:`MAX_RELAYED`), each under ``prefix``."""
    for name, seconds in phases[:MAX_RELAYED]:
        record(f"{prefix}{name}", seconds)
