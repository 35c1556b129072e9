"""``tufproxy doctor`` on a healthy chain (a real gateway and edge on 127.0.0.1) and on broken ones: a root that
is not the gateway's, an edge pinned to another root, an edge that is not there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from tests.support.gatewayproc import GatewayProcess, gateway_init
from tests.support.net import free_port
from tests.support.proxyproc import ProxyProcess
from tests.support.testindex import TestIndex
from tests.test_cli_errors import tufproxy


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    with TestIndex() as index:
        index.add(build_wheel(tmp_path / "dists", "app", "1.0"))
        gateway_init(tmp_path / "gw")
        with GatewayProcess(tmp_path / "gw", "--index-url", index.url) as gw:
            yield gw


def _lines(out: str) -> dict[str, str]:
    """check name -> its line."""
    return {line.split(":", 1)[0][9:]: line for line in out.splitlines() if line[:8].strip() in
            ("ok", "warning", "problem")}


@pytest.mark.slow
def test_a_healthy_chain_and_three_broken_ones(gateway: GatewayProcess, tmp_path: Path) -> None:
    other_root = Repository.init(tmp_path / "other", bins=4).metadata_dir / "1.root.json"
    with ProxyProcess(tmp_path / "edge", "--upstream", gateway.base, "--root", str(gateway.root), "--workers",
                      "1") as edge:
        done = tufproxy(["doctor", "--gateway", gateway.base, "--edge", edge.base, "--root", str(gateway.root)],
                        tmp_path)
        assert done.returncode == 0, done.stdout
        checks = _lines(done.stdout)
        for name in ("gateway reachable", "gateway ready", "gateway clock", "timestamp", "root", "signing",
                     "edge reachable", "edge ready", "edge clock", "edge serves", "hot path", "edge refresh"):
            assert checks[name].startswith("ok "), done.stdout
        assert f"pip:  pip config set global.index-url {edge.url}" in done.stdout
        assert done.stdout.splitlines()[-1] == "0 problem(s), 0 warning(s)", done.stdout
        # A root that is not the gateway's: named, with what to pin instead.
        done = tufproxy(["doctor", "--gateway", gateway.base, "--root", str(other_root)], tmp_path)
        assert done.returncode == 1
        assert _lines(done.stdout)["root"].startswith("problem  root: --root is not the gateway's 1.root.json: pin")
    # An edge pinned to another root: its /readyz says so, and doctor repeats it.
    with ProxyProcess(tmp_path / "wrong", "--upstream", gateway.base, "--root", str(other_root), "--workers",
                      "1") as wrong:
        done = tufproxy(["doctor", "--edge", wrong.base], tmp_path)
        assert done.returncode == 1
        assert "is --root this upstream's root?" in _lines(done.stdout)["edge ready"], done.stdout
    # Nothing there.
    done = tufproxy(["doctor", "--edge", f"http://127.0.0.1:{free_port()}/"], tmp_path)
    assert done.returncode == 1 and _lines(done.stdout)["edge reachable"].startswith("problem "), done.stdout
    assert "1 problem(s)" in done.stdout


def test_what_the_metrics_say_becomes_a_line_with_its_fix() -> None:
    from datetime import UTC, datetime

    from proxy.cli.doctor import metric_checks

    now = datetime(2026, 12, 5, tzinfo=UTC)
    stale = {"tufproxy_hot_path_installed": [({}, 0.0)],
             "tufproxy_last_successful_refresh_timestamp_seconds": [({}, now.timestamp() - 7200)],
             "tufproxy_bucket_errors_total": [({"op": "get"}, 3.0), ({"op": "put"}, 1.0)],
             "tufproxy_bucket_requests_total": [({"op": "get"}, 90.0)]}
    lines = [c.line() for c in metric_checks("edge", stale, now)]
    assert lines[0].startswith("warning  hot path: not installed")
    assert lines[1] == ("warning  edge refresh: last successful metadata refresh 7200 s ago: is its upstream "
                        "reachable? (tufproxy_refresh_failures_total)")
    assert lines[2].startswith("warning  edge bucket: 90 request(s), 4 failed since start")
    gateway = {"tufproxy_gateway_signing_errors_total": [({}, 2.0)],
               "tufproxy_gateway_advisory_feeds_answered_timestamp_seconds": [({}, now.timestamp() - 30)],
               "tufproxy_gateway_refusals_total": [({"kind": "repository", "reason": "provenance-invalid"}, 2.0),
                                                   ({"kind": "repository", "reason": "publisher-changed"}, 1.0),
                                                   ({"kind": "upstream", "reason": "upstream-unreachable"}, 5.0)],
               "tufproxy_gateway_advisory_blocked_files": [({"rule": "advisory-malicious"}, 2.0),
                                                          ({"rule": "advisory-vulnerable"}, 1.0)]}
    checks = {c.name: c for c in metric_checks("gateway", gateway, now)}
    assert [c.status for c in checks.values()] == ["warning", "ok", "warning", "ok"]
    assert checks["provenance"].line().startswith("warning  provenance: 3 file(s) refused since start for their "
                                                  "provenance")
    assert checks["advisory blocks"].line() == "ok       advisory blocks: 3 file(s) kept out by advisories now"
    assert metric_checks("gateway", None, now)[0].status == "warning"


@pytest.mark.slow
def test_an_index_linking_files_on_an_origin_not_allowed(tmp_path: Path) -> None:
    with TestIndex(separate_files_host=True, root_page=True) as index:  # a root page: the start-up check reads it
        index.add(build_wheel(tmp_path / "dists", "app", "1.0"))
        gateway_init(tmp_path / "gw")
        with GatewayProcess(tmp_path / "gw", "--index-url", index.url) as gw:  # no --files-origin
            done = tufproxy(["doctor", "--gateway", gw.base], tmp_path)
            assert done.returncode == 1, done.stdout
            line = _lines(done.stdout)["files origin"]
            assert line.startswith("problem  files origin: ") and f"--files-origin {index.files_url}" in line, line
            assert "foreign origins" not in _lines(done.stdout)
            assert gw.publish("app")[0] == 502  # a publish meets it too: counted, and doctor says how often
            done = tufproxy(["doctor", "--gateway", gw.base], tmp_path)
            assert _lines(done.stdout)["foreign origins"].startswith(
                "problem  foreign origins: 1 page(s) refused since start"), done.stdout
        with GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--files-origin", index.files_url) as gw:
            done = tufproxy(["doctor", "--gateway", gw.base], tmp_path)
            assert _lines(done.stdout)["files origin"].startswith("ok "), done.stdout
