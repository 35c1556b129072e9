"""When each published project's page was last fetched from its index, kept across restarts.

A gateway that forgot these at a restart found every published project due
at once, whatever ``--page-ttl`` said, and re-fetched them all at
``--refresh-rate``: about 67 minutes of load on the index for 20,000
projects.  Each fetch now appends one line, ``{"p": project, "t": wall
clock}``, to ``run/fetched.jsonl`` (``O_APPEND``: the workers of one gateway
share it; no fsync: a crash loses at most a few fetch times, and the pages
are then merely fetched early).  At start-up the file is read (a project's
last line wins, torn or junk lines skipped) into the usual bounded map of
monotonic times, and rewritten compacted when it holds many more lines
than projects, so it stays proportional to what is published.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from proxy.util.atomic import atomic_write
from proxy.util.recent import Recent

log = logging.getLogger(__name__)

COMPACT_FACTOR = 4  # rewrite once the log holds this many lines per project kept (and at least MIN_COMPACT)
MIN_COMPACT = 1024


class FetchTimes(Recent):
    """Name -> monotonic time of its last fetch, most recent last, at most ``limit`` entries, persisted to ``path``."""

    def __init__(self, limit: int, path: Path | None = None, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        super().__init__(limit)
        self.path, self._clock, self._wall = path, clock, wall
        if path is not None:
            self._load(path)

    def record(self, project: str) -> None:
        """``project`` was fetched now: remembered here and, if persisted, on disk."""
        self[project] = self._clock()
        if self.path is None:
            return
        line = json.dumps({"p": project, "t": round(self._wall(), 3)}).encode() + b"\n"
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as e:  # only an earlier refresh after a restart is lost: said, never fatal
            log.warning("cannot record a fetch time in %s: %s", self.path, e)

    def _load(self, path: Path) -> None:
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:
            return
        except OSError as e:
            log.warning("cannot read fetch times from %s (%s): every published page is due now", path, e)
            return
        wall: dict[str, float] = {}
        for line in lines:
            try:
                record = json.loads(line)
                project, when = record["p"], float(record["t"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line, or junk: that project is merely due
            if isinstance(project, str):
                wall.pop(project, None)  # re-inserted: the order is that of the last fetch
                wall[project] = when
        now_wall, now = self._wall(), self._clock()
        for project, when in wall.items():
            self[project] = now - max(0.0, now_wall - when)  # a clock that went back counts as "just now"
        if len(lines) > max(MIN_COMPACT, COMPACT_FACTOR * len(self)):
            body = b"".join(json.dumps({"p": p, "t": wall[p]}).encode() + b"\n" for p in self)
            with contextlib.suppress(OSError):
                atomic_write(path, body)
                log.info("compacted %s: %d fetch times kept of %d lines", path, len(self), len(lines))
