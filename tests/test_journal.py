"""The journal of changed names a gateway's writers keep for its bucket copier (proxy.util.journal)."""

from __future__ import annotations

from pathlib import Path

from proxy.util.journal import Journal


def test_each_line_is_taken_once_by_whichever_process_comes_first(tmp_path: Path) -> None:
    writer, copier, other = (Journal(tmp_path / "j") for _ in range(3))  # three processes' views of one file
    writer.wrote(["metadata/1.bin-0.json", "simple/a/ab.index.json"])
    writer.removed(["simple/a/old.index.json"])
    assert copier.take() == (["metadata/1.bin-0.json", "simple/a/ab.index.json"], ["simple/a/old.index.json"])
    assert other.take() == ([], []) and copier.take() == ([], [])
    writer.wrote(["metadata/timestamp.json"])
    assert other.take() == (["metadata/timestamp.json"], [])
    writer.wrote(["bad\nname", "x"])  # a name with a newline could forge another line: never written
    assert copier.take() == (["x"], [])


def test_a_line_still_being_written_is_left_for_the_next_take(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j")
    journal.wrote(["a"])
    with open(tmp_path / "j", "ab") as f:
        f.write(b"+half")
    assert journal.take() == (["a"], [])
    with open(tmp_path / "j", "ab") as f:
        f.write(b"way\n")
    assert journal.take() == (["halfway"], [])


def test_skip_and_the_bound_on_its_size(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", limit=100)
    journal.wrote(["before the walk"])
    journal.skip()  # a copier about to walk the whole tree
    assert journal.take() == ([], [])
    for i in range(20):
        journal.wrote([f"name-{i}"])
    assert len(journal.take()[0]) == 20
    assert (tmp_path / "j").stat().st_size == 0  # read to the end and past its limit: emptied
    journal.wrote(["after"])
    assert journal.take() == (["after"], [])
