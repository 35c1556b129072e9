"""``mirror sync --resign-with`` signs only bytes this run verified: DEST is never trusted.

DEST may be removable media that anyone could edit between two syncs (or
during one).  Each test edits it the way an attacker would and checks,
step by step, that the sync refuses and reports (audit record, non-zero
exit), the site's keys sign nothing of it, and neither ``mirror verify``
nor ``serve`` hands the payload out.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.mirror.tree import STATE_DIR
from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from tests.conftest import SampleRepo
from tests.support.proxyproc import ProxyProcess
from tests.support.upstream import Reply, Upstream

WHEEL = "lib-1.1-py3-none-any.whl"
PAYLOAD = b"#EVIL-PAYLOAD#"


def sync(up: Upstream, sample: SampleRepo, dest: Path, *args: str) -> int:
    root = sample.repo.metadata_dir / "1.root.json"
    return main(["mirror", "sync", "--upstream", up.url, "--root", str(root), "--dest", str(dest),
                 "--project", "app", "--project", "lib", "--project", "base", *args])


def edit_in_place(path: Path) -> None:
    """Overwrite bytes in the middle, same size, same inode: every hard-linked name sees it."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2)
        f.write(PAYLOAD)
    assert path.stat().st_size == size


def holding_payload(tree: Path) -> list[str]:
    return [str(p) for p in tree.rglob("*") if p.is_file() and PAYLOAD in p.read_bytes()]


def audit_records(dest: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (dest / STATE_DIR / "audit.log").read_text().splitlines()]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def assert_never_served(tree: Path, root: Path, cache: Path) -> None:
    """``tufproxy serve --repository`` on ``tree`` does not hand out the edited wheel."""
    with ProxyProcess(cache, "--repository", str(tree), "--root", str(root)) as proxy:
        code, body = get(f"{proxy.base}packages/lib/{WHEEL}")
    assert code != 200 and PAYLOAD not in body


def site_state(site: Repository) -> bytes:
    return (site.metadata_dir / "timestamp.json").read_bytes()


@pytest.mark.slow
def test_a_same_size_edit_between_two_syncs_is_refused_and_never_signed(
    sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest, root = tmp_path / "mirror", sample_repo.repo.metadata_dir / "1.root.json"
    site = Repository.init(tmp_path / "site", bins=16)
    # 1. A first sync verifies and writes the wheel.
    assert sync(upstream, sample_repo, dest) == 0
    # 2. Between syncs, the wheel in DEST is edited in place, keeping its size.
    edit_in_place(dest / "packages/lib" / WHEEL)
    before = site_state(site)
    capsys.readouterr()
    # 3. The next sync re-hashes it, refuses it, and re-signs nothing.
    assert sync(upstream, sample_repo, dest, "--resign-with", str(site.path)) == 1
    out = capsys.readouterr()
    assert f"REFUSED packages/lib/{WHEEL}: hash-mismatch: the copy in {dest}" in out.err
    assert "re-signed" not in out.out
    assert [(r["event"], r["reason"], r["target"]) for r in audit_records(dest)] == [
        ("refused", "hash-mismatch", f"packages/lib/{WHEEL}")]
    assert site_state(site) == before
    assert holding_payload(site.path) == []
    # 4. The altered bytes lost every name in DEST; the tree says so, and serving it never hands them out.
    assert holding_payload(dest) == []
    assert main(["mirror", "verify", str(dest), "--root", str(root)]) == 1
    assert re.search(rf"missing packages/lib/[0-9a-f]{{64}}\.{re.escape(WHEEL)}", capsys.readouterr().out)
    assert_never_served(dest, root, tmp_path / "cache")
    # 5. A rerun refetches the wheel from upstream and signs the verified bytes.
    assert sync(upstream, sample_repo, dest, "--resign-with", str(site.path)) == 0
    signed = site.public_dir / "packages/lib" / WHEEL
    assert signed.read_bytes() == (sample_repo.repo.public_dir / "packages/lib" / WHEEL).read_bytes()


@pytest.mark.slow
def test_an_edit_after_verification_within_one_sync_is_caught_at_signing_time(
    sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest, root = tmp_path / "mirror", sample_repo.repo.metadata_dir / "1.root.json"
    site = Repository.init(tmp_path / "site", bins=16)
    before = site_state(site)
    edited: list[Path] = []

    def edit_lib_wheel(orig: bytes | None) -> Reply:
        # With --jobs 1 base's files come after lib's: by now the wheel was verified and written.
        for wheel in (dest / "packages/lib").glob(f"*.{WHEEL}"):
            if not edited:
                edit_in_place(wheel)
                edited.append(wheel)
        return Reply(200, orig or b"")

    upstream.override(r"/packages/base/[0-9a-f]+\.base-2\.0\.tar\.gz", edit_lib_wheel)
    assert sync(upstream, sample_repo, dest, "--jobs", "1", "--resign-with", str(site.path)) == 1
    assert edited, "the upstream never saw the sdist request"
    out = capsys.readouterr()
    assert f"REFUSED packages/lib/{WHEEL}: hash-mismatch: the copy in {dest}" in out.err
    assert [(r["reason"], r["target"]) for r in audit_records(dest)] == [("hash-mismatch", f"packages/lib/{WHEEL}")]
    assert site_state(site) == before and holding_payload(site.path) == []
    assert holding_payload(dest) == []
    assert main(["mirror", "verify", str(dest), "--root", str(root)]) == 1
    assert_never_served(dest, root, tmp_path / "cache")


@pytest.mark.slow
def test_keep_going_never_signs_a_refused_file_from_an_older_copy(
    sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "mirror"
    site = Repository.init(tmp_path / "site", bins=16)
    assert sync(upstream, sample_repo, dest) == 0
    old_copy = (dest / "packages/lib" / WHEEL).read_bytes()
    # Upstream replaces the wheel with a new build under the same name, and its mirror serves it tampered.
    sample_repo.repo.remove(WHEEL, delete=True)
    sample_repo.repo.add([build_wheel(tmp_path / "rebuilt", "lib", "1.1", requires=["base"], payload=b"rebuilt")])
    upstream.override(rf"/packages/lib/[0-9a-f]+\.{re.escape(WHEEL)}", lambda orig: Reply(200, (orig or b"")[:-1] + b"X"))
    capsys.readouterr()
    assert sync(upstream, sample_repo, dest, "--keep-going", "--resign-with", str(site.path)) == 0
    out = capsys.readouterr()
    assert f"REFUSED packages/lib/{WHEEL}" in out.err and "1 refused" in out.out
    assert ("hash-mismatch", f"packages/lib/{WHEEL}") in [(r["reason"], r["target"]) for r in audit_records(dest)]
    # The rest is signed; the refused wheel is in the site under no name, neither old nor new bytes.
    assert (site.public_dir / "packages/app/app-1.0-py3-none-any.whl").exists()
    assert not list(site.public_dir.rglob(f"*{WHEEL}"))
    page = json.loads((site.public_dir / "simple/lib/index.json").read_bytes())
    assert WHEEL not in [f["filename"] for f in page["files"]]
    assert not any(p.read_bytes() == old_copy for p in site.public_dir.rglob("*.whl"))
