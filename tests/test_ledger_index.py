"""The ledger's on-disk index (issue 37): what a process reads at start, and what it does when the file changed.

The ledger file is the record; ``ledger.sqlite`` only indexes it.  These tests drive two
:class:`Ledger` objects over one directory as two processes would (a gateway and ``tufproxy gateway
revoke``), and damage the file the ways an operator or a crash can.
"""

from __future__ import annotations

import json
import logging
import os
import tracemalloc
from pathlib import Path

import pytest

from proxy.gateway.ledger import INDEX, Ledger, Pin
from proxy.protocol import index


def pin(project: str, n: int, url: str = "https://files.example/x") -> dict:
    return {"kind": "pin", "project": project, "filename": f"{project}-{n}.0-py3-none-any.whl",
            "hashes": {"sha256": f"{n:064x}"}, "size": 100 + n, "index": "https://index.example/simple/", "url": url,
            "core_metadata": None}


def test_a_second_process_reads_only_what_was_appended_since(tmp_path: Path) -> None:
    first = Ledger(tmp_path)
    assert first.reindexed  # nothing indexed yet
    first.append([pin("alpha", 1), pin("alpha", 2), {"kind": "project", "project": "alpha",
                                                     "index": "https://index.example/simple/"}])
    second = Ledger(tmp_path)
    assert not second.reindexed and second.lines_read == 0
    assert second.pins.get(("alpha", "alpha-1.0-py3-none-any.whl")) == Pin(
        "alpha", "alpha-1.0-py3-none-any.whl", {"sha256": f"{1:064x}"}, 101, "https://index.example/simple/",
        "https://files.example/x")
    assert second.index_of("alpha") == "https://index.example/simple/"
    # One process appends, the other takes it in once: neither applies a line twice.
    second.append([{"kind": "revoke", "project": "alpha", "filename": None}])
    assert first.reload() is False and first.is_revoked("alpha") and first.lines_read == 3
    first.append([{"kind": "publisher", "project": "alpha", "spec": "github:a/b", "filename": None}])
    second.append([{"kind": "publisher", "project": "alpha", "spec": "github:c/d", "filename": None}])
    assert (first.publisher("alpha") or {})["spec"] == (second.publisher("alpha") or {})["spec"] == "github:c/d"
    assert [r["spec"] for r in first.publishers()] == ["github:c/d"]


def test_project_view_and_the_pin_a_listing_completes(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    signed = index.ProjectPage(name="beta", files=(index.DistFile("beta-1.0-py3-none-any.whl", "x",
                                                                  {"sha256": f"{1:064x}"}, size=101),))
    missing = ledger.missing_pins("beta", signed)
    assert [p.filename for p in missing] == ["beta-1.0-py3-none-any.whl"] and missing[0].url == ""
    ledger.append(ledger.pin_records(missing))
    assert ledger.missing_pins("beta", signed) == []
    # A listing of the same contents fills in the URL; one of other contents never replaces the pin.
    other = {**pin("beta", 1, url="https://files.example/other"), "hashes": {"sha256": "f" * 64}}
    ledger.append([other])
    assert ledger.pins.get(("beta", "beta-1.0-py3-none-any.whl")).url == ""  # type: ignore[union-attr]
    ledger.append([pin("beta", 1)])
    assert ledger.pins.get(("beta", "beta-1.0-py3-none-any.whl")).url == "https://files.example/x"  # type: ignore[union-attr]
    ledger.append([{"kind": "seen", "project": "beta", "filename": "beta-2.0.tar.gz",
                    "counts_from": "2026-01-02T03:04:05+00:00"},
                   {"kind": "provenance", "project": "beta", "filename": "beta-1.0-py3-none-any.whl",
                    "publisher": "github:a/b", "sha256": "0" * 64, "url": "u"}])
    view = ledger.project("beta")
    assert set(view.pins) == {"beta-1.0-py3-none-any.whl"} and view.listed
    assert view.seen["beta-2.0.tar.gz"] is not None and view.seen["beta-2.0.tar.gz"].year == 2026
    assert view.provenance == {"beta-1.0-py3-none-any.whl"}
    assert not ledger.project("gamma").listed
    assert [e["kind"] for e in ledger.entries()] == ["pin", "seen"]


@pytest.mark.parametrize("damage", ["truncated", "rewritten", "replaced", "deleted", "index-junk", "index-deleted"])
def test_a_changed_file_is_indexed_again_at_start(tmp_path: Path, damage: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    ledger = Ledger(tmp_path)
    ledger.append([pin("alpha", n) for n in range(1, 4)])
    ledger.append([pin("beta", 1)])
    ledger.close()
    path, lines = ledger.path, ledger.path.read_bytes().splitlines(keepends=True)
    expect = {"alpha", "beta"}
    if damage == "truncated":
        path.write_bytes(b"".join(lines[:2]))
        expect = {"alpha"}
    elif damage == "rewritten":  # same inode, same length and more: only the bytes tell
        path.write_bytes(b"junk one\n" + b"".join(lines[1:]).replace(b'"beta"', b'"bet2"'))
        expect = {"alpha", "bet2"}
    elif damage == "replaced":
        replacement = tmp_path / "new.jsonl"
        replacement.write_bytes(lines[3])
        os.replace(replacement, path)
        expect = {"beta"}
    elif damage == "deleted":
        path.unlink()
        expect = set()
    elif damage == "index-junk":
        (tmp_path / INDEX).write_bytes(b"not a database" * 100)
        for suffix in ("-wal", "-shm"):
            Path(f"{tmp_path / INDEX}{suffix}").unlink(missing_ok=True)
    else:
        (tmp_path / INDEX).unlink()
    with caplog.at_level(logging.INFO, "proxy.gateway.ledger"):
        again = Ledger(tmp_path)
    assert again.reindexed
    assert {p for (p, _), _ in again.pins.items()} == expect
    if damage == "rewritten":
        assert "1 line(s) are not records and were skipped: line 1 (b'junk one')" in caplog.text
    if damage == "index-junk":
        assert "is unreadable" in caplog.text
    # Re-opened once more, the index is trusted again (a missing file is nothing to trust).
    assert Ledger(tmp_path).reindexed is (damage == "deleted")


def test_a_running_process_reads_a_replaced_file_again_and_keeps_what_it_knew(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ledger = Ledger(tmp_path)
    ledger.append([pin("alpha", 1), {"kind": "revoke", "project": "alpha", "filename": None}])
    replacement = tmp_path / "new.jsonl"
    replacement.write_bytes(json.dumps(pin("beta", 1)).encode() + b"\n")
    os.replace(replacement, ledger.path)
    with caplog.at_level(logging.WARNING, "proxy.gateway.ledger"):
        assert ledger.reload()
    assert "was replaced since it was read: reading all of it again" in caplog.text
    assert ("alpha", "alpha-1.0-py3-none-any.whl") in ledger.pins and ("beta", "beta-1.0-py3-none-any.whl") in ledger.pins
    assert ledger.is_revoked("alpha")
    # A torn last line is left for the next append to complete.
    with open(ledger.path, "ab") as f:
        f.write(b'{"kind": "revoke", "proj')
    assert not ledger.reload()
    ledger.append([{"kind": "revoke", "project": "beta", "filename": None}])
    assert ledger.is_revoked("beta") and Ledger(tmp_path).is_revoked("beta")


@pytest.mark.slow
def test_memory_and_start_do_not_grow_with_the_ledger(tmp_path: Path) -> None:
    """20,000 projects of 3 pins and 3 first sights each: a process holds none of them, and reads none at start."""
    records = []
    for i in range(20_000):
        project = f"p{i}"
        records += [pin(project, n) for n in range(3)]
        records += [{"kind": "seen", "project": project, "filename": f"{project}-{n}.0-py3-none-any.whl",
                     "counts_from": None} for n in range(3)]
    with open(tmp_path / "ledger.jsonl", "wb") as f:
        f.writelines(json.dumps(r).encode() + b"\n" for r in records)
    Ledger(tmp_path).close()  # the first open indexes the file
    tracemalloc.start()
    try:
        ledger = Ledger(tmp_path)
        assert ledger.pins.get(("p19999", "p19999-2.0-py3-none-any.whl")) is not None
        assert ledger.project("p7").seen.keys() == {f"p7-{n}.0-py3-none-any.whl" for n in range(3)}
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ledger.lines_read == 0 and not ledger.reindexed
    # The in-memory form took ~5 KB per project, 100 MB here; the index is read through SQLite's page cache.
    assert peak < 4 << 20, peak


def test_the_index_is_as_private_as_the_ledger(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.append([pin("alpha", 1)])
    mode = ledger.path.stat().st_mode & 0o777
    assert (tmp_path / INDEX).stat().st_mode & 0o777 == mode and not mode & 0o007
