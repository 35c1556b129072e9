"""``mirror sync`` incremental from the snapshot (issue 37 part 6): a second sync fetches only the bins whose
version moved and the targets of the projects in them, and follows a re-bin of the upstream.

A real signed repository behind the threaded HTTP upstream, which records every request; the sync run as
users run it (the CLI).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from tuf.api.metadata import Metadata

from proxy.cli import main
from proxy.mirror.manifest import Manifest
from proxy.protocol import index
from proxy.protocol.layout import file_target, page_file_href
from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from tests.support.upstream import Upstream

PROJECTS = [f"proj{i}" for i in range(8)]


def sync(up: Upstream, repo: Repository, dest: Path, *args: str) -> int:
    return main(["mirror", "sync", "--upstream", up.url, "--root", str(repo.metadata_dir / "1.root.json"),
                 "--dest", str(dest), "--all", *args])


def bin_versions(repo: Repository) -> dict[str, int]:
    timestamp = Metadata.from_bytes((repo.metadata_dir / "timestamp.json").read_bytes()).signed
    snapshot = Metadata.from_bytes((repo.metadata_dir / f"{timestamp.snapshot_meta.version}.snapshot.json").read_bytes())
    return {k.removesuffix(".json"): v.version for k, v in snapshot.signed.meta.items() if k.startswith("bin-")}


@pytest.mark.slow
def test_a_second_sync_fetches_only_what_moved_and_follows_a_rebin(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    dists = tmp_path / "dists"
    repo = Repository.init(tmp_path / "repo", bins=64)
    repo.add([build_wheel(dists, name, "1.0") for name in PROJECTS])
    dest = tmp_path / "mirror"
    root = repo.metadata_dir / "1.root.json"
    with Upstream(repo.public_dir) as up:
        assert sync(up, repo, dest) == 0
        before = bin_versions(repo)
        repo.add([build_wheel(dists, "proj3", "2.0")])
        moved = {name for name, v in bin_versions(repo).items() if before.get(name) != v}
        assert 0 < len(moved) < len(before)
        up.requests.clear()
        capsys.readouterr()

        assert sync(up, repo, dest) == 0
        out = capsys.readouterr().out
        fetched_bins = {m.group(1) for p in up.requests if (m := re.fullmatch(r"/metadata/\d+\.(bin-[0-9a-f]+)\.json", p))}
        assert fetched_bins <= moved  # no bin the snapshot did not move
        files = [p for p in up.requests if p.startswith(("/packages/", "/simple/")) and not p.startswith("/simple/index")]
        assert files and all("/proj3/" in p for p in files), files  # only the changed project's pages and files
        assert (dest / "packages/proj3/proj3-2.0-py3-none-any.whl").is_file()
        assert "synced 8 project(s)" in out
        unchanged = int(re.search(r"\((\d+) in projects whose bins did not move\)", out).group(1))  # type: ignore[union-attr]
        assert unchanged > 0  # taken from the manifest, neither looked up nor re-hashed
        assert main(["mirror", "verify", str(dest), "--root", str(root)]) == 0

        # A re-bin moves every target: the next sync re-checks every project (no download: all present) and
        # publishes the re-binned metadata, which verifies.
        repo.rebin(128)
        repo.add([build_wheel(dists, "proj5", "2.0")])
        up.requests.clear()
        capsys.readouterr()
        assert sync(up, repo, dest) == 0
        assert "bins did not move" not in capsys.readouterr().out
        files = [p for p in up.requests if p.startswith("/packages/")]
        assert files and all("/proj5/" in p for p in files), files
        assert main(["mirror", "verify", str(dest), "--root", str(root)]) == 0

        # --full re-checks every project: nothing is downloaded again, the tree stays sound.
        up.requests.clear()
        capsys.readouterr()
        assert sync(up, repo, dest, "--full") == 0
        assert not [p for p in up.requests if p.startswith("/packages/")]
        assert "bins did not move" not in capsys.readouterr().out


def _page(repo: Repository, project: str, version: str, data: bytes | None = None) -> index.ProjectPage:
    """``project``'s page listing one file, whose bytes (``data`` or made up) are written where its link points."""
    filename = f"{project}-{version}-py3-none-any.whl"
    data = data or f"{project} {version}\n".encode() * 8
    path = repo.public_dir / file_target(project, filename)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    dist = index.DistFile(filename=filename, url=page_file_href(project, filename),
                          hashes={"sha256": hashlib.sha256(data).hexdigest()}, size=len(data))
    return index.ProjectPage(name=project, files=(dist,), versions=(version,))


def unchanged(out: str) -> int:
    m = re.search(r"\((\d+) in projects whose bins did not move\)", out)
    return int(m.group(1)) if m else 0


@pytest.mark.slow
def test_a_gateway_tree_re_checks_only_what_changed_what_left_and_what_failed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = Repository.init(tmp_path / "repo", bins=16, layout="gateway")
    repo.publish_pages({p: _page(repo, p, "1.0") for p in PROJECTS})
    dest, root = tmp_path / "mirror", repo.metadata_dir / "1.root.json"
    with Upstream(repo.public_dir) as up:
        assert sync(up, repo, dest) == 0

        def again(*args: str, code: int = 0) -> tuple[str, list[str]]:
            up.requests.clear()
            capsys.readouterr()
            assert sync(up, repo, dest, *args) == code
            return capsys.readouterr().out, [p for p in up.requests if not p.startswith("/metadata/")]

        # Every bin re-signed (as PEP 458's daily bin-n expiry does), no page changed: metadata only, no project
        # re-checked.
        before = bin_versions(repo)
        repo.refresh(force=True)
        assert all(before[b] != v for b, v in bin_versions(repo).items())
        out, fetched = again()
        assert fetched == [] and "synced 8 project(s)" in out and unchanged(out) == 2 * len(PROJECTS)  # each: its JSON page, its file

        # One project leaves the index, one arrives: the leaver is dropped without a 'not found', the newcomer
        # fetched, no other project touched.
        repo.publish_pages({"proj1": None, "proj9": _page(repo, "proj9", "1.0")})
        out, fetched = again()
        assert "synced 8 project(s)" in out and "0 not found" in out
        assert fetched and all("/proj9/" in p for p in fetched), fetched
        manifest = Manifest(dest / ".mirror")
        assert manifest.known(["proj1", "proj9"]) == {"proj9"}
        assert (dest / "packages/proj9/proj9-1.0-py3-none-any.whl").is_file()

        # A release whose file the upstream swapped: refused (--keep-going publishes the rest). Its project is
        # re-checked at the next sync although no bin moved, and is complete once the upstream is fixed.
        good = b"proj2 2.0\n" * 8
        repo.publish_pages({"proj2": _page(repo, "proj2", "2.0", good)})
        swapped = repo.public_dir / "packages/proj2/proj2-2.0-py3-none-any.whl"
        swapped.write_bytes(good.upper())
        out, _ = again("--keep-going")
        assert "1 refused" in out and manifest.recheck() == {"proj2"}
        swapped.write_bytes(good)
        out, fetched = again("--keep-going")
        assert "0 refused" in out and "/packages/proj2/proj2-2.0-py3-none-any.whl" in fetched
        assert all("/proj2/" in p for p in fetched), fetched
        assert manifest.recheck() == set()
        out, fetched = again("--keep-going")
        assert fetched == [] and unchanged(out) == 2 * len(PROJECTS)  # each: its JSON page, its file
        manifest.close()
        assert main(["mirror", "verify", str(dest), "--root", str(root)]) == 0
