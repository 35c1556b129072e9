"""The gateway policy end to end: test indexes -> ``tufproxy gateway serve`` -> edge (``tufproxy serve``) -> pip and uv.

Upload times are set on the test index relative to the real clock, far
from every cut-off, so the answer each client must reach is computed from
the index's own upload-times, not written down.  Nothing is published
beforehand: the edge's misses ask the gateway (the miss protocol).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from packaging.version import Version

from proxy.repository.sample import build_wheel
from tests.support.clients import http_status, install, pip, uv_path
from tests.support.gatewayproc import GatewayProcess, edge_for, gateway_init, metric
from tests.support.poll import wait_for
from tests.support.testindex import TestIndex

CLIENTS = ["pip", pytest.param("uv", marks=pytest.mark.skipif(uv_path() is None, reason="uv not installed"))]
NOW = datetime.now(UTC)
# project -> [(version, days since upload, or None: the page gives no upload-time)]
RELEASES: dict[str, list[tuple[str, int | None]]] = {
    "cool": [("1.0", 800), ("1.1", 500), ("2.0", 100), ("2.1", 1)],
    "fresh": [("1.0", 800), ("2.0", 1)],
    "nodate": [("1.0", 800), ("1.1", None)],
    "evil": [("1.0", 800)],
}
TRUSTED = 'tufproxy_trusted_role_version{role="timestamp"}'
COOLDOWN = ("--min-release-age", "400d", "--cooldown-exempt", "fre?h", "--deny-project", "Evil*")


def _uploaded(days: int | None) -> str | None:
    return None if days is None else (NOW - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _fill(index: TestIndex, dists: Path, releases: dict[str, list[tuple[str, int | None]]]) -> None:
    for project, versions in releases.items():
        for version, days in versions:
            index.add(build_wheel(dists, project, version), upload_time=_uploaded(days))


def _newest_before(index: TestIndex, project: str, cutoff: datetime) -> str:
    """The newest version the index says was uploaded before ``cutoff`` (from its pages' upload-times)."""
    older = [Version(f.filename.split("-")[1]) for f in index.page(project).files
             if f.upload_time and datetime.fromisoformat(f.upload_time) < cutoff]
    return str(max(older))


def _installed(target: Path, project: str) -> str | None:
    found = [p.name.removesuffix(".dist-info").split("-")[1] for p in target.glob(f"{project}-*.dist-info")]
    return found[0] if found else None


@pytest.fixture
def test_index(tmp_path: Path) -> Iterator[TestIndex]:
    index = TestIndex(separate_files_host=True)
    _fill(index, tmp_path / "dists", RELEASES)
    with index:
        yield index


def _gateway(tmp_path: Path, *indexes: TestIndex, args: tuple[str, ...] = COOLDOWN, port: int | None = None) -> GatewayProcess:
    if not (tmp_path / "gw").exists():
        gateway_init(tmp_path / "gw")
    urls = [a for i in indexes for a in ("--index-url", i.url, "--files-origin", i.files_url)]
    gw = GatewayProcess(tmp_path / "gw", *urls, "--page-ttl", "1", "--batch-window", "0.1", *args)
    if port is not None:
        gw.port = port
    return gw


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_cooldown_exemption_and_missing_upload_time(tmp_path: Path, test_index: TestIndex, client: str) -> None:
    with _gateway(tmp_path, test_index) as gw, edge_for(tmp_path, gw) as edge:
        r = install(client, edge.url, tmp_path / "t", "cool", "fresh", "nodate")
        assert r.returncode == 0, r.stdout + r.stderr
        expected = _newest_before(test_index, "cool", NOW - timedelta(days=400))
        assert expected == "1.1" and _installed(tmp_path / "t", "cool") == expected
        assert _installed(tmp_path / "t", "fresh") == "2.0"  # exempt: its newest
        assert _installed(tmp_path / "t", "nodate") == "1.0"  # no upload-time: excluded, as uv does
        page = json.loads((gw.directory / "public" / "simple" / "cool" / "index.json").read_bytes())
        assert page["versions"] == ["1.0", "1.1"]
        trimmed = [a for a in gw.audit() if a.get("reason") == "policy-hidden"]
        assert {a["project"] for a in trimmed} >= {"cool", "nodate"}
        cool = next(a for a in trimmed if a["project"] == "cool")
        assert cool["hidden_count"] == 2 and cool["rules"] == {"min-release-age": 2}
        assert metric(gw.base, 'tufproxy_gateway_policy_hidden_files{rule="min-release-age"}') >= 2
        assert metric(gw.base, 'tufproxy_gateway_policy_hidden_files{rule="missing-upload-time"}') >= 1


@pytest.mark.slow
def test_missing_upload_time_include(tmp_path: Path, test_index: TestIndex) -> None:
    with _gateway(tmp_path, test_index, args=(*COOLDOWN, "--missing-upload-time", "include")) as gw, \
            edge_for(tmp_path, gw) as edge:
        r = install("pip", edge.url, tmp_path / "t", "nodate")
        assert r.returncode == 0, r.stdout + r.stderr
        assert _installed(tmp_path / "t", "nodate") == "1.1"


@pytest.mark.slow
def test_denied_project_fails_with_its_reason(tmp_path: Path, test_index: TestIndex) -> None:
    with _gateway(tmp_path, test_index) as gw, edge_for(tmp_path, gw) as edge:
        status, answer = gw.publish("EVIL")
        assert status == 404 and "denied by policy" in answer["detail"]
        # pip shows the reason with -vvv, through the edge (which relays the gateway's 404) and straight at the gateway.
        for index_url in (edge.url, f"{gw.base}simple/"):
            r = pip("install", "-vvv", "--index-url", index_url, "--target", str(tmp_path / "t"), "evil")
            assert r.returncode != 0
            assert "evil: denied by policy (deny-project 'evil*')" in r.stdout + r.stderr, index_url
        denied = [a for a in gw.audit() if a.get("reason") == "deny-project"]
        assert denied and denied[0]["target"] == "simple/evil/" and "denied by policy" in denied[0]["detail"]
        assert not (gw.directory / "public" / "simple" / "evil").exists()


@pytest.mark.slow
def test_allow_list_blocks_everything_else(tmp_path: Path, test_index: TestIndex) -> None:
    with _gateway(tmp_path, test_index, args=("--allow-project", "cool")) as gw:
        assert gw.publish("cool")[0] == 200
        status, answer = gw.publish("fresh")
        assert status == 404 and "denied by policy (not on the allow-project list)" in answer["detail"]
        assert any(a.get("reason") == "allow-project" for a in gw.audit())


@pytest.mark.slow
def test_deny_rule_added_later_unpublishes(tmp_path: Path, test_index: TestIndex) -> None:
    page = tmp_path / "gw" / "public" / "simple" / "fresh" / "index.json"
    with _gateway(tmp_path, test_index, args=()) as gw:
        assert gw.publish("fresh")[0] == 200 and gw.publish("cool")[0] == 200
    assert page.exists()
    with _gateway(tmp_path, test_index, args=("--deny-project", "fresh")) as gw, edge_for(tmp_path, gw) as edge:
        wait_for(lambda: not page.exists(), what="fresh unpublished at its next refresh")
        assert gw.listed() == {"cool"}
        # The edge trusts the timestamp that dropped it within its --refresh-interval (0.5 s).
        wait_for(lambda: http_status(f"{edge.url}fresh/") == 404, what="the edge no longer offering fresh")
        # Its root page is rendered from the bins it verified: exactly what they still vouch for.
        root = urllib.request.Request(edge.url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(root, timeout=30) as r:
            assert [p["name"] for p in json.loads(r.read())["projects"]] == ["cool"]
        assert install("pip", edge.url, tmp_path / "t", "fresh").returncode != 0
        assert any(a.get("reason") == "deny-project" and a.get("target") == "simple/fresh/" for a in gw.audit())


@pytest.fixture
def two_indexes(tmp_path: Path) -> Iterator[tuple[TestIndex, TestIndex]]:
    first, second = TestIndex(separate_files_host=True), TestIndex(separate_files_host=True)
    _fill(first, tmp_path / "first", {"shared": [("1.0", 800)]})
    _fill(second, tmp_path / "second", {"shared": [("9.0", 800)], "acme-tool": [("6.6.6", 800)]})
    with first, second:
        yield first, second


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_first_index_wins_and_private_names_never_fall_through(tmp_path: Path, two_indexes: tuple[TestIndex, TestIndex],
                                                                client: str) -> None:
    first, second = two_indexes
    with _gateway(tmp_path, first, second, args=("--private-project", "acme-*")) as gw, edge_for(tmp_path, gw) as edge:
        r = install(client, edge.url, tmp_path / "t", "shared")
        assert r.returncode == 0, r.stdout + r.stderr
        assert _installed(tmp_path / "t", "shared") == "1.0"  # never merged with the second index's 9.0
        status, answer = gw.publish("acme-tool")
        assert status == 404 and "claimed private" in answer["detail"]
        assert install(client, edge.url, tmp_path / "t2", "acme-tool").returncode != 0
        assert not any("acme-tool" in path for path in second.requests)
        assert any(a.get("reason") == "private-project" for a in gw.audit())


@pytest.mark.slow
def test_policy_change_and_restart_rerenders_with_versions_rising(tmp_path: Path, test_index: TestIndex) -> None:
    timestamp = tmp_path / "gw" / "public" / "metadata" / "timestamp.json"
    page = tmp_path / "gw" / "public" / "simple" / "cool" / "index.json"
    first = _gateway(tmp_path, test_index, args=("--min-release-age", "400d")).start()
    try:
        edge = edge_for(tmp_path, first).start()
        assert install("pip", edge.url, tmp_path / "t1", "cool").returncode == 0
        assert _installed(tmp_path / "t1", "cool") == "1.1"
        seen = [metric(edge.base, TRUSTED)]
    finally:
        first.stop()
    try:
        before = json.loads(timestamp.read_bytes())["signed"]["version"]
        # The same address, a shorter cooldown: the page is re-rendered at its next refresh.
        with _gateway(tmp_path, test_index, args=("--min-release-age", "P50D"), port=first.port):
            wait_for(lambda: "2.0" in json.loads(page.read_bytes())["versions"], what="cool re-rendered")
            # The plain page name is linked just before the timestamp that signs it is written (the signer's
            # commit point), so the new timestamp may be a moment behind it.
            wait_for(lambda: json.loads(timestamp.read_bytes())["signed"]["version"] > before,
                     what="a timestamp above the one before the restart")
            wait_for(lambda: install("pip", edge.url, tmp_path / "t2", "cool").returncode == 0
                     and _installed(tmp_path / "t2", "cool") == "2.0", what="the edge sees cool 2.0")
            seen.append(metric(edge.base, TRUSTED))
    finally:
        edge.stop()
    assert seen[-1] > seen[0]
    assert "rollback" not in edge.log()


@pytest.mark.slow
def test_policy_is_printed_and_kept(tmp_path: Path, test_index: TestIndex) -> None:
    with _gateway(tmp_path, test_index, args=(*COOLDOWN, "--private-project", "acme-*")) as gw:
        assert gw.publish("cool")[0] == 200
        assert "min-release-age: 400 days" in gw.log()
    r = subprocess.run([sys.executable, "-m", "proxy", "gateway", "policy", str(gw.directory), "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    policy = json.loads(r.stdout)
    assert policy["min_release_age"] == "P400D" and policy["private_project"] == ["acme-*"]
    assert policy["deny_project"] == ["evil*"] and policy["cooldown_exempt"] == ["fre?h"]
    text = subprocess.run([sys.executable, "-m", "proxy", "gateway", "policy", str(gw.directory)],
                          capture_output=True, text=True, timeout=60).stdout
    assert "private-project (first index only): acme-*" in text


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "config", "message"),
    [
        (("--min-release-age", "1 month"), "", "--min-release-age: '1 month' uses months"),
        (("--uploaded-before", "2025-01-01"), "", "--uploaded-before: '2025-01-01' is not an RFC 3339 timestamp"),
        (("--deny-project", "a/b"), "", "--deny-project: 'a/b' is not a project-name pattern"),
        ((), 'project_age = { cool = "2 years" }', "gw.toml: project_age: cool: "),
    ],
)
def test_bad_policy_stops_startup_with_one_line(tmp_path: Path, test_index: TestIndex, args: tuple[str, ...],
                                                config: str, message: str) -> None:
    gateway_init(tmp_path / "gw")
    extra: tuple[str, ...] = ()
    if config:
        (tmp_path / "gw.toml").write_text(config)
        extra = ("--config", str(tmp_path / "gw.toml"))
    r = subprocess.run([sys.executable, "-m", "proxy", "gateway", "serve", str(tmp_path / "gw"), "--index-url",
                        test_index.url, "--listen", "127.0.0.1:0", *args, *extra],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert not (tmp_path / "gw" / "gateway" / "policy.json").exists()
