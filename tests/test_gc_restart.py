"""Issue 37: garbage collection that survives a restart without looking at every project, and the gateway's one digest.

A collector keeps what it noted (hashed pages seen unreferenced, and when) in a record; a collector in a new
process takes it up and looks only at the projects whose bins moved since, deletes what was superseded before
the restart once the grace has passed, and never a page a current plain page names.  A record it cannot trust
costs a look at every project, as before.  A tree a gateway signed under sha256 and sha512 before it signed
sha256 alone stays whole until each page is signed again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.gateway import freshness
from proxy.gateway.freshness import Collector
from proxy.protocol import index
from proxy.protocol.layout import PageFormat
from proxy.protocol.profiles import GATEWAY
from proxy.repository import Repository
from proxy.repository.catalog import Catalog, snapshot_version

PROJECTS = 120
BINS = 64
GRACE = 100.0


def _page(name: str, release: int = 0) -> index.ProjectPage:
    files = tuple(index.DistFile(filename=f"{name}-{r}.0-py3-none-any.whl", url=f"{name}-{r}.0-py3-none-any.whl",
                                 hashes={"sha256": f"{r:064x}"}) for r in range(release))
    return index.ProjectPage(name=name, files=files)


def _gateway(tmp_path: Path) -> Repository:
    repo = Repository.init(tmp_path / "g", bins=BINS, layout="gateway", clock_versions=True)
    repo.publish_pages({f"p{i}": _page(f"p{i}") for i in range(PROJECTS)})
    return repo


def _hashed(repo: Repository, project: str) -> set[str]:
    return {p.name for p in (repo.public_dir / "simple" / project).glob("*.index.*")}


def _signed_names(repo: Repository, project: str, algorithms: tuple[str, ...] = ("sha256",)) -> set[str]:
    """The hashed names the project's current plain pages (the JSON one; the HTML one too where an earlier release
    signed it) are served under."""
    directory = repo.public_dir / "simple" / project
    return {f"{hashlib.new(a, (directory / plain).read_bytes()).hexdigest()}.{plain}"
            for plain in ("index.html", "index.json") if (directory / plain).exists() for a in algorithms}


def _every_current_page_is_there(repo: Repository) -> None:
    for directory in (repo.public_dir / "simple").iterdir():
        if (directory / "index.json").exists():
            assert _signed_names(repo, directory.name) <= _hashed(repo, directory.name), directory.name


class _Looks:
    """Counts the project directories whose plain pages a collection hashes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dirs: list[str] = []
        real = freshness._unreferenced

        def counting(directory: Path, algorithms: tuple[str, ...]) -> set[str]:
            self.dirs.append(directory.name)
            return real(directory, algorithms)

        monkeypatch.setattr(freshness, "_unreferenced", counting)


def test_a_collector_after_a_restart_deletes_what_was_superseded_before_it_and_looks_only_at_what_moved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _gateway(tmp_path)
    state = tmp_path / "run" / "gc-pending.json"
    catalog = Catalog(repo).update()
    t = time.time() + 10  # every page here was written before any collection's clock
    before = Collector(repo, GRACE, state)
    before.collect(catalog.take_touched(), now=t)
    assert before.looked_at == PROJECTS + 1  # no record yet: every project once, and simple/ itself
    superseded = _hashed(repo, "p1")
    repo.publish_pages({"p1": _page("p1", 1)})
    before.collect(catalog.update().take_touched(), now=t + 1)  # p1's first pages: unreferenced from t+1
    # Signed while no collector runs (after its last run, or by `gateway revoke` while the gateway is down).
    while_down = _hashed(repo, "p2")
    repo.publish_pages({"p2": _page("p2", 1)})
    assert json.loads(state.read_bytes())["pending"] == {"p1": dict.fromkeys(superseded, t + 1)}

    # The next process: its own repository and collector over the same directory and record.
    repo = Repository.open(tmp_path / "g")
    looks = _Looks(monkeypatch)
    after = Collector(repo, GRACE, state)
    after.collect((), now=t + 50)
    assert after.looked_at < PROJECTS / 8 and len(looks.dirs) < PROJECTS / 8, looks.dirs  # the moved bins' projects
    assert {"p1", "p2"} <= set(looks.dirs)
    assert superseded | while_down <= _hashed(repo, "p1") | _hashed(repo, "p2")  # within grace: kept
    looks.dirs.clear()
    after.collect((), now=t + 102)  # grace after the supersede it noted before the restart
    assert not superseded & _hashed(repo, "p1") and while_down <= _hashed(repo, "p2")
    assert set(looks.dirs) <= {"p1", "p2"}  # looked at again before deleting, nothing else
    after.collect((), now=t + 151)
    assert not while_down & _hashed(repo, "p2")  # grace after the restart's first look noted it
    _every_current_page_is_there(repo)
    assert _hashed(repo, "p1") == _signed_names(repo, "p1") and _hashed(repo, "p7") == _signed_names(repo, "p7")


def test_a_crash_that_loses_the_newest_record_only_keeps_pages_longer(tmp_path: Path) -> None:
    repo = _gateway(tmp_path)
    state = tmp_path / "run" / "gc-pending.json"
    catalog = Catalog(repo).update()
    t = time.time() + 10
    first = Collector(repo, GRACE, state)
    first.collect(catalog.take_touched(), now=t)
    older = state.read_bytes()
    superseded = _hashed(repo, "p1")
    repo.publish_pages({"p1": _page("p1", 1)})
    first.collect(catalog.update().take_touched(), now=t + 1)
    state.write_bytes(older)  # the write that noted p1's pages never reached the disk
    second = Collector(Repository.open(tmp_path / "g"), GRACE, state)
    second.collect((), now=t + 50)
    second.collect((), now=t + 102)
    assert superseded <= _hashed(repo, "p1")  # noted at t+50 now, not t+1: kept longer, never deleted sooner
    second.collect((), now=t + 151)
    assert not superseded & _hashed(repo, "p1")
    _every_current_page_is_there(repo)


def _truncated(record: dict[str, Any], data: bytes, current: int) -> bytes:
    return data[: len(data) // 2]


def _edited(change: Callable[[dict[str, Any], int], None]) -> Callable[[dict[str, Any], bytes, int], bytes]:
    def damage(record: dict[str, Any], data: bytes, current: int) -> bytes:
        change(record, current)
        return json.dumps(record).encode()
    return damage


DAMAGE: dict[str, tuple[Callable[[dict[str, Any], bytes, int], bytes], str]] = {
    "missing": (lambda record, data, current: b"", "no record"),
    "truncated": (_truncated, "unreadable"),
    "junk": (lambda record, data, current: b"\x00\xff" * 40, "unreadable"),
    "another format": (_edited(lambda r, c: r.update(format=99)), "damaged"),
    "another repository": (_edited(lambda r, c: r.update(root="0" * 64)), "damaged"),
    "a page outside simple/": (_edited(lambda r, c: r["pending"].update({"../../keys": {"0" * 64 + ".index.json": 1}})),
                               "damaged"),
    "a name that is no page": (_edited(lambda r, c: r["pending"].update({"p3": {"index.json": 1}})), "damaged"),
    "a time that is no number": (_edited(lambda r, c: r["pending"]["p1"].update({next(iter(r["pending"]["p1"])): "1"})),
                                 "damaged"),
    "a snapshot no longer there": (_edited(lambda r, c: r.update(snapshot=r["snapshot"] - 1)), "cannot be told"),
    "a snapshot later than the directory's": (_edited(lambda r, c: r.update(snapshot=c + 1)), "later than the current"),
    "overflowed": (_edited(lambda r, c: (r.pop("pending"), r.update(overflow=10**6))), "more pages were pending"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_record_that_cannot_be_trusted_falls_back_to_looking_at_every_project(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    repo.publish_pages({f"p{i}": _page(f"p{i}") for i in range(12)})
    state = tmp_path / "run" / "gc-pending.json"
    catalog = Catalog(repo).update()
    t = time.time() + 10
    first = Collector(repo, GRACE, state)
    first.collect(catalog.take_touched(), now=t)
    superseded = _hashed(repo, "p1")
    repo.publish_pages({"p1": _page("p1", 1)})
    first.collect(catalog.update().take_touched(), now=t + 1)
    first.collect(catalog.update().take_touched(), now=t + 2)
    data = state.read_bytes()
    current = snapshot_version(repo)
    spoil, said = DAMAGE[damage]
    if damage == "missing":
        state.unlink()
    else:
        state.write_bytes(spoil(json.loads(data), data, current))
    second = Collector(Repository.open(tmp_path / "g"), GRACE, state)
    with caplog.at_level(logging.INFO, logger="proxy.gateway.freshness"):
        second.collect((), now=t + 50)
    assert second.looked_at == 12 + 1, damage  # as before there was a record: every project, and simple/ itself
    assert any(said in r.getMessage() and "every project" in r.getMessage() for r in caplog.records), caplog.text
    second.collect((), now=t + 102)
    assert superseded <= _hashed(repo, "p1")  # the record's times are not used: noted anew at t+50
    second.collect((), now=t + 151)
    assert not superseded & _hashed(repo, "p1")
    assert not (tmp_path / "g" / "keys").joinpath("0" * 64 + ".index.json").exists()
    _every_current_page_is_there(repo)
    assert json.loads(state.read_bytes())["format"] == freshness.RECORD_FORMAT  # rewritten whole


def test_a_record_larger_than_its_bound_says_so_and_the_next_start_looks_at_every_project(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    repo.publish_pages({f"p{i}": _page(f"p{i}") for i in range(6)})
    state = tmp_path / "gc-pending.json"
    monkeypatch.setattr(freshness, "MAX_PENDING", 1)
    t = time.time() + 10
    first = Collector(repo, GRACE, state)
    first.collect((), now=t)
    repo.publish_pages({"p1": _page("p1", 1), "p2": _page("p2", 1)})  # two pages pending: more than it keeps
    first.collect(["p1", "p2"], now=t + 1)
    first.collect((), now=t + 2)
    record = json.loads(state.read_bytes())
    assert "pending" not in record and record["overflow"] == 2
    second = Collector(repo, GRACE, state)
    with caplog.at_level(logging.INFO, logger="proxy.gateway.freshness"):
        second.collect((), now=t + 3)
    assert second.looked_at == 6 + 1 and "more pages were pending" in caplog.text


def test_a_page_current_again_and_superseded_anew_between_two_collections_gets_a_whole_grace(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    repo.publish_pages({"a": _page("a")})
    catalog = Catalog(repo).update()
    first = _hashed(repo, "a")
    repo.publish_pages({"a": _page("a", 1)})
    for name in first:  # written long ago: noted unreferenced now, it is due one grace from now
        os.utime(repo.public_dir / "simple" / "a" / name, (time.time() - 5000,) * 2)
    collector = Collector(repo, GRACE)
    t = time.time()
    collector.collect(catalog.update().take_touched(), now=t)
    # A revoked file put back gives the first page again, and a new release supersedes it again, both before
    # the next collection: an edge that read the timestamp in between may ask for it until a grace after.
    repo.publish_pages({"a": _page("a")})
    repo.publish_pages({"a": _page("a", 2)})
    collector.collect(catalog.update().take_touched(), now=t + GRACE + 1)
    assert first <= _hashed(repo, "a")
    collector.collect((), now=t + 2 * GRACE + 2)
    assert not first & _hashed(repo, "a")
    _every_current_page_is_there(repo)


def test_a_gateway_signs_its_json_page_alone_under_sha256_alone(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    repo.publish_pages({"a": _page("a", 2)})
    targets = repo.signed_targets(["simple/a/index.json", "simple/a/index.html"])
    assert {path: list(info.hashes) for path, info in targets.items()} == {"simple/a/index.json": ["sha256"]}
    assert _hashed(repo, "a") == _signed_names(repo, "a") and len(_hashed(repo, "a")) == 1
    assert not (repo.public_dir / "simple" / "a" / "index.html").exists()


def test_a_tree_signed_under_both_digests_before_the_upgrade_is_served_and_collected_until_superseded(
        tmp_path: Path) -> None:
    from proxy.mirror.verify import verify_tree

    def sound() -> None:
        report = asyncio.run(verify_tree(repo.public_dir, repo.metadata_dir / "1.root.json", profile=GATEWAY))
        assert report.missing == [] and report.corrupt == [], report

    both = ("sha256", "sha512")
    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    # What an earlier release signed: both page formats, each under both digests.
    repo.profile = dataclasses.replace(GATEWAY, hash_algorithms=both, signed_formats=(PageFormat.JSON, PageFormat.HTML))
    repo.publish_pages({"a": _page("a"), "b": _page("b")})
    old_a, old_b = _hashed(repo, "a"), _hashed(repo, "b")
    assert old_a == _signed_names(repo, "a", both) and len(old_b) == 4

    repo = Repository.open(tmp_path / "g")  # this release
    repo.publish_pages({"a": _page("a", 1)})
    signed = repo.signed_targets(["simple/a/index.json", "simple/b/index.json", "simple/a/index.html",
                                  "simple/b/index.html"])
    assert list(signed["simple/a/index.json"].hashes) == ["sha256"] and list(signed["simple/b/index.json"].hashes) == list(both)
    # a's HTML page went with the page it rendered (an older edge's HTML client gets no stale list of a's files);
    # b's, not signed again, still says what b's JSON page says.
    assert "simple/a/index.html" not in signed and "simple/b/index.html" in signed
    assert not (repo.public_dir / "simple" / "a" / "index.html").exists()
    sound()  # every page the bins name, under every digest they give, is there: b's sha512 names too
    collector = Collector(repo, GRACE)
    t = time.time() + 10
    collector.collect((), now=t)
    collector.collect((), now=t + GRACE + 1)
    assert _hashed(repo, "a") == _signed_names(repo, "a")  # a's old pages gone under both names
    assert _hashed(repo, "b") == old_b  # b still signed under both: kept under both
    sound()
    repo.publish_pages({"b": _page("b", 1)})
    collector.collect(["b"], now=t + GRACE + 2)
    collector.collect((), now=t + 2 * GRACE + 3)
    # b re-signed: its JSON page under sha256 alone, its HTML page gone with the old ones
    assert _hashed(repo, "b") == _signed_names(repo, "b") and len(_hashed(repo, "b")) == 1
    sound()


def test_an_html_page_an_earlier_release_signed_goes_when_its_project_is_yanked_from_or_removed(
        tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    repo.profile = dataclasses.replace(GATEWAY, signed_formats=(PageFormat.JSON, PageFormat.HTML))  # earlier
    repo.publish_pages({"a": _page("a", 1), "b": _page("b", 1), "c": _page("c", 1)})
    html = [f"simple/{p}/index.html" for p in "abc"]
    repo = Repository.open(tmp_path / "g")  # this release
    repo.remove("a-0.0-py3-none-any.whl", reason="broken")  # a yank re-signs a's page
    repo.publish_pages({"b": None})
    assert list(repo.signed_targets(html)) == ["simple/c/index.html"]  # c's, not signed since, says what c's JSON says
    assert [p.name for p in (repo.public_dir / "simple").glob("*/index.html")] == ["index.html"]
    assert (repo.public_dir / "simple" / "c" / "index.html").exists()
    assert index.parse_project_json((repo.public_dir / "simple" / "a" / "index.json").read_bytes(), "a").files[0].yanked


def test_bins_re_signed_for_their_expiry_alone_while_down_move_no_project(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _gateway(tmp_path)
    state = tmp_path / "run" / "gc-pending.json"
    Collector(repo, GRACE, state).collect((), now=time.time() + 10)
    report = repo.refresh(force=True)  # PEP 458's daily bin-n: every bin signed again, no page changed
    assert sum(1 for role in report.signed if role.startswith("bin-")) == BINS
    repo.publish_pages({"p3": _page("p3", 1)})
    looks = _Looks(monkeypatch)
    Collector(Repository.open(tmp_path / "g"), GRACE, state).collect((), now=time.time() + 20)
    assert looks.dirs == ["p3"]
