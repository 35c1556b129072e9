"""Process logging: JSON lines or key=value text, each record tagged with its request id.

The server sets :data:`request_id` for the duration of each request (from a
sane ``X-Request-Id`` header, else a fresh one), so every log line and
audit record a request causes can be joined on it.
"""

from __future__ import annotations

import contextvars
import itertools
import json
import logging
import os
import re
import sys

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


class _QuietBadRequests(logging.Filter):
    """aiohttp logs every malformed request at ERROR with a traceback: one line is enough,
    or a hostile client could flood the logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        # Looked up, not imported: a command that serves no HTTP need not load aiohttp to log.
        http = sys.modules.get("aiohttp.http_exceptions")
        if http is not None and isinstance(exc, http.BadHttpMessage):
            record.msg, record.args, record.exc_info, record.exc_text = f"bad request from a client: {exc}", (), None, None
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
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s level=%(levelname)s logger=%(name)s request_id=%(request_id)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
