"""Process logging: JSON lines or key=value text, each record tagged with its request id, bounded under attack.

The server sets :data:`request_id` for the duration of each request (from a
sane ``X-Request-Id`` header, else a fresh one), so every log line and
audit record a request causes can be joined on it.

A flood cannot flood the log: each kind of line (one logger, one message
template) that is a warning or worse, or comes from aiohttp or asyncio, is
written at most :data:`BURST` times per :data:`INTERVAL`; the first written
after that says how many were left out, and if none comes, the server's
periodic :func:`flush_suppressed` writes one line saying so, so a flood that
stopped still leaves its count (:func:`suppressed_counts` has the totals, for
a metric).  A message is written on one line, control characters
escaped, at most :data:`MAX_MESSAGE` characters: a client's bytes quoted in
one cannot forge lines or grow them.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
_SANE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _new_id_source() -> None:
    """A random prefix per process (drawn again in each forked worker) and a counter after it."""
    global _id_prefix, _id_counter
    _id_prefix, _id_counter = os.urandom(4).hex(), itertools.count()


_id_prefix, _id_counter = "", itertools.count()
_new_id_source()
os.register_at_fork(after_in_child=_new_id_source)


def new_request_id(offered: str | None) -> str:
    """The client's id if it is short and plain, else a new one (16 hex digits, unique per process)."""
    if offered and _SANE_ID.fullmatch(offered):
        return offered
    return f"{_id_prefix}{next(_id_counter) & 0xFFFFFFFF:08x}"


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


BURST = 10
INTERVAL = 10.0
MAX_MESSAGE = 1000
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_suppressed: dict[str, int] = {}  # lines left out since start, by logger


def suppressed_counts() -> dict[str, int]:
    """Log lines the rate limit left out since this process started, by logger name."""
    return dict(_suppressed)


def clean(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` on one line, control characters escaped, cut to about ``limit`` characters."""
    if len(message) > limit:
        message = f"{message[:limit]}... ({len(message) - limit} more characters)"
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", message)


class _RateLimit(logging.Filter):
    """At most ``burst`` lines of one kind per ``interval``; the next one written says how many were left out."""

    _LIMITED = ("aiohttp", "asyncio", "proxy.serving.listener")

    def __init__(self, burst: int = BURST, interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst, self.interval, self._clock = burst, interval, clock
        self._windows: dict[tuple[str, str], list[float]] = {}  # kind -> [start, written, left out]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING and not record.name.startswith(self._LIMITED):
            return True
        kind = (record.name, str(record.msg)[:48])
        now = self._clock()
        window = self._windows.get(kind)
        if window is None or now - window[0] >= self.interval:
            if len(self._windows) > 4096:  # bounded: forget the kinds that went quiet
                self._windows = {k: w for k, w in self._windows.items() if now - w[0] < self.interval}
            self._windows[kind] = [now, 1, 0]
            if window is not None and window[2]:
                record.msg = f"{record.getMessage()} [{window[2]:.0f} more like this left out in {self.interval:g} s]"
                record.args = ()
            return True
        if window[1] < self.burst:
            window[1] += 1
            return True
        window[2] += 1
        _suppressed[record.name] = _suppressed.get(record.name, 0) + 1
        return False

    def ended(self) -> list[tuple[str, str, int]]:
        """(logger, message start, lines left out) of each kind whose interval is over with lines left out;
        forgotten here, so each count is told once."""
        now = self._clock()
        out = [(name, template, int(w[2])) for (name, template), w in self._windows.items()
               if w[2] and now - w[0] >= self.interval]
        for name, template, _ in out:
            del self._windows[(name, template)]
        return out


_limit: _RateLimit | None = None  # the one :func:`configure` installed


def flush_suppressed() -> None:
    """One line for each kind of line the rate limit left out whose interval has ended (call it periodically)."""
    if _limit is None:
        return
    for name, template, count in _limit.ended():
        logging.getLogger(name).warning("%d more line(s) like %r left out in the last %g s", count, template,
                                        _limit.interval)


class _OneLine(logging.Filter):
    """The message escaped and cut (:func:`clean`); tracebacks are formatted apart, untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = clean(record.getMessage()), ()
        return True


class _QuietBadRequests(logging.Filter):
    """aiohttp logs every malformed request at ERROR with a traceback: one line is enough,
    or a hostile client could flood the logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        # Looked up, not imported: a command that serves no HTTP need not load aiohttp to log.
        http = sys.modules.get("aiohttp.http_exceptions")
        if http is not None and isinstance(exc, http.BadHttpMessage):
            record.msg, record.args = "bad request from a client: %s", (clean(str(exc), 200),)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure(level: str, fmt: str = "text") -> None:
    """Send logs to stderr at ``level`` in ``fmt`` ('text' or 'json')."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RequestIdFilter())
    handler.addFilter(_QuietBadRequests())
    global _limit
    _limit = _RateLimit()
    handler.addFilter(_limit)
    handler.addFilter(_OneLine())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s level=%(levelname)s logger=%(name)s request_id=%(request_id)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
