"""Progress where people wait: a rich bar on a terminal, a plain line now and then in a log, nothing when quiet."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from proxy.util import progress
from proxy.util.progress import Meter


def test_a_terminal_gets_a_bar_with_the_count_rate_and_time_left() -> None:
    stream = io.StringIO()
    with Meter("signing metadata", 100, "roles", stream, tty=True) as meter:
        meter.advance(20)
        meter.note("a line of the work's own")
        meter._bar.refresh()
        drawn = stream.getvalue()
    assert "signing metadata" in drawn and "20/100" in drawn and "roles/s" in drawn and "a line of the work's own\n" in drawn
    assert stream.getvalue().endswith("\x1b[2K")  # transient: the bar is gone once the work is done


def test_a_log_gets_a_plain_line_at_most_every_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    meter = Meter("importing advisories", None, "records", stream, tty=False)
    meter.advance(5)
    assert stream.getvalue() == ""  # within the interval: nothing
    monkeypatch.setattr(progress, "PLAIN_EVERY", 0.0)
    meter.advance(5)
    meter.note("skipped x.json")
    [line, note] = stream.getvalue().splitlines()
    assert line.startswith("importing advisories: 10, ") and " records/s, " in line and line.endswith(" so far")
    assert note == "skipped x.json" and "\x1b" not in stream.getvalue()
    sized = Meter("sync", 4_000_000, "bytes", io.StringIO(), tty=False)
    sized.advance(1_000_000)
    assert sized.status().startswith("sync: 1.0 MB/4.0 MB (25%), ") and sized.status().endswith(" left")


def test_quiet_prints_no_progress_but_the_works_own_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "PLAIN_EVERY", 0.0)
    for tty in (True, False):
        stream = io.StringIO()
        with Meter("sync", 10, stream=stream, quiet=True, tty=tty) as meter:
            meter.advance(5)
            meter.note("REFUSED a: b")
        assert stream.getvalue() == "REFUSED a: b\n"


def test_init_counts_every_role_it_signs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.repository import Repository

    monkeypatch.setattr(progress, "PLAIN_EVERY", 0.0)
    stream = io.StringIO()
    with Meter("signing the first metadata", unit="roles", stream=stream, tty=False) as meter:
        Repository.init(tmp_path / "repo", bins=16, meter=meter)
    # root, targets, bins and 16 bin-n roles
    assert meter.total == meter.done == 19
    assert stream.getvalue().splitlines()[-1].startswith("signing the first metadata: 19/19 (100%), ")
