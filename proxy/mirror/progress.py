"""What a sync tells its operator while it runs, and the summary at the end.

On a terminal: one line redrawn in place (files, bytes, rate, ETA).
Otherwise (cron, CI, a log file): one plain line per file fetched or
refused, so the log says what happened to what.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TextIO

# Redraw a terminal line at most this often (seconds).
_REDRAW = 0.1


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@dataclass
class Counts:
    """What a sync did; the summary and the exit code come from here."""

    projects: int = 0
    files: int = 0  # every target in the mirror: pages, distributions, .metadata
    fetched: int = 0
    present: int = 0
    unchanged: int = 0  # of present: left as the last sync published them, not re-hashed (their bins did not move)
    bytes_fetched: int = 0
    refused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)


class Progress:
    """Reports a sync's progress to ``stream`` (a TTY gets a live line)."""

    def __init__(self, stream: TextIO, tty: bool | None = None) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.counts = Counts()
        self.total_files: int | None = None
        self.total_bytes: int | None = None
        self._done_bytes = 0  # fetched or already present, towards total_bytes
        self._start = time.monotonic()
        self._drawn = 0.0

    def planned(self, files: int, nbytes: int) -> None:
        """The download phase knows its size now: ETA becomes possible."""
        self.total_files, self.total_bytes = files, nbytes
        self._draw(force=True)

    def present(self, nbytes: int) -> None:
        self.counts.files += 1
        self.counts.present += 1
        self._done_bytes += nbytes
        self._draw()

    def unchanged(self, files: int) -> None:
        """``files`` left as the last sync published them (their projects did not change)."""
        self.counts.files += files
        self.counts.present += files
        self.counts.unchanged += files

    def fetched(self, name: str, nbytes: int) -> None:
        self.counts.files += 1
        self.counts.fetched += 1
        self.counts.bytes_fetched += nbytes
        self._done_bytes += nbytes
        if not self.tty:
            self._line(f"fetched {name} ({human_bytes(nbytes)}) {self._position()}")
        self._draw()

    def refused(self, name: str, why: str) -> None:
        self.counts.refused.append(name)
        self._line(f"REFUSED {name}: {why}")

    def failed(self, name: str, why: str) -> None:
        self.counts.failed.append(name)
        self._line(f"failed {name}: {why}")

    def not_found(self, name: str, why: str | None = None) -> None:
        self.counts.not_found.append(name)
        self._line(f"not found upstream: {name}" + (f" ({why})" if why else ""))

    def note(self, message: str) -> None:
        self._line(message)

    def _position(self) -> str:
        done = self.counts.files
        return f"[{done}/{self.total_files}]" if self.total_files is not None else f"[{done}]"

    def status_line(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-6)
        rate = self.counts.bytes_fetched / elapsed
        parts = [f"{self._position()} files", human_bytes(self._done_bytes)]
        if self.total_bytes is not None:
            parts[-1] += f"/{human_bytes(self.total_bytes)}"
        parts.append(f"{human_bytes(rate)}/s")
        if self.total_bytes is not None and rate > 0:
            parts.append(f"ETA {_duration(max(self.total_bytes - self._done_bytes, 0) / rate)}")
        if self.counts.refused:
            parts.append(f"{len(self.counts.refused)} refused")
        return "  ".join(parts)

    def _draw(self, force: bool = False) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if force or now - self._drawn >= _REDRAW:
            self._drawn = now
            self.stream.write("\r\x1b[K" + self.status_line())
            self.stream.flush()

    def _line(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
        self.stream.write(text + "\n")
        self.stream.flush()
        self._draw(force=True)

    def summary(self) -> str:
        """The closing lines: projects, files, bytes, refusals."""
        c = self.counts
        elapsed = time.monotonic() - self._start
        if self.tty:
            self.stream.write("\r\x1b[K")
        headline = (
            f"synced {c.projects} project(s): {c.files} target(s), {c.fetched} fetched "
            f"({human_bytes(c.bytes_fetched)}), {c.present} already present"
            f"{f' ({c.unchanged} in projects whose bins did not move)' if c.unchanged else ''}; "
            f"{len(c.refused)} refused, {len(c.failed)} failed, {len(c.not_found)} not found; "
            f"in {_duration(elapsed)}"
        )
        lines = [headline]
        lines += [f"  refused: {name}" for name in c.refused]
        lines += [f"  failed: {name}" for name in c.failed]
        lines += [f"  not found: {name}" for name in c.not_found]
        return "\n".join(lines)
