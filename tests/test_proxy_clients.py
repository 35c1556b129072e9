"""Unmodified pip and uv install through ``tufproxy serve``, and fail when the mirror lies.

Everything is real: a repository signed by our signer, a threaded HTTP
upstream serving it (and tampering on demand), the proxy as a subprocess,
and pip/uv as subprocesses with no config and no cache.
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest

from proxy.protocol import index
from tests.conftest import SampleRepo
from tests.support.clients import install, pip, uv_path
from tests.support.proxyproc import ProxyProcess
from tests.support.tree import assert_cache_clean, signed_timestamp
from tests.support.upstream import Reply, Upstream

CLIENTS = ["pip", pytest.param("uv", marks=pytest.mark.skipif(uv_path() is None, reason="uv not installed"))]
# Every test here runs against a repository in each layout the proxy has a profile for.
pytestmark = pytest.mark.parametrize("layout", ["tufproxy", "warehouse"], indirect=True)


def start_proxy(tmp_path: Path, sample: SampleRepo, upstream: Upstream, *extra: str) -> ProxyProcess:
    root = tmp_path / "pinned-root.json"
    root.write_bytes(sample.root_bytes)
    return ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", str(root),
                        "--profile", sample.repo.profile.name, *extra).start()


@pytest.fixture
def proxy(tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream):
    p = start_proxy(tmp_path, sample_repo, upstream)
    yield p
    p.stop()


def installed(target: Path) -> dict[str, str]:
    """Project -> version of what a --target install put there."""
    found = {}
    for d in target.glob("*.dist-info"):
        name, version = d.name[: -len(".dist-info")].rsplit("-", 1)
        found[name] = version
    return found


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_dependency_chain_installs_through_the_proxy(
    client: str, proxy: ProxyProcess, upstream: Upstream, sample_repo: SampleRepo, tmp_path: Path
) -> None:
    r = install(client, proxy.url, tmp_path / "t", "app")
    assert r.returncode == 0, r.stderr + proxy.log()
    assert installed(tmp_path / "t") == {"app": "1.0", "lib": "1.1", "base": "2.0"}
    # Versioned bin metadata, and files under hash names where they are targets.
    assert upstream.count(rf"{sample_repo.metadata_prefix}\d+\.bins?-[0-9a-f]+\.json") >= 1
    hashed = r"[0-9a-f]{64}\." if sample_repo.repo.profile.files_are_targets else ""
    assert upstream.count(rf"/packages/[^/]+/{hashed}[^/]+\.whl") == 3


@pytest.mark.slow
def test_pip_uses_pep658_metadata_and_skips_requires_python_misfits(
    proxy: ProxyProcess, upstream: Upstream, tmp_path: Path
) -> None:
    r = pip(
        "download",
        "--index-url",
        proxy.url,
        "-d",
        str(tmp_path / "d"),
        "app",
        "future-only",
        "--python-version",
        "3.11",
        "--only-binary=:all:",
    )
    assert r.returncode != 0 and "future-only" in r.stderr  # only release needs Python >= 4
    r = pip("download", "--index-url", proxy.url, "-d", str(tmp_path / "d"), "app")
    assert r.returncode == 0, r.stderr
    assert upstream.count(r"/packages/.*\.whl\.metadata") >= 1
    # pip resolved from .metadata: it never downloaded lib 1.0's wheel, only the chosen 1.1.
    assert upstream.count(r"/packages/lib/([0-9a-f]{64}\.)?lib-1\.0-py3-none-any\.whl") == 0
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [
        "app-1.0-py3-none-any.whl",
        "base-2.0-py3-none-any.whl",
        "lib-1.1-py3-none-any.whl",
    ]


@pytest.mark.slow
def test_html_and_json_clients_get_the_same_files(proxy: ProxyProcess, tmp_path: Path) -> None:
    # pip's --find-links asks for text/html; --index-url asks for PEP 691 JSON first.
    links = [a for p in ("app", "lib", "base") for a in ("--find-links", f"{proxy.url}{p}/")]
    r = pip("download", "--no-index", *links, "-d", str(tmp_path / "html"), "app")
    assert r.returncode == 0, r.stderr
    r = pip("download", "--index-url", proxy.url, "-d", str(tmp_path / "json"), "app")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "html").iterdir()) == sorted(p.name for p in (tmp_path / "json").iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_yanked_file_is_skipped_unless_pinned(client: str, tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream) -> None:
    sample_repo.repo.remove("lib-1.1-py3-none-any.whl", reason="broken")
    with start_proxy(tmp_path, sample_repo, upstream) as p:
        r = install(client, p.url, tmp_path / "a", "lib")
        assert r.returncode == 0, r.stderr
        assert installed(tmp_path / "a")["lib"] == "1.0"
        r = install(client, p.url, tmp_path / "b", "lib==1.1")
        assert r.returncode == 0, r.stderr
        assert installed(tmp_path / "b")["lib"] == "1.1"


def _get(url: str) -> tuple[int, str, str | None, str]:
    """Status, reason phrase, X-Tufproxy-Reason and body of a plain GET."""
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.reason, resp.headers.get("X-Tufproxy-Reason"), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.reason, e.headers.get("X-Tufproxy-Reason"), e.read().decode(errors="replace")


def _served(path: str) -> str:
    """Regex for every URL a file or page of ``path``'s project may be served under, in either layout."""
    d, _, base = path.rpartition("/")
    return f"/{d}/([0-9a-f]{{64,128}}\\.)?{base.replace('.', '[.]')}"


def _flip(data: bytes | None) -> Reply:
    assert data is not None
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0x01
    return Reply(200, bytes(bad))


def _page_with_extra_version(data: bytes | None) -> Reply:
    """lib's page (JSON or HTML) listing one more, malicious, release."""
    assert data is not None
    is_json = data.lstrip().startswith(b"{")
    page = index.parse_project_json(data, "lib") if is_json else index.parse_project_html(data, "lib")
    evil = dataclasses.replace(page.files[0], filename="lib-6.6.6-py3-none-any.whl", url="lib-6.6.6-py3-none-any.whl")
    page = dataclasses.replace(page, files=(*page.files, evil), versions=(*page.versions, "6.6.6"))
    return Reply(200, index.render_project_json(page) if is_json else index.render_project_html(page))


ATTACKS = ["tampered-wheel", "page-extra-version", "expired-timestamp", "swapped-file", "oversized-file"]


@pytest.mark.slow
@pytest.mark.parametrize("attack", ATTACKS)
def test_attacks_make_pip_fail_and_the_proxy_names_the_reason(
    attack: str, tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream
) -> None:
    """pip fails showing the status (current pips print no reason phrase); the proxy's answer names the
    reason (status line, X-Tufproxy-Reason, body) and its audit log records it."""
    repo = sample_repo.repo
    base_whl = "packages/base/base-2.0-py3-none-any.whl"
    timestamp = f"{sample_repo.metadata_prefix}timestamp.json"
    extra: tuple[str, ...] = ()
    # What pip asked for that the proxy refused, and the refusal (proxy/serving/refusals.py's row).
    refused_path, status, says = base_whl, 502, "refused by TUF verification"
    if attack == "expired-timestamp":
        upstream.replace(timestamp, signed_timestamp(repo, expires_delta=-timedelta(days=3)))
        expect = "expired"
        refused_path, status, says = "simple/app/", 503, "trusted metadata expired"
    elif attack == "tampered-wheel":
        upstream.override(_served(base_whl), _flip)
        expect = "hash-mismatch"
    elif attack == "page-extra-version":
        upstream.override(r"/simple/lib/[0-9a-f]{64}\.(index\.json|index\.html|lib\.html)", _page_with_extra_version)
        expect = "length-mismatch|hash-mismatch"
        refused_path = "simple/lib/"
    elif attack == "swapped-file":
        # Another file the same keys vouch for, served under base's wheel URL.
        other = (repo.public_dir / "packages/base/base-2.0.tar.gz").read_bytes()
        upstream.replace(_served(base_whl), other)
        expect = "length-mismatch|hash-mismatch"
    else:
        # Far more than signed (tufproxy layout) or than the --max-file-size cap (warehouse: pages give no size).
        upstream.override(_served(base_whl), lambda data: Reply(200, (data or b"") + b"\0" * 3_000_000))
        extra = ("--max-file-size", "1M")
        expect = "length-mismatch"
    with start_proxy(tmp_path, sample_repo, upstream, *extra) as p:
        # --retries 0: pip retries a 5xx (5 times by default, backing off) and then tells no more.
        # A failed index page pip reports only at debug level ("Could not fetch URL ...: ... - skipping").
        r = pip("-vv", "install", "--retries", "0", "--index-url", p.url, "--target", str(tmp_path / "t"), "app")
        direct = _get(p.base + refused_path)
        log = p.log()
    assert r.returncode != 0, r.stdout
    # pip 23.2: "HTTP error 502 while getting ..." and the reason phrase; newer (26.3): "too many 502 error responses".
    said = r.stdout + r.stderr
    assert re.search(rf"\b{status}\b", said) and refused_path.rstrip("/") in said, said[-3000:]
    code, phrase, slug, body = direct
    assert code == status and slug is not None and any(e in slug for e in expect.split("|")), direct
    assert phrase.startswith(says) and body.startswith(says), direct
    assert not (tmp_path / "t").exists() or "base" not in installed(tmp_path / "t")
    assert_cache_clean(tmp_path / "cache", repo)
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    refused = [rec for rec in records if rec.get("event") == "refused"]
    assert refused, log
    assert any(any(e in rec["reason"] for e in expect.split("|")) for rec in refused), refused


@pytest.mark.slow
def test_a_replayed_snapshot_is_refused_and_pip_gets_only_the_still_valid_state(
    tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream
) -> None:
    """The proxy trusts the current state, then the mirror replays an older snapshot: the update is aborted
    (TUF 5.3-5.6), audited as a rollback, and pip installs from the trusted state that is still valid."""
    repo = sample_repo.repo
    with start_proxy(tmp_path, sample_repo, upstream) as p:
        assert install("pip", p.url, tmp_path / "warm", "base").returncode == 0
    current = json.loads((repo.metadata_dir / "timestamp.json").read_bytes())
    snapshot_version = current["signed"]["meta"]["snapshot.json"]["version"]
    upstream.replace(f"{sample_repo.metadata_prefix}timestamp.json",
                     signed_timestamp(repo, snapshot_version=snapshot_version - 1))
    with start_proxy(tmp_path, sample_repo, upstream) as p:
        r = install("pip", p.url, tmp_path / "t", "app")
        log = p.log()
    assert r.returncode == 0, r.stdout + r.stderr
    assert {"app", "lib", "base"} <= set(installed(tmp_path / "t"))
    assert_cache_clean(tmp_path / "cache", repo)
    refused = [json.loads(line) for line in log.splitlines() if line.startswith("{") and '"refused"' in line]
    assert any("rollback" in rec["reason"] for rec in refused), log[-3000:]
