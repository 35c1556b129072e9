"""``tufproxy client`` as a subprocess, the way a TUF conformance suite drives it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from tuf.api.metadata import Metadata

from tests.conftest import SampleRepo
from tests.support.tree import all_targets
from tests.support.upstream import Upstream

WHEEL = "packages/lib/lib-1.1-py3-none-any.whl"


def client(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "client", *map(str, args)],
        capture_output=True, text=True, timeout=60, check=False,
    )


def names(up: Upstream, since: int = 0) -> list[str]:
    return [p.removeprefix("/metadata/") if p.startswith("/metadata/") else p for p in up.requests[since:]]


@pytest.mark.slow
def test_init_refresh_download(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    meta, targets = tmp_path / "meta", tmp_path / "targets"
    root = tmp_path / "root.json"
    root.write_bytes(sample_repo.root_bytes)
    assert client("--metadata-dir", meta, "init", root).returncode == 0
    assert upstream.requests == []  # init never touches the network
    assert (meta / "root.json").read_bytes() == sample_repo.root_bytes

    url = f"{upstream.url}metadata/"
    done = client("--metadata-dir", meta, "--metadata-url", url, "refresh")
    assert done.returncode == 0, done.stderr
    ts = Metadata.from_bytes((sample_repo.repo.metadata_dir / "timestamp.json").read_bytes()).signed
    assert names(upstream) == ["2.root.json", "timestamp.json", f"{ts.snapshot_meta.version}.snapshot.json", "1.targets.json"]
    assert {p.name for p in meta.glob("*.json")} == {"root.json", "timestamp.json", "snapshot.json", "targets.json"}

    info = all_targets(sample_repo.repo)[WHEEL]
    download = ["--metadata-dir", meta, "--metadata-url", url, "--target-name", WHEEL,
                "--target-base-url", upstream.url, "--target-dir", targets, "download"]
    before = len(upstream.requests)
    done = client(*download)
    assert done.returncode == 0, done.stderr
    bin_version = Metadata.from_bytes((meta / f"{info['bin']}.json").read_bytes()).signed.version
    assert names(upstream, before) == [
        "2.root.json", "timestamp.json", "1.bins.json", f"{bin_version}.{info['bin']}.json",
        f"/packages/lib/{info['hashes']['sha256']}.lib-1.1-py3-none-any.whl",
    ]
    dest = targets / quote(WHEEL, safe="")
    assert dest.read_bytes() == (sample_repo.repo.public_dir / WHEEL).read_bytes()

    # Present with matching hashes: not downloaded again, and delegated roles come from the dir.
    before = len(upstream.requests)
    assert client(*download).returncode == 0
    assert names(upstream, before) == ["2.root.json", "timestamp.json"]


@pytest.mark.slow
def test_refusals_exit_1_with_one_line(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    meta = tmp_path / "meta"
    root = tmp_path / "root.json"
    root.write_bytes(b"{not a root")
    bad = client("--metadata-dir", meta, "init", root)
    # CLIENT-CLI.md (TUF conformance): 1 for a failed init, refresh or download.
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
    root.write_bytes(sample_repo.root_bytes)
    assert client("--metadata-dir", meta, "init", root).returncode == 0

    url = f"{upstream.url}metadata/"
    upstream.replace(
        r"/packages/lib/[0-9a-f]{64}\.lib-1\.1-py3-none-any\.whl", b"x" * all_targets(sample_repo.repo)[WHEEL]["length"]
    )
    targets = tmp_path / "targets"
    done = client(
        "--metadata-dir",
        meta,
        "--metadata-url",
        url,
        "--target-base-url",
        upstream.url,
        "--target-dir",
        targets,
        "--target-name",
        WHEEL,
        "--target-name",
        "simple/index.html",
        "download",
    )
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert "hash-mismatch" in line
    # Stopped at the first failure: the second target was never fetched, nothing was written.
    assert not any("index.html" in p for p in upstream.requests)
    assert not targets.exists() or not any(targets.iterdir())

    upstream.clear()
    upstream.replace(r"/metadata/timestamp\.json", b"garbage")
    done = client("--metadata-dir", meta, "--metadata-url", url, "refresh")
    assert done.returncode == 1 and "bad-metadata" in done.stderr


@pytest.mark.slow
def test_options_work_after_the_action_too(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    """Issue 16: ``client --metadata-dir md download --target-name X`` failed; options now go on either side."""
    meta, targets = tmp_path / "meta", tmp_path / "targets"
    root = tmp_path / "root.json"
    root.write_bytes(sample_repo.root_bytes)
    assert client("init", "--metadata-dir", meta, root).returncode == 0
    url = f"{upstream.url}metadata/"
    other = next(p for p in all_targets(sample_repo.repo) if p != WHEEL)
    done = client(
        "--metadata-dir",
        meta,
        "--target-name",
        WHEEL,
        "download",
        "--metadata-url",
        url,
        "--target-name",
        other,
        "--target-base-url",
        upstream.url,
        "--target-dir",
        targets,
    )
    assert done.returncode == 0, done.stderr
    # Target names given before and after the action add up, in argument order.
    assert sorted(p.name for p in targets.iterdir()) == sorted(quote(t, safe="") for t in (WHEEL, other))
    assert client("refresh", "--metadata-dir", meta, "--metadata-url", url).returncode == 0
    helped = client("download", "--help")
    assert helped.returncode == 0
    for option in ("--metadata-dir", "--metadata-url", "--target-name", "--target-base-url", "--target-dir"):
        assert option in helped.stdout
    missing = client("refresh", "--metadata-url", url)
    assert missing.returncode != 0
    assert missing.stderr.strip().splitlines() == ["tufproxy client refresh: error: refresh needs --metadata-dir"]
