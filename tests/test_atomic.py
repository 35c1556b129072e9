"""A signing batch made durable side by side (issue 33): every file and directory flushed, a failure raised once
the rest are done, and a process forked after its parent flushed flushing with threads of its own."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from proxy.util import atomic
from proxy.util.atomic import Batch


def _batch(root: Path, n: int) -> tuple[Batch, list[Path]]:
    batch = Batch()
    paths = [root / f"d{i % 3}" / f"f{i}" for i in range(n)]
    for i, path in enumerate(paths):
        batch.write(path, b"x" * i)
    return batch, paths


def test_flush_fsyncs_every_file_and_each_directory_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_ino), real(fd))[1])
    batch, paths = _batch(tmp_path, 12)
    batch.add(paths[0])  # named twice: flushed once
    batch.flush()
    wanted = {p.stat().st_ino for p in paths} | {(tmp_path / f"d{i}").stat().st_ino for i in range(3)}
    assert sorted(synced) == sorted(wanted)
    assert batch.paths == []


def test_a_file_gone_before_the_flush_raises_after_the_others_and_stays_to_flush(tmp_path: Path) -> None:
    batch, paths = _batch(tmp_path, 20)
    paths[7].unlink()
    with pytest.raises(FileNotFoundError):
        batch.flush()
    assert batch.paths == paths  # nothing is taken for durable: the caller's commit point is not reached


def _flush_in_child(root: str) -> None:
    batch, _ = _batch(Path(root), 5)
    batch.flush()


def test_a_process_forked_after_its_parent_flushed_flushes_with_its_own_threads(tmp_path: Path) -> None:
    _batch(tmp_path / "parent", 5)[0].flush()  # the parent's pool exists, its threads running
    child = multiprocessing.get_context("fork").Process(target=_flush_in_child, args=(str(tmp_path / "child"),))
    child.start()
    child.join(30)  # an inherited pool has no threads: the child would wait for ever
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0
    assert len(list((tmp_path / "child").rglob("f*"))) == 5


def test_a_commit_fsyncs_its_file_with_the_batch_then_renames_it_and_fsyncs_its_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit point's own file is flushed with the files it reaches, before its name replaces the old one."""
    events: list[str] = []
    real = os.fsync
    commit = tmp_path / "d0" / "timestamp.json"
    commit.parent.mkdir(parents=True)
    commit.write_bytes(b"old")

    def fsync(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        events.append("fsync " + ("dir" if os.path.isdir(name) else "commit" if ".timestamp.json." in name
                                   else "file"))
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    batch, _ = _batch(tmp_path, 6)
    batch.commit(commit, b"new", before=lambda: events.append(f"before, still {commit.read_bytes().decode()}"))
    assert commit.read_bytes() == b"new"
    assert events.index("before, still old") == len(events) - 2  # every other fsync came before it
    assert events[-1] == "fsync dir" and "fsync commit" in events[:-2]
    assert batch.paths == [] and not list(commit.parent.glob(".*.tmp"))


def test_a_commit_whose_batch_does_not_flush_leaves_the_old_file(tmp_path: Path) -> None:
    commit = tmp_path / "d0" / "timestamp.json"
    batch, paths = _batch(tmp_path, 6)
    commit.write_bytes(b"old")
    paths[2].unlink()
    with pytest.raises(FileNotFoundError):
        batch.commit(commit, b"new", before=lambda: pytest.fail("told before the files were durable"))
    assert commit.read_bytes() == b"old" and not list(commit.parent.glob(".*.tmp"))
    assert batch.paths == paths  # the files stay to flush; the commit's own is gone


def test_in_order_renames_each_file_once_on_disk_and_after_the_one_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first file's fsync held until the second's is done: the second still waits to be renamed after it."""
    import asyncio
    import threading

    from proxy.util.atomic import InOrder

    events: list[str] = []
    second_synced = threading.Event()
    real_fsync, real_replace = atomic._fsync, atomic.os.replace

    def fsync(path: Path, *args: int) -> None:
        name = Path(path).name
        if name.startswith(".a."):
            assert second_synced.wait(10)
        real_fsync(path, *args)
        events.append("dir" if Path(path).is_dir() else f"fsync {name.split('.')[1]}")
        if name.startswith(".b."):
            second_synced.set()

    monkeypatch.setattr(atomic, "_fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (events.append(f"rename {Path(b).name}"),
                                                            real_replace(a, b))[1])
    (tmp_path / "a").write_bytes(b"old a")

    async def run() -> None:
        order = InOrder()
        await order.replace(tmp_path / "a", b"new a")
        await order.replace(tmp_path / "b", b"new b")
        assert (tmp_path / "a").read_bytes() == b"old a"  # written beside it, not renamed yet
        await order.settle()

    asyncio.run(run())
    assert events == ["fsync b", "fsync a", "rename a", "rename b", "dir"]
    assert (tmp_path / "a").read_bytes() == b"new a" and (tmp_path / "b").read_bytes() == b"new b"
    assert not list(tmp_path.glob(".*.tmp"))


def test_in_order_renames_nothing_after_a_file_that_did_not_reach_the_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from proxy.util.atomic import InOrder

    real_fsync = atomic._fsync

    def fsync(path: Path, *args: int) -> None:
        if Path(path).name.startswith(".a."):
            raise OSError(5, "Input/output error")
        real_fsync(path, *args)

    monkeypatch.setattr(atomic, "_fsync", fsync)
    (tmp_path / "a").write_bytes(b"old a")

    async def run() -> None:
        order = InOrder()
        await order.replace(tmp_path / "a", b"new a")
        await order.replace(tmp_path / "b", b"new b")
        with pytest.raises(OSError, match="Input/output"):
            await order.settle()

    asyncio.run(run())
    assert (tmp_path / "a").read_bytes() == b"old a" and not (tmp_path / "b").exists()
    assert not list(tmp_path.glob(".*.tmp"))
