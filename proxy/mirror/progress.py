"""What a sync tells its operator while it runs, and the summary at the end.

On a terminal: a progress bar (bytes, rate, time left; :class:`~proxy.util.progress.Meter`)
with refusals and failures printed above it.  Otherwise (cron, CI, a log
file): one plain line per file fetched or refused, so the log says what
happened to what, and the meter's periodic line.  ``quiet``: no progress,
only refusals, failures and the summary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TextIO

from proxy.util.progress import Meter, duration, human_bytes

__all__ = ["Counts", "Progress"]


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
    """Reports a sync's progress to ``stream`` (a TTY gets a live bar)."""

    def __init__(self, stream: TextIO, tty: bool | None = None, quiet: bool = False) -> None:
        self.counts = Counts()
        self.total_files: int | None = None
        self.quiet = quiet
        self.meter = Meter("sync", None, "bytes", stream, quiet=quiet, tty=tty)
        self._start = time.monotonic()

    def planned(self, files: int, nbytes: int) -> None:
        """The download phase knows its size now: time left becomes possible."""
        self.total_files = files
        self.meter.retotal(nbytes)

    def present(self, nbytes: int) -> None:
        self.counts.files += 1
        self.counts.present += 1
        self.meter.advance(nbytes)

    def unchanged(self, files: int) -> None:
        """``files`` left as the last sync published them (their projects did not change)."""
        self.counts.files += files
        self.counts.present += files
        self.counts.unchanged += files

    def fetched(self, name: str, nbytes: int) -> None:
        self.counts.files += 1
        self.counts.fetched += 1
        self.counts.bytes_fetched += nbytes
        if not self.meter.tty and not self.quiet:
            self.meter.note(f"fetched {name} ({human_bytes(nbytes)}) {self._position()}")
        self.meter.advance(nbytes)

    def refused(self, name: str, why: str) -> None:
        self.counts.refused.append(name)
        self.meter.note(f"REFUSED {name}: {why}")

    def failed(self, name: str, why: str) -> None:
        self.counts.failed.append(name)
        self.meter.note(f"failed {name}: {why}")

    def not_found(self, name: str, why: str | None = None) -> None:
        self.counts.not_found.append(name)
        self.meter.note(f"not found upstream: {name}" + (f" ({why})" if why else ""))

    def note(self, message: str) -> None:
        self.meter.note(message)

    def _position(self) -> str:
        done = self.counts.files
        return f"[{done}/{self.total_files}]" if self.total_files is not None else f"[{done}]"

    def summary(self) -> str:
        """The closing lines: projects, files, bytes, refusals."""
        self.meter.close()
        c = self.counts
        elapsed = time.monotonic() - self._start
        headline = (
            f"synced {c.projects} project(s): {c.files} target(s), {c.fetched} fetched "
            f"({human_bytes(c.bytes_fetched)}), {c.present} already present"
            f"{f' ({c.unchanged} in projects whose bins did not move)' if c.unchanged else ''}; "
            f"{len(c.refused)} refused, {len(c.failed)} failed, {len(c.not_found)} not found; "
            f"in {duration(elapsed)}"
        )
        lines = [headline]
        lines += [f"  refused: {name}" for name in c.refused]
        lines += [f"  failed: {name}" for name in c.failed]
        lines += [f"  not found: {name}" for name in c.not_found]
        return "\n".join(lines)
