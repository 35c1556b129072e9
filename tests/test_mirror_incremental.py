"""``mirror sync`` incremental from the snapshot (issue 37 part 6): a second sync fetches only the bins whose
version moved and the targets of the projects in them, and follows a re-bin of the upstream.

A real signed repository behind the threaded HTTP upstream, which records every request; the sync run as
users run it (the CLI).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tuf.api.metadata import Metadata

from proxy.cli import main
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
