"""Fetch times kept across restarts (proxy.gateway.fetchtimes): plain files, a fake clock."""

from __future__ import annotations

import json
from pathlib import Path

from proxy.gateway import fetchtimes
from proxy.gateway.fetchtimes import FetchTimes


def test_the_last_line_of_a_project_wins_junk_is_skipped_and_wall_time_becomes_monotonic(tmp_path: Path) -> None:
    path = tmp_path / "fetched.jsonl"
    wall, mono = [1_000_000.0], [50.0]
    first = FetchTimes(10, path, clock=lambda: mono[0], wall=lambda: wall[0])
    first.record("a")
    wall[0] += 100
    first.record("b")
    with path.open("ab") as f:
        f.write(b'{"p": "a", "t": 1000090.0}\n{"p": 7, "t": 1}\nnot json\n{"p": "c", "t": 2000000000.0}\n{"torn')
    wall[0], mono[0] = 1_000_200.0, 5.0  # a restart: another monotonic origin
    again = FetchTimes(10, path, clock=lambda: mono[0], wall=lambda: wall[0])
    assert again == {"b": 5.0 - 100, "a": 5.0 - 110, "c": 5.0}  # c's time is in the future: "just now"
    assert list(again) == ["b", "a", "c"]  # the order of the last fetches


def test_the_map_is_bounded_and_the_file_compacted(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(fetchtimes, "MIN_COMPACT", 10)
    path = tmp_path / "fetched.jsonl"
    times = FetchTimes(3, path)
    for i in range(40):
        times.record(f"p{i % 5}")
    assert len(times) == 3 and len(path.read_bytes().splitlines()) == 40
    reloaded = FetchTimes(3, path)
    assert list(reloaded) == ["p2", "p3", "p4"]
    assert [json.loads(line)["p"] for line in path.read_bytes().splitlines()] == ["p2", "p3", "p4"]


def test_an_unwritable_file_is_said_and_never_fatal(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    times = FetchTimes(3, tmp_path / "missing-dir" / "fetched.jsonl")
    times.record("a")
    assert "a" in times and "cannot record a fetch time" in caplog.text
