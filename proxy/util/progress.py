"""Progress of long command-line work (mirror sync, init, advisory import, benchmarks), where people wait.

On a terminal, a ``rich`` progress bar with the count, the rate and the time
left, redrawn in place; lines the work prints meanwhile go above it.  Not
on a terminal (cron, CI, a log file), a plain line at most every
:data:`PLAIN_EVERY` seconds and one at the end, so a log says how far the
work got without a line per item.  ``quiet`` prints no progress at all (the
work's own lines still go out: they are results, not progress).
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

PLAIN_EVERY = 10.0


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Meter:
    """``what`` advancing towards ``total`` items (None: unknown), counted in ``unit``s (``"bytes"`` reads as sizes).

    Use as a context manager, or call :meth:`close` once done.
    """

    def __init__(self, what: str, total: float | None = None, unit: str = "", stream: TextIO | None = None,
                 quiet: bool = False, tty: bool | None = None) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.tty = self.stream.isatty() if tty is None else tty
        self.done = 0.0
        self._start = self._printed = time.monotonic()
        self._bar: Any = None
        self._task: Any = None
        if self.tty and not quiet:
            self._open_bar()

    def _open_bar(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        size = self.unit == "bytes"
        columns = [TextColumn("{task.description}"), BarColumn(),
                   DownloadColumn() if size else MofNCompleteColumn(),
                   TransferSpeedColumn() if size else TextColumn("[progress.data.speed]{task.fields[rate]}"),
                   TimeRemainingColumn()]
        self._bar = Progress(*columns, console=Console(file=self.stream, force_terminal=True), transient=True)
        self._task = self._bar.add_task(self.what, total=self.total, rate="")
        self._bar.start()

    def retotal(self, total: float | None) -> None:
        """The work knows its size now (or better than before)."""
        self.total = total
        if self._bar is not None:
            self._bar.update(self._task, total=total)

    def advance(self, n: float = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, advance=n, rate=f"{self._rate():.0f} {self.unit or 'items'}/s")
        elif not self.quiet and time.monotonic() - self._printed >= PLAIN_EVERY:
            self._printed = time.monotonic()
            self._write(self.status())

    def note(self, line: str) -> None:
        """A line of the work's own (not progress): above the bar on a terminal, else as is."""
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            self._write(line)

    def _rate(self) -> float:
        return self.done / max(time.monotonic() - self._start, 1e-6)

    def _amount(self, n: float) -> str:
        return human_bytes(n) if self.unit == "bytes" else f"{n:,.0f}"

    def status(self) -> str:
        """``what: done/total (pct), rate, time left`` as one plain line."""
        rate = self._rate()
        parts = [f"{self.what}: {self._amount(self.done)}"]
        if self.total:
            parts[0] += f"/{self._amount(self.total)} ({100 * self.done / self.total:.0f}%)"
        unit = "" if self.unit == "bytes" else f" {self.unit or 'items'}"
        parts.append(f"{self._amount(rate)}{unit}/s")
        if self.total and rate > 0:
            parts.append(f"{duration(max(self.total - self.done, 0) / rate)} left")
        else:
            parts.append(f"{duration(time.monotonic() - self._start)} so far")
        return ", ".join(parts)

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif not self.quiet and self.done and time.monotonic() - self._start >= PLAIN_EVERY:
            self._write(self.status())  # long enough that a log wants the end too

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
