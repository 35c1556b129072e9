"""The gateway's catalog of its projects: read from its own bins once, then only the bins that moved."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from proxy.protocol import index
from proxy.protocol.layout import PageFormat, root_page_target
from proxy.repository import Repository
from proxy.repository.catalog import Catalog


class _Reads:
    """The repository, counting the bin-n files a catalog reads."""

    def __init__(self, repo: Repository) -> None:
        self.repo, self.bins = repo, 0
        self.profile = repo.profile

    def metadata_json(self, role: str, version: int | None = None) -> dict[str, Any]:
        self.bins += role.startswith("bin-")
        return self.repo.metadata_json(role, version)


def _page(name: str) -> index.ProjectPage:
    return index.ProjectPage(name=name, files=())


def test_the_catalog_follows_every_publish_by_reading_only_the_bins_it_signed(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "g", bins=64, layout="gateway", clock_versions=True)
    reads = _Reads(repo)
    catalog = Catalog(reads)
    assert catalog.update().projects == set() and reads.bins == 64  # the first look reads every bin once
    report = repo.publish_pages({f"p{i}": _page(f"p{i}") for i in range(20)} | {"secret": _page("secret")},
                                private=lambda p: p == "secret")
    reads.bins = 0
    catalog.update()
    assert catalog.projects == {f"p{i}" for i in range(20)} | {"secret"} and catalog.private == {"secret"}
    assert catalog.public == sorted(f"p{i}" for i in range(20))
    assert reads.bins == sum(role.startswith("bin-") for role in report.signed) < 64

    # Another process (a worker, a revoke) signs: one removal, one new project; only their bins are read.
    other = Repository.open(tmp_path / "g")
    report = other.publish_pages({"p3": None, "late": _page("late")})
    reads.bins = 0
    catalog.update()
    assert "p3" not in catalog.projects and "late" in catalog.projects
    assert reads.bins == sum(role.startswith("bin-") for role in report.signed) <= 4
    reads.bins = 0
    assert catalog.update().projects and reads.bins == 0  # nothing signed since: nothing read


def test_a_gateway_signs_no_root_list_and_drops_one_signed_before(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    repo.publish_pages({"a": _page("a")})
    assert repo.signed_targets([root_page_target(f) for f in PageFormat]) == {}
    # What a gateway of an earlier release signed: the root list as targets, and its plain names.
    plist = index.render_project_list_json(index.ProjectList(projects=("a",)))
    repo.publish_target(root_page_target(PageFormat.JSON), plist)
    (repo.public_dir / root_page_target(PageFormat.JSON)).write_bytes(plist)
    assert repo.signed_targets([root_page_target(PageFormat.JSON)])
    repo = Repository.open(tmp_path / "g")  # the next release's process: its first publish looks for it
    repo.publish_pages({"b": _page("b")})
    assert repo.signed_targets([root_page_target(f) for f in PageFormat]) == {}
    assert not (repo.public_dir / root_page_target(PageFormat.JSON)).exists()
    assert repo.status()["projects"] == 2
    # Its hashed copies go with the pages a collection finds unreferenced, grace after it first saw them.
    from proxy.gateway.freshness import Collector

    hashed = lambda: sorted(p.name for p in (repo.public_dir / "simple").glob("*.index.json"))  # noqa: E731
    assert len(hashed()) == 1  # under its sha256
    collector = Collector(repo, grace=100)
    t = time.time() + 10  # later than every write here: a page written after it was noted is kept longer
    collector.collect((), now=t)
    assert len(hashed()) == 1
    collector.collect((), now=t + 101)
    assert hashed() == [] and (repo.public_dir / "simple" / "a").is_dir()


def test_a_refresh_reads_only_the_bins_it_may_re_sign(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    repo = Repository.init(tmp_path / "g", bins=64, layout="gateway", clock_versions=True)
    repo.publish_pages({f"p{i}": _page(f"p{i}") for i in range(5)})
    parsed: list[str] = []
    real = repo._parse

    def parse(name: str):  # type: ignore[no-untyped-def]
        parsed.append(name)
        return real(name)

    repo._parse = parse  # type: ignore[method-assign]
    later = datetime.now(UTC) + timedelta(hours=13)  # past half of every bin-n's day
    first = repo.refresh(now=later)
    assert sum(r.startswith("bin-") for r in first.signed) == 64
    assert sum(".bin-" in n for n in parsed) <= 64  # the first look reads each bin at most once
    parsed.clear()
    assert not any(r.startswith("bin-") for r in repo.refresh(now=later).signed)
    assert not any(".bin-" in n for n in parsed), parsed  # re-signed by this process: nothing read again
    # Another process's repository object knows nothing yet: it reads each bin once, then remembers.
    other = Repository.open(tmp_path / "g")
    other.refresh(now=later)
    other_parsed: list[str] = []
    other_real = other._parse
    other._parse = lambda n: other_parsed.append(n) or other_real(n)  # type: ignore[method-assign]
    other.refresh(now=later)
    assert not any(".bin-" in n for n in other_parsed)


def test_collection_deletes_a_superseded_page_grace_after_it_was_superseded_and_looks_only_at_what_moved(
        tmp_path: Path) -> None:
    import time

    from proxy.gateway.freshness import Collector

    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    catalog = Catalog(repo)
    catalog.update()
    dist = index.DistFile(filename="a-1.0-py3-none-any.whl", url="x", hashes={"sha256": "0" * 64})
    repo.publish_pages({"a": _page("a"), "b": _page("b")})
    catalog.update()
    collector = Collector(repo, grace=100)
    now = time.time()
    assert collector.collect(catalog.take_touched(), now=now) >= 0  # the first run looks at every project
    pages = lambda p: sorted(f.name for f in (repo.public_dir / "simple" / p).glob("*.index.*"))  # noqa: E731
    old = pages("a")
    for name in old:  # written long before they are superseded: their age is not how long they are unreferenced
        os.utime(repo.public_dir / "simple" / "a" / name, (now - 5000, now - 5000))
    repo.publish_pages({"a": index.ProjectPage(name="a", files=(dist,))})  # supersedes a's pages
    catalog.update()
    touched = catalog.take_touched()
    assert "a" in touched and len(touched) < 3
    collector.collect(touched, now=now + 1)
    collector.collect((), now=now + 50)
    assert set(old) <= set(pages("a")) and len(pages("a")) == 2  # within grace of the supersede: kept
    collector.collect((), now=now + 102)
    # a's old page is gone; the current one and b's stay.
    assert not set(old) & set(pages("a")) and len(pages("a")) == 1 and len(pages("b")) == 1
    collector.collect(["a", "b"], now=now + 1000)
    assert len(pages("a")) == 1 and len(pages("b")) == 1


def test_verify_without_a_manifest_expects_the_pages_the_bins_hold_not_a_root_list(tmp_path: Path) -> None:
    import asyncio

    from proxy.mirror.verify import verify_tree
    from proxy.protocol.profiles import GATEWAY

    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    repo.publish_pages({"a": _page("a"), "b": _page("b")})
    report = asyncio.run(verify_tree(repo.public_dir, repo.metadata_dir / "1.root.json", profile=GATEWAY))
    assert report.missing == [] and report.corrupt == [], report
    for name in (repo.public_dir / "simple" / "b").iterdir():  # pages the bins vouch for, gone under every name
        name.unlink()
    report = asyncio.run(verify_tree(repo.public_dir, repo.metadata_dir / "1.root.json", profile=GATEWAY))
    assert len(report.missing) == 1 and report.missing[0].startswith("simple/b/"), report
    assert report.missing[0].endswith(".index.json"), report  # the one page the gateway signs


def test_a_metadata_version_goes_grace_after_it_was_superseded_not_after_it_was_written(tmp_path: Path) -> None:
    from proxy.gateway.freshness import Collector

    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    snapshots = lambda: sorted(repo.metadata_dir.glob("*.snapshot.json"))  # noqa: E731
    repo.publish_pages({"a": _page("a")})
    first = snapshots()[-1]
    os.utime(first, (1000, 1000))  # current since long ago
    repo.publish_pages({"b": _page("b")})
    repo.publish_pages({"c": _page("c")})  # superseded twice, just now
    collector = Collector(repo, grace=100)
    collector.collect((), now=time.time() + 50)
    assert first.exists()  # an edge that read the timestamp naming it 50 s ago may still fetch it
    collector.collect((), now=time.time() + 101)
    assert not first.exists() and len(snapshots()) == 2  # the current one and the newest superseded stay


def test_a_rebin_keeps_every_project_in_the_catalog_whatever_order_the_bins_are_read_in(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    names = {f"p{i}" for i in range(12)}
    repo.publish_pages({n: _page(n) for n in names})
    catalog = Catalog(repo).update()
    assert catalog.projects == names
    repo.rebin(64)  # every project leaves its old bin and arrives in a new one ("bin-04" is read before "bin-1")
    assert catalog.update().projects == names
    repo.publish_pages({"p3": None})
    assert catalog.update().projects == names - {"p3"}


def _bin_roles(report: Any) -> set[str]:
    return {role for role in report.signed if role.startswith("bin-")}


def _fresh(repo: Repository) -> Catalog:
    """What a process without the persisted file finds: every bin read."""
    return Catalog(repo).update()


def test_a_restart_with_the_persisted_catalog_reads_only_the_bins_signed_since(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "g", bins=64, layout="gateway", clock_versions=True)
    kept = tmp_path / "run" / "catalog.json"
    repo.publish_pages({f"p{i}": _page(f"p{i}") for i in range(40)} | {"secret": _page("secret")},
                       private=lambda p: p == "secret")
    first = Catalog(repo, kept)
    assert not first.save()  # nothing looked at yet: nothing to say
    first.update()
    assert first.unsaved and first.save() and not first.unsaved and not first.save()

    reads = _Reads(repo)
    again = Catalog(reads, kept).update()
    assert reads.bins == 0 and not again.unsaved  # every bin as the file has it, none read
    assert (again.projects, again.private) == (first.projects, first.private)

    # While no process held it: a removal, a new project, a page re-signed, a project made private.
    dist = index.DistFile(filename="p5-1.0-py3-none-any.whl", url="x", hashes={"sha256": "0" * 64})
    moved = _bin_roles(repo.publish_pages({"p3": None, "late": _page("late"), "p5": index.ProjectPage(name="p5", files=(dist,))}))
    moved |= _bin_roles(repo.publish_pages({"p7": _page("p7")}, private=lambda p: p in ("secret", "p7")))
    later_reads = _Reads(repo)
    later = Catalog(later_reads, kept).update()
    assert later_reads.bins == len(moved) < 64
    fresh = _fresh(repo)
    assert (later.projects, later.private) == (fresh.projects, fresh.private)
    assert "p3" not in later.projects and "late" in later.projects and later.private == {"secret", "p7"}
    assert later.take_touched() == set()  # a first look is no change, whether a bin came from the file or its own
    assert later.unsaved and later.save()
    reads = _Reads(repo)
    assert Catalog(reads, kept).update().projects == fresh.projects and reads.bins == 0

    # Then it follows publishes as any catalog does, the bins it took from the file included.
    report = repo.publish_pages({"p11": None})
    later_reads.bins = 0
    later.update()
    assert "p11" not in later.projects and later_reads.bins == len(_bin_roles(report))
    assert later.take_touched() >= {"p11"}


def test_a_rebin_since_the_catalog_was_persisted_reads_every_bin_it_re_signed(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    kept = tmp_path / "catalog.json"
    names = {f"p{i}" for i in range(30)}
    repo.publish_pages({n: _page(n) for n in names} | {"s": _page("s")}, private=lambda p: p == "s")
    assert Catalog(repo, kept).update().save()
    report = repo.rebin(64)  # the 16 old names stay listed, signed once more with no targets
    reads = _Reads(repo)
    after = Catalog(reads, kept).update()
    assert reads.bins == len(_bin_roles(report)) == 80
    assert after.projects == names | {"s"} and after.private == {"s"}
    assert after.save()
    report = repo.rebin(256)  # bin-00 to bin-3f re-signed under the same names; bin-0 to bin-f left as they were
    reads = _Reads(repo)
    after = Catalog(reads, kept).update()
    assert reads.bins == len(_bin_roles(report)) == 256
    fresh = _fresh(repo)
    assert (after.projects, after.private) == (fresh.projects, fresh.private) == (names | {"s"}, {"s"})


def _flip(data: bytes) -> bytes:
    at = data.index(b'"p1"') + 2  # one name becomes another (p1 -> p2): still valid JSON
    return data[:at] + b"2" + data[at + 1:]


DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    "a name changed": _flip,
    "empty": lambda data: b"",
    "junk": lambda data: b"\x00\xff" * 100,
    "another format": lambda data: data.replace(b'"format": 1', b'"format": 99', 1),
    "body not a table": lambda data: data.partition(b"\n")[0] + b"\n[]",
}


def test_a_damaged_or_foreign_catalog_file_costs_a_full_read_never_a_wrong_answer(
        tmp_path: Path, caplog: Any) -> None:
    import hashlib
    import json
    import logging

    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    repo.publish_pages({f"p{i}": _page(f"p{i}") for i in range(12)} | {"s": _page("s")}, private=lambda p: p == "s")
    kept = tmp_path / "catalog.json"
    Catalog(repo, kept).update().save()
    good = kept.read_bytes()
    expected = _fresh(repo)
    cases = dict(DAMAGE)
    # A body whose digest matches but whose entries are not (version, public, private): a writer's bug.
    bad = json.dumps({"bin-0": ["1", [], []]}).encode()
    head = json.loads(good.partition(b"\n")[0]) | {"sha256": hashlib.sha256(bad).hexdigest()}
    cases["malformed entry"] = lambda data: json.dumps(head).encode() + b"\n" + bad
    for name, damage in cases.items():
        kept.write_bytes(damage(good))
        reads = _Reads(repo)
        with caplog.at_level(logging.INFO, logger="proxy.repository.catalog"):
            caplog.clear()
            catalog = Catalog(reads, kept).update()
        assert (catalog.projects, catalog.private) == (expected.projects, expected.private), name
        assert reads.bins == 16, name
        assert any("not used" in r.getMessage() for r in caplog.records), (name, caplog.text)
        assert catalog.save() and Catalog(_Reads(repo), kept).update().projects == expected.projects

    # Another repository's file (a re-initialised DIR with --cache-dir kept): its bins have the same names and
    # versions may coincide, but its root differs.
    other = Repository.init(tmp_path / "h", bins=16, layout="gateway", clock_versions=True)
    other.publish_pages({"elsewhere": _page("elsewhere")})
    kept.write_bytes(good)
    reads = _Reads(other)
    assert Catalog(reads, kept).update().projects == {"elsewhere"} and reads.bins == 16

    kept.unlink()  # missing: a full read, said at debug only
    reads = _Reads(repo)
    assert Catalog(reads, kept).update().projects == expected.projects and reads.bins == 16


def test_the_publisher_keeps_its_catalog_after_the_first_look_and_at_a_clean_stop_not_per_publish(
        tmp_path: Path) -> None:
    import asyncio

    from proxy.gateway.publisher import Publisher
    from proxy.util.atomic import file_stamp

    repo = Repository.init(tmp_path / "g", bins=32, layout="gateway", clock_versions=True)
    repo.publish_pages({f"p{i}": _page(f"p{i}") for i in range(10)})
    kept = tmp_path / "run" / "catalog.json"

    stamps = []

    async def serve(publish: list[str]) -> Publisher:
        publisher = Publisher(repo, window=0.01, catalog=kept)
        publisher.start()
        for name in publish:
            await publisher.publish({name: _page(name)})
            stamps.append(file_stamp(kept))
        await publisher.stop()
        stamps.append(file_stamp(kept))
        return publisher

    first = asyncio.run(serve(["a", "b", "c"]))
    # Written once after the first look that read every bin (before the first batch), then not per publish;
    # the clean stop writes what the publishes changed.
    assert stamps[0] is not None and stamps[0] == stamps[1] == stamps[2] != stamps[3]
    reads = _Reads(repo)
    restarted = Catalog(reads, kept).update()
    assert reads.bins == 0 and restarted.projects == first.published == {f"p{i}" for i in range(10)} | {"a", "b", "c"}


def test_a_bin_missing_mid_update_leaves_the_catalog_as_it_was_until_it_can_be_read(tmp_path: Path) -> None:
    import pytest

    from proxy.repository import RepositoryError

    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    repo.publish_pages({f"p{i}": _page(f"p{i}") for i in range(12)})
    catalog = Catalog(repo).update()
    before = set(catalog.projects)
    report = repo.publish_pages({"p3": None, "late": _page("late")})
    role = max(_bin_roles(report))  # read after the others of this publish
    path = repo.metadata_dir / f"{report.signed[role]}.{role}.json"
    aside = path.rename(path.with_suffix(".aside"))
    with pytest.raises(RepositoryError):
        catalog.update()
    assert catalog.projects == before and catalog.take_touched() == set()
    aside.rename(path)
    assert catalog.update().projects == before - {"p3"} | {"late"} == _fresh(repo).projects
    assert catalog.take_touched() >= {"p3", "late"}


def test_a_reader_who_sees_a_new_timestamp_finds_the_plain_pages_it_carries(tmp_path: Path, monkeypatch: Any) -> None:
    """The gateway serves a plain page once its catalog (read from the timestamp on) says the project is
    published: the plain names must exist by the time the timestamp does, or that request is a 404."""
    from proxy.util.atomic import Batch

    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    seen: list[tuple[str, bool]] = []
    real = Batch.commit

    def commit(batch: Batch, path: Path, data: bytes, *args: Any, **kwargs: Any) -> None:
        if path.name == "timestamp.json":
            seen.extend((name, (repo.public_dir / "simple" / "late" / name).is_file())
                        for name in ("index.html", "index.json"))
        real(batch, path, data, *args, **kwargs)

    monkeypatch.setattr(Batch, "commit", commit)
    repo.publish_pages({"late": _page("late")})
    assert seen == [("index.html", False), ("index.json", True)]  # the HTML page is rendered from the JSON one


def test_a_commit_that_fails_leaves_the_plain_pages_as_they_were(tmp_path: Path, monkeypatch: Any) -> None:
    """The plain names are linked before the commit point; a commit that fails there (a full disk) puts them
    back, since garbage collection and pin rebuilds read them as the signed page."""
    from proxy.util.atomic import Batch

    repo = Repository.init(tmp_path / "g", bins=16, layout="gateway", clock_versions=True)
    repo.publish_pages({"kept": _page("kept")})
    page = repo.public_dir / "simple" / "kept" / "index.json"
    signed = page.read_bytes()
    real = Batch.commit

    def full_disk(batch: Batch, path: Path, data: bytes, *args: Any, **kwargs: Any) -> None:
        if path.name == "timestamp.json":
            raise OSError(28, "No space left on device")
        real(batch, path, data, *args, **kwargs)

    monkeypatch.setattr(Batch, "commit", full_disk)
    changed = index.ProjectPage(name="kept", files=(index.DistFile(
        filename="kept-1.0-py3-none-any.whl", url="../../packages/kept/kept-1.0-py3-none-any.whl",
        hashes={"sha256": "0" * 64}),))
    try:
        repo.publish_pages({"kept": changed, "new": _page("new")})
    except OSError:
        pass
    else:
        raise AssertionError("the commit did not fail")
    assert page.read_bytes() == signed
    assert not (repo.public_dir / "simple" / "new" / "index.json").exists()
    assert not [p.name for p in repo.public_dir.rglob(".*.before")]
    monkeypatch.setattr(Batch, "commit", real)
    repo.publish_pages({"kept": changed, "new": _page("new")})
    assert page.read_bytes() != signed and (repo.public_dir / "simple" / "new" / "index.json").exists()
