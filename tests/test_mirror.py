"""``tufproxy mirror sync`` and ``verify``: verified in, verifiable offline, installable with no upstream.

A real signed repository behind the threaded HTTP upstream (which tampers
and blocks on demand), the sync run as users run it (the CLI, once as a
subprocess killed mid-sync), and pip installing through ``tufproxy serve
--repository`` on the synced tree after the upstream has stopped.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.mirror import Progress
from proxy.mirror.tree import STATE_DIR
from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from tests.conftest import SampleRepo
from tests.support.clients import install
from tests.support.proxyproc import ProxyProcess
from tests.support.tree import all_targets, signed_timestamp
from tests.support.upstream import Reply, Upstream

PROJECTS = ["app", "lib", "base"]


def sync(up: Upstream, sample: SampleRepo, dest: Path, *args: str) -> int:
    root = sample.repo.metadata_dir / "1.root.json"
    projects = [a for p in PROJECTS for a in ("--project", p)] if "--all" not in args else []
    return main(["mirror", "sync", "--upstream", up.url, "--root", str(root), "--dest", str(dest), *projects, *args])


def verify(tree: Path, root: Path, *args: str) -> int:
    return main(["mirror", "verify", str(tree), "--root", str(root), *args])


def names(dest: Path) -> set[str]:
    """Every file of the served tree (state directory excluded), relative."""
    return {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file() and STATE_DIR not in p.parts}


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def upstream_files(up: Upstream) -> list[str]:
    """Request paths for pages and files (not metadata)."""
    return [p for p in up.requests if not p.startswith("/metadata/")]


@pytest.mark.slow
def test_sync_writes_a_verified_tree_that_serves_offline(
    sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest, site = tmp_path / "mirror", tmp_path / "site"
    Repository.init(site, bins=16)
    assert sync(upstream, sample_repo, dest, "--resign-with", str(site)) == 0
    out = capsys.readouterr().out
    signed = all_targets(sample_repo.repo)
    wanted = {p for p in signed if p.split("/")[1] in PROJECTS or p.startswith("simple/index.")}
    assert "synced 3 project(s)" in out and f"{len(wanted)} target(s), {len(wanted)} fetched" in out
    # Every selected target under its plain name and both hash names, byte for byte; nothing else.
    on_disk = names(dest)
    for path in wanted:
        for name in (path, *(re.sub(r"([^/]+)$", rf"{h}.\1", path) for h in signed[path]["hashes"].values())):
            assert name in on_disk, name
            assert (dest / name).read_bytes() == (sample_repo.repo.public_dir / name).read_bytes()
    assert not any("future-only" in n for n in on_disk)
    assert verify(dest, sample_repo.repo.metadata_dir / "1.root.json") == 0
    site_public = Repository.open(site).public_dir
    assert verify(site_public, site_public / "metadata/1.root.json") == 0
    assert "sound" in capsys.readouterr().out

    upstream.stop()  # the air gap: nothing upstream from here on
    for tree, root, target in ((site_public, site_public / "metadata/1.root.json", "site"),
                               (dest, sample_repo.repo.metadata_dir / "1.root.json", "upstream-signed")):
        with ProxyProcess(tmp_path / f"cache-{target}", "--repository", str(tree), "--root", str(root)) as proxy:
            r = install("pip", proxy.url, tmp_path / target, "app")
            assert r.returncode == 0, r.stderr + proxy.log()
        assert {d.name for d in (tmp_path / target).glob("*.dist-info")} == {
            "app-1.0.dist-info", "lib-1.1.dist-info", "base-2.0.dist-info"}


@pytest.mark.slow
def test_a_tampered_file_is_refused_not_written_and_audited(
    sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "mirror"
    wheel = "lib-1.1-py3-none-any.whl"
    upstream.override(rf"/packages/lib/[0-9a-f]+\.{re.escape(wheel)}", lambda orig: Reply(200, orig[:-1] + b"X"))
    assert sync(upstream, sample_repo, dest, "--jobs", "1") == 1
    out = capsys.readouterr()
    assert f"REFUSED packages/lib/{wheel}" in out.err and "nothing published" in out.out
    assert not any(n.endswith(wheel) for n in names(dest))
    assert not (dest / "metadata/timestamp.json").exists()  # an unfinished sync publishes nothing
    assert not list((dest / STATE_DIR / "tmp").iterdir())
    records = [json.loads(line) for line in (dest / STATE_DIR / "audit.log").read_text().splitlines()]
    assert [(r["event"], r["reason"], r["target"]) for r in records] == [("refused", "hash-mismatch", f"packages/lib/{wheel}")]

    # --keep-going: the rest is published, the refused file is still not written, the tree is sound.
    assert sync(upstream, sample_repo, dest, "--keep-going") == 0
    assert "1 refused" in capsys.readouterr().out
    assert (dest / "metadata/timestamp.json").exists()
    assert not any(n.endswith(wheel) for n in names(dest))
    assert verify(dest, sample_repo.repo.metadata_dir / "1.root.json") == 0


def test_expired_upstream_metadata_is_refused(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    upstream.replace("/metadata/timestamp.json", signed_timestamp(sample_repo.repo, expires_delta=-timedelta(days=3)))
    assert sync(upstream, sample_repo, tmp_path / "mirror") == 2
    assert "expired" in capsys.readouterr().err
    assert not upstream_files(upstream)


@pytest.mark.slow
def test_a_killed_sync_resumes_without_refetching(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    dest = tmp_path / "mirror"
    reached, release = threading.Event(), threading.Event()

    def stall(orig: bytes | None) -> Reply:
        reached.set()
        release.wait(timeout=30)
        return Reply(200, orig or b"")

    upstream.override(r"/packages/base/[0-9a-f]+\.base-2\.0\.tar\.gz", stall)
    root = sample_repo.repo.metadata_dir / "1.root.json"
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "mirror", "sync", "--upstream", upstream.url, "--root", str(root),
                             "--dest", str(dest), "--jobs", "1", *[a for p in PROJECTS for a in ("--project", p)]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert reached.wait(timeout=30), "the sync never reached the stalled file"
        proc.kill()
        proc.wait(timeout=10)
    finally:
        release.set()
    before = upstream_files(upstream)
    assert len([p for p in before if p.startswith("/packages/")]) >= 3  # some files were done before the kill
    assert not (dest / "metadata/timestamp.json").exists()
    upstream.clear()

    assert sync(upstream, sample_repo, dest) == 0
    after = upstream_files(upstream)[len(before):]
    assert [p for p in after if "base-2.0.tar.gz" in p] == [p for p in before if "base-2.0.tar.gz" in p]
    assert not set(after) & (set(before) - {p for p in before if "base-2.0.tar.gz" in p})
    assert verify(dest, root) == 0


@pytest.mark.slow
def test_second_sync_fetches_only_what_changed(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "mirror"
    assert sync(upstream, sample_repo, dest) == 0
    upstream.requests.clear()
    assert sync(upstream, sample_repo, dest) == 0
    assert upstream.requests == ["/metadata/2.root.json", "/metadata/timestamp.json"]

    sample_repo.repo.add([build_wheel(tmp_path / "new", "lib", "1.2", requires=["base"])])
    upstream.requests.clear()
    capsys.readouterr()
    assert sync(upstream, sample_repo, dest) == 0
    fetched = {re.sub(r"[0-9a-f]{64}\.", "", p) for p in upstream_files(upstream)}
    assert fetched == {"/simple/lib/index.html", "/simple/lib/index.json", "/packages/lib/lib-1.2-py3-none-any.whl",
                       "/packages/lib/lib-1.2-py3-none-any.whl.metadata"}
    # Only bins whose version the new snapshot moved were fetched.
    bins = [p for p in upstream.requests if re.fullmatch(r"/metadata/\d+\.bin-[0-9a-f]+\.json", p)]
    assert 1 <= len(bins) <= 4
    assert "4 fetched" in capsys.readouterr().out
    assert verify(dest, sample_repo.repo.metadata_dir / "1.root.json") == 0


@pytest.mark.slow
def test_verify_finds_corrupt_missing_and_extra_files(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "mirror"
    root = sample_repo.repo.metadata_dir / "1.root.json"
    assert sync(upstream, sample_repo, dest) == 0
    wheel = next((dest / "packages/app").glob("*.app-1.0-py3-none-any.whl"))
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 1
    wheel.write_bytes(bytes(data))  # in place: every hard-linked name of it is corrupt now
    page = next((dest / "simple/lib").glob("????????????????????????????????????????????????????????????????.index.json"))
    page.unlink()
    (dest / "packages/base/stray.txt").write_text("not signed")
    capsys.readouterr()
    assert verify(dest, root) == 1
    out = capsys.readouterr().out
    assert f"corrupt packages/app/{wheel.name}: sha" in out and "corrupt packages/app/app-1.0-py3-none-any.whl:" in out
    assert f"missing simple/lib/{page.name}" in out
    assert "extra packages/base/stray.txt" in out and "NOT SOUND" in out

    # A sync takes the projects whose bins did not move as the last sync left them (nothing moved upstream here);
    # --full re-hashes what it would reuse: the altered wheel is refused and loses its names, and the refusal
    # drops the manifest, so the next sync is a full one and refetches it.
    (dest / "packages/base/stray.txt").unlink()
    assert sync(upstream, sample_repo, dest) == 0
    assert "0 fetched" in capsys.readouterr().out
    assert sync(upstream, sample_repo, dest, "--full") == 1
    assert f"REFUSED packages/app/app-1.0-py3-none-any.whl: hash-mismatch: the copy in {dest}" in capsys.readouterr().err
    assert not (dest / "packages/app" / wheel.name).exists()
    assert sync(upstream, sample_repo, dest) == 0
    assert verify(dest, root) == 0


@pytest.mark.slow
def test_verify_refuses_a_tree_whose_metadata_was_swapped(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "mirror"
    assert sync(upstream, sample_repo, dest) == 0
    other = Repository.init(tmp_path / "other", bins=16)
    (dest / "metadata/timestamp.json").write_bytes((other.metadata_dir / "timestamp.json").read_bytes())
    capsys.readouterr()
    assert verify(dest, sample_repo.repo.metadata_dir / "1.root.json") == 1
    assert "metadata refused: bad-signature" in capsys.readouterr().out


@pytest.mark.slow
def test_twenty_projects_progress_and_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = Repository.init(tmp_path / "repo", bins=16)
    repo.add([build_wheel(tmp_path / "dists", f"proj-{i:02d}", "1.0") for i in range(20)])
    with Upstream(repo.public_dir) as up:
        code = main(["mirror", "sync", "--upstream", up.url, "--root", str(repo.metadata_dir / "1.root.json"),
                     "--dest", str(tmp_path / "mirror"), "--all", "--jobs", "4"])
    assert code == 0
    out = capsys.readouterr()
    files = 2 + 20 * 2 + 20 * 2  # root pages, project pages, wheels, .metadata
    assert f"synced 20 project(s): {files} target(s), {files} fetched" in out.out and "0 refused" in out.out
    fetched = [line for line in out.err.splitlines() if line.startswith("fetched packages/") and ".whl (" in line]
    assert len(fetched) == 20 and all(re.search(r"\(\d+(\.\d)? (B|kB)\) \[\d+/82\]$", line) for line in fetched)


def test_terminal_progress_is_a_bar_with_rate_and_time_left_and_no_line_per_file() -> None:
    stream = io.StringIO()
    progress = Progress(stream, tty=True)
    progress.planned(10, 10_000)
    progress.fetched("packages/a/a-1.0-py3-none-any.whl", 2_000)
    progress.refused("packages/b/b-1.0.tar.gz", "hash-mismatch: ...")
    assert re.fullmatch(r"sync: 2\.0 kB/10\.0 kB \(20%\), [\d.]+ [kMG]?B/s, \d+:\d\d:\d\d left", progress.meter.status())
    summary = progress.summary()
    drawn = stream.getvalue()
    assert "\x1b[" in drawn and "━" in drawn  # rich's bar, redrawn in place
    assert "REFUSED packages/b/b-1.0.tar.gz: hash-mismatch" in drawn and "fetched " not in drawn
    assert summary.startswith("synced 0 project(s): 1 target(s), 1 fetched (2.0 kB)")


@pytest.mark.slow
def test_expired_tree_needs_an_explicit_logged_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An upstream-signed tree whose daily metadata expired in transit: refused unless the operator says until when."""
    past = datetime.now(UTC) - timedelta(days=10)
    repo = Repository.init(tmp_path / "repo", bins=16, now=past)
    repo.add([build_wheel(tmp_path / "dists", "base", "2.0")], now=past)
    tree, root = repo.public_dir, repo.metadata_dir / "1.root.json"
    assert verify(tree, root) == 1
    assert "metadata refused: expired" in capsys.readouterr().out
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    assert verify(tree, root, "--allow-expired-until", tomorrow) == 0
    assert "verified only under --allow-expired-until" in capsys.readouterr().out

    with ProxyProcess(tmp_path / "cache-strict", "--repository", str(tree), "--root", str(root)) as proxy:
        assert status(proxy.url + "base/") >= 500
    yesterday = (past + timedelta(days=9)).date().isoformat()
    with ProxyProcess(tmp_path / "cache-lapsed", "--repository", str(tree), "--root", str(root),
                      "--allow-expired-until", yesterday) as proxy:
        assert status(proxy.url + "base/") >= 500
        assert "has passed" in proxy.log()
    with ProxyProcess(tmp_path / "cache-override", "--repository", str(tree), "--root", str(root),
                      "--allow-expired-until", tomorrow) as proxy:
        r = install("pip", proxy.url, tmp_path / "override", "base")
        assert r.returncode == 0, r.stderr + proxy.log()
        log = proxy.log()
    assert "OPERATOR OVERRIDE" in log
    assert re.search(r"expired-metadata override used for packages/base/base-2\.0-py3-none-any\.whl", log)
    # ...and an audit record for each use (the audit log is stdout here, mixed with the log).
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    used = [r for r in records if r["event"] == "expired-override"]
    assert any(r["target"] == "packages/base/base-2.0-py3-none-any.whl" and r["until"].startswith(tomorrow) for r in used)
