"""``tufproxy mirror sync --from FILE``: exactly the files a lock locks, checked against its hashes and the signed
metadata; a hash that differs from the signed one, or a file the repository does not sign, fails the sync
naming the file.  The locks are written by the real tools (``pip lock``, ``uv pip compile --generate-hashes``)
against the proxy serving the same repository; ``uv.lock`` is written as uv writes it.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.mirror.manifest import Manifest
from tests.conftest import SampleRepo
from tests.support.clients import clean_env, pip, uv
from tests.support.proxyproc import ProxyProcess
from tests.support.upstream import Upstream

LOCKED = {"app-1.0-py3-none-any.whl", "lib-1.1-py3-none-any.whl", "base-2.0-py3-none-any.whl"}


@pytest.fixture
def proxy(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> Iterator[ProxyProcess]:
    with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root",
                      str(sample_repo.repo.metadata_dir / "1.root.json"), "--workers", "1") as p:
        yield p


def _sync(sample_repo: SampleRepo, upstream: Upstream, dest: Path, *selection: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", "mirror", "sync", "--upstream", upstream.url, "--root",
                           str(sample_repo.repo.metadata_dir / "1.root.json"), "--dest", str(dest), *selection],
                          capture_output=True, text=True, timeout=120, env=clean_env())


def _mirrored_files(dest: Path) -> set[str]:
    manifest = Manifest(dest / ".mirror")
    return {t.rsplit("/", 1)[1] for t in manifest.paths_of(manifest.projects()) if t.startswith("packages/") and
            not t.endswith(".metadata")}


def _sha256(sample_repo: SampleRepo, filename: str) -> str:
    return hashlib.sha256(next(d for d in sample_repo.dists if d.name == filename).read_bytes()).hexdigest()


@pytest.mark.slow
def test_pip_lock_and_uv_hashes_sync_exactly_the_locked_files(sample_repo: SampleRepo, upstream: Upstream,
                                                              proxy: ProxyProcess, tmp_path: Path) -> None:
    r = pip("lock", "--index-url", proxy.url, "--only-binary", ":all:", "-o", str(tmp_path / "pylock.toml"), "app")
    assert r.returncode == 0, r.stderr
    (tmp_path / "requirements.in").write_text("app\n")
    r = uv("pip", "compile", "--generate-hashes", "--index-url", proxy.url, "--no-header", "--python-version", "3.11",
           "-o", str(tmp_path / "requirements.txt"), str(tmp_path / "requirements.in"))
    assert r.returncode == 0, r.stderr
    for lock, expected in (("pylock.toml", LOCKED), ("requirements.txt", LOCKED | {"base-2.0.tar.gz"})):
        dest = tmp_path / f"from-{lock}"
        done = _sync(sample_repo, upstream, dest, "--from", str(tmp_path / lock))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "layout tufproxy (detected from the signed metadata)" in done.stdout
        assert _mirrored_files(dest) == expected, lock
        verify = subprocess.run([sys.executable, "-m", "proxy", "mirror", "verify", str(dest), "--root",
                                 str(sample_repo.repo.metadata_dir / "1.root.json")], capture_output=True, text=True,
                                timeout=120)
        assert verify.returncode == 0, verify.stdout
        # Both count targets (pages, distributions, .metadata), not the names each is stored under.
        synced = re.search(r"synced \d+ project\(s\): (\d+) target\(s\)", done.stdout)
        checked = re.search(r"sound: (\d+) target\(s\) checked", verify.stdout)
        assert synced and checked and synced.group(1) == checked.group(1), (done.stdout, verify.stdout)


def _uv_lock(sample_repo: SampleRepo, wrong: str | None = None, unsigned: bool = False) -> str:
    """A uv.lock as uv writes it: the project itself (virtual), then registry packages with wheel hashes."""
    text = 'version = 1\nrequires-python = ">=3.11"\n\n[[package]]\nname = "site"\nversion = "0.1.0"\n' \
           'source = { virtual = "." }\n'
    for filename in sorted(LOCKED):
        name, version = filename.split("-")[:2]
        digest = "0" * 64 if filename == wrong else _sha256(sample_repo, filename)
        text += (f'\n[[package]]\nname = "{name}"\nversion = "{version}"\nsource = {{ registry = "http://x/simple" }}\n'
                 f'wheels = [\n    {{ url = "http://x/packages/{filename}", hash = "sha256:{digest}", size = 1 }},\n]\n')
    if unsigned:
        text += ('\n[[package]]\nname = "lib"\nversion = "9.9"\nsource = { registry = "http://x/simple" }\n'
                 f'wheels = [\n    {{ url = "http://x/lib-9.9-py3-none-any.whl", hash = "sha256:{"1" * 64}" }},\n]\n')
    return text


@pytest.mark.slow
def test_uv_lock_syncs_and_a_wrong_hash_or_an_unsigned_file_fails_naming_it(sample_repo: SampleRepo,
                                                                              upstream: Upstream,
                                                                              tmp_path: Path) -> None:
    (tmp_path / "uv.lock").write_text(_uv_lock(sample_repo))
    done = _sync(sample_repo, upstream, tmp_path / "good", "--from", str(tmp_path / "uv.lock"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert _mirrored_files(tmp_path / "good") == LOCKED

    (tmp_path / "bad" / "uv.lock").parent.mkdir()
    (tmp_path / "bad" / "uv.lock").write_text(_uv_lock(sample_repo, wrong="lib-1.1-py3-none-any.whl", unsigned=True))
    done = _sync(sample_repo, upstream, tmp_path / "bad-dest", "--from", str(tmp_path / "bad" / "uv.lock"))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert re.search(rf"failed lib: lib-1.1-py3-none-any.whl: \S+uv.lock locks sha256 {'0' * 64}, the signed page "
                     rf"says {_sha256(sample_repo, 'lib-1.1-py3-none-any.whl')}", out), out
    assert "failed lib: lib-9.9-py3-none-any.whl: locked in" in out and "the repository does not sign it" in out
    assert "nothing published" in out


@pytest.mark.slow
def test_requirements_with_a_hash_that_is_not_the_signed_one_fail(sample_repo: SampleRepo, upstream: Upstream,
                                                                   tmp_path: Path) -> None:
    good = _sha256(sample_repo, "lib-1.1-py3-none-any.whl")
    (tmp_path / "req.txt").write_text(f"lib==1.1 \\\n    --hash=sha256:{'a' * 64}\n")
    for option in ("--requirements", "--from"):
        done = _sync(sample_repo, upstream, tmp_path / option.strip("-"), option, str(tmp_path / "req.txt"))
        out = done.stdout + done.stderr
        assert done.returncode == 1 and "failed lib: lib==1.1: no signed file has a hash" in out, out
        assert f"lib-1.1-py3-none-any.whl sha256={good}" in out and "nothing published" in out
    # --from takes only locked lines; --requirements still takes unpinned ones.
    (tmp_path / "loose.txt").write_text("lib>=1.0\n")
    done = _sync(sample_repo, upstream, tmp_path / "loose", "--from", str(tmp_path / "loose.txt"))
    assert done.returncode == 2 and "lib is not pinned with == and --hash=sha256:..." in done.stderr, done.stderr
