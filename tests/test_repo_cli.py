"""``tufproxy repo`` as a user runs it: every action, and bad input that changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from tuf.api.metadata import Metadata

from proxy.protocol import index
from proxy.repository import Repository
from proxy.repository.sample import build_sdist, build_wheel
from tests.support.tufclient import reference_updater
from tests.support.upstream import Upstream


def tufproxy(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "proxy", *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"tufproxy {' '.join(args)} failed: {proc.stderr}")
    return proc


def tree_state(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its sha256: what 'left as it was' compares."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"
    }


@pytest.fixture
def cli_repo(tmp_path: Path) -> Path:
    d = tmp_path / "repo"
    out = tufproxy("repo", "init", str(d), "--bins", "8", "--root-keys", "3", "--root-threshold", "2").stdout
    assert "initialised" in out and "8 bins" in out
    return d


def test_init_keeps_private_keys_private_and_out_of_the_served_tree(cli_repo: Path) -> None:
    keys = sorted(p.name for p in (cli_repo / "keys").iterdir())
    assert len([k for k in keys if k.startswith("root-")]) == 3
    assert {"targets.pem", "bins.pem", "online.pem"} <= set(keys)
    assert (cli_repo / "keys").stat().st_mode & 0o777 == 0o700
    for k in (cli_repo / "keys").iterdir():
        assert k.stat().st_mode & 0o777 == 0o600, k
    served = b"".join(p.read_bytes() for p in (cli_repo / "public").rglob("*") if p.is_file())
    assert b"PRIVATE KEY" not in served
    root = Metadata.from_bytes((cli_repo / "public/metadata/1.root.json").read_bytes()).signed
    assert root.consistent_snapshot and root.roles["root"].threshold == 2
    assert root.roles["timestamp"].keyids == root.roles["snapshot"].keyids


@pytest.mark.slow
def test_add_status_refresh_remove(cli_repo: Path, tmp_path: Path) -> None:
    whl = build_wheel(tmp_path / "d", "Demo.Pkg", "1.0")
    sdist = build_sdist(tmp_path / "d", "Demo.Pkg", "1.0")
    out = tufproxy("repo", "add", str(cli_repo), str(whl), str(sdist)).stdout
    assert f"added {whl.name}" in out and f"added {sdist.name}" in out and "timestamp v" in out
    again = tufproxy("repo", "add", str(cli_repo), str(whl)).stdout
    assert "unchanged" in again and "nothing to do" in again

    status = json.loads(tufproxy("repo", "status", str(cli_repo), "--json").stdout)
    assert status["projects"] == 1
    assert status["targets"] == 2 + 2 + 1 + 2  # two files, two pages, one .metadata, root list html+json
    assert status["bins"]["count"] == 8
    assert not any(r["expired"] for r in status["roles"].values())
    assert "bin-n" in tufproxy("repo", "status", str(cli_repo)).stdout

    assert "nothing to do" in tufproxy("repo", "refresh", str(cli_repo)).stdout
    forced = tufproxy("repo", "refresh", str(cli_repo), "--force").stdout
    assert "snapshot" in forced and "8 bin-n" in forced

    out = tufproxy("repo", "remove", str(cli_repo), whl.name, "--reason", "broken build").stdout
    assert f"yanked {whl.name}" in out
    page = index.parse_project_json((cli_repo / "public/simple/demo-pkg/index.json").read_bytes(), "demo-pkg")
    assert {f.filename: f.yanked for f in page.files} == {whl.name: "broken build", sdist.name: False}
    out = tufproxy("repo", "remove", str(cli_repo), sdist.name, "--delete").stdout
    assert f"deleted {sdist.name}" in out
    page = index.parse_project_json((cli_repo / "public/simple/demo-pkg/index.json").read_bytes(), "demo-pkg")
    assert [f.filename for f in page.files] == [whl.name]


@pytest.mark.parametrize("case", ["not-a-dist", "duplicate-other-bytes", "missing-online-key", "missing-file"])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(cli_repo: Path, tmp_path: Path, case: str) -> None:
    whl = build_wheel(tmp_path / "d", "pkg", "1.0")
    tufproxy("repo", "add", str(cli_repo), str(whl))
    if case == "not-a-dist":
        bad = tmp_path / "notes.txt"
        bad.write_text("hello")
        args = [str(bad)]
    elif case == "duplicate-other-bytes":
        args = [str(build_wheel(tmp_path / "other", "pkg", "1.0", payload=b"different"))]
    elif case == "missing-online-key":
        os.rename(cli_repo / "keys/online.pem", tmp_path / "online.pem")
        args = [str(build_wheel(tmp_path / "d", "pkg", "2.0"))]
    else:
        args = [str(tmp_path / "nope-1.0-py3-none-any.whl")]
    before = tree_state(cli_repo / "public")
    proc = tufproxy("repo", "add", str(cli_repo), *args, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tufproxy repo add: error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    after = tree_state(cli_repo / "public")
    # Nothing a client reads changed: timestamp, and everything it can reach, are as they were.
    assert after["metadata/timestamp.json"] == before["metadata/timestamp.json"]
    assert {k: v for k, v in after.items() if k in before} == before


def test_rotate_root_is_accepted_by_a_client_holding_the_old_root(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "repo", bins=4, root_keys=2, root_threshold=2)
    repo.add([build_wheel(tmp_path / "d", "pkg", "1.0")])
    old_root = (repo.metadata_dir / "1.root.json").read_bytes()
    out = tufproxy("repo", "rotate-root", str(repo.path), "--new-keys", "3", "--threshold", "2", "--rotate-online").stdout
    assert "root v2" in out
    new_root = Metadata.from_bytes((repo.metadata_dir / "2.root.json").read_bytes())
    assert len(new_root.signatures) == 5  # two old root keys and three new ones
    with Upstream(repo.public_dir) as up:
        updater = reference_updater(tmp_path / "client", up.url, old_root)
        updater.refresh()
        assert updater.get_targetinfo("packages/pkg/pkg-1.0-py3-none-any.whl") is not None
    assert len(list((repo.path / "keys/retired").glob("root-*.pem"))) == 2


def test_rotate_root_without_enough_old_keys_fails_and_changes_nothing(tmp_path: Path) -> None:
    repo = Repository.init(tmp_path / "repo", bins=4, root_keys=2, root_threshold=2)
    victim = next((repo.path / "keys").glob("root-*.pem"))
    victim.rename(tmp_path / victim.name)
    before = tree_state(repo.public_dir)
    proc = tufproxy("repo", "rotate-root", str(repo.path), "--threshold", "1", check=False)
    assert proc.returncode == 2 and "threshold" in proc.stderr
    assert tree_state(repo.public_dir) == before


def test_refresh_resigns_only_what_is_past_half_its_lifetime(tmp_path: Path) -> None:
    long_ago = datetime.now(UTC) - timedelta(hours=20)
    repo = Repository.init(tmp_path / "repo", bins=4, now=long_ago)
    report = repo.refresh()
    assert {"timestamp", "snapshot"} <= set(report.signed)
    assert sum(1 for r in report.signed if r.startswith("bin-")) == 4
    assert "targets" not in report.signed and "bins" not in report.signed
    assert repo.refresh().signed == {}


def test_init_refuses_bad_settings_and_existing_repositories(tmp_path: Path) -> None:
    assert tufproxy("repo", "init", str(tmp_path / "a"), "--bins", "1000", check=False).returncode == 2
    assert tufproxy("repo", "init", str(tmp_path / "b"), "--root-threshold", "2", check=False).returncode == 2
    tufproxy("repo", "init", str(tmp_path / "c"), "--bins", "2")
    proc = tufproxy("repo", "init", str(tmp_path / "c"), "--bins", "2", check=False)
    assert proc.returncode == 2 and "already" in proc.stderr


def test_help_explains_every_action_and_the_layout() -> None:
    out = tufproxy("repo", "--help").stdout
    for action in ("init", "add", "remove", "refresh", "rotate-root", "status"):
        assert action in out
    assert "consistent snapshots" in out and "succinct" in out
