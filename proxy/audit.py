"""The audit log: one JSON object per line for every refused (and, optionally, accepted) artifact.

Security teams read this file, so it is append-only, never holds secrets
(URLs are logged without credentials or query strings), and a failure to
write it is an :class:`AuditWriteError`: the request that caused the record
fails closed instead of succeeding unrecorded.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit


class AuditWriteError(OSError):
    """A record could not be written: the caller must refuse the request."""


def redact_url(url: str) -> str:
    """``url`` without user:password, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class AuditLog:
    """Appends JSON lines to a file (or stdout when no path is given)."""

    def __init__(self, path: Path | None = None, log_accepted: bool = False) -> None:
        self.path = path
        self.log_accepted = log_accepted
        self._lock = threading.Lock()
        self._stream: TextIO
        if path is None:
            self._stream = sys.stdout
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            # O_APPEND: several processes may share one log; each line lands whole.
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            self._stream = os.fdopen(fd, "a", buffering=1)

    def _write(self, record: dict[str, Any]) -> None:
        record = {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), **record}
        if "upstream_url" in record and record["upstream_url"]:
            record["upstream_url"] = redact_url(str(record["upstream_url"]))
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        try:
            with self._lock:
                self._stream.write(line)
                self._stream.flush()
        except (OSError, ValueError) as e:
            raise AuditWriteError(f"cannot write audit log {self.path or 'stdout'}: {e}") from e

    def refused(self, **fields: Any) -> None:
        """Record a refusal: reason, target, expected vs actual, versions."""
        self._write({"event": "refused", **fields})

    def accepted(self, **fields: Any) -> None:
        """Record an artifact served after verification (only when enabled)."""
        if self.log_accepted:
            self._write({"event": "accepted", **fields})

    def close(self) -> None:
        if self._stream is not sys.stdout:
            self._stream.close()
