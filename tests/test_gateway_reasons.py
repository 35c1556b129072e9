"""Reasons reach the person who can act on them: a gateway's refusal reaches pip and uv through the edge, with
its reason slug and one-line fix; a missing ``--files-origin`` is said at the gateway's start-up; the
gateway's log says what a refresh changed.

Real index (aiohttp on 127.0.0.1), real ``gateway serve`` and ``serve`` subprocesses, real pip and uv.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.repository.sample import build_wheel
from tests.support.clients import install, pip
from tests.support.gatewayproc import GatewayProcess, gateway_init
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.testindex import TestIndex


@pytest.fixture
def test_index(tmp_path: Path) -> Iterator[TestIndex]:
    index = TestIndex(separate_files_host=True, root_page=True)
    index.add(build_wheel(tmp_path / "dists", "app", "1.0"))
    with index:
        yield index


@pytest.mark.slow
def test_a_missing_files_origin_is_said_at_start_up_and_reaches_pip_and_uv(tmp_path: Path,
                                                                           test_index: TestIndex) -> None:
    files = test_index.files_url
    fix = f"foreign-origin: the index links files on {files}; start the gateway with --files-origin {files}"
    gateway_init(tmp_path / "gw")
    with GatewayProcess(tmp_path / "gw", "--index-url", test_index.url) as gw, \
            ProxyProcess(tmp_path / "edge", "--upstream", gw.base, "--root", str(gw.root), "--workers", "1") as edge:
        warned = [line for line in gw.log().splitlines() if "foreign-origin" in line]
        assert len(warned) == 1 and fix in warned[0] and "level=WARNING" in warned[0], gw.log()
        # The edge's answer: the gateway's slug and fix in the status line (what uv prints) and the body.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{edge.url}app/", timeout=30)
        assert refused.value.code == 502 and refused.value.reason.startswith(f"refused by the gateway: {fix} (")
        assert refused.value.headers["X-Tufproxy-Reason"] == "gateway-refused"
        assert f"refused by the gateway: {fix}" in refused.value.read().decode()
        # uv prints a page's status line (after its retries); pip shows no page error at any verbosity for a
        # 502 (urllib3 retries it and keeps only "too many 502 error responses"), so it is asserted on uv only.
        r = install("uv", edge.url, tmp_path / "u", "app")
        # uv wraps its causes at spaces when it guesses a terminal width: compare words, not line breaks.
        assert r.returncode != 0 and f"(502 refused by the gateway: {fix} (" in " ".join(r.stderr.split()), r.stderr
        r = pip("install", "--index-url", edge.url, "--target", str(tmp_path / "t"), "app")
        assert r.returncode != 0 and "from versions: none" in r.stderr
    audited = [json.loads(line) for line in edge.log().splitlines() if line.startswith("{")]
    assert any(a.get("reason") == "gateway-refused" and fix in a.get("message", "") for a in audited), edge.log()


@pytest.mark.slow
def test_a_gateway_started_right_says_nothing_at_start_up_and_logs_only_what_a_refresh_changed(
        tmp_path: Path, test_index: TestIndex) -> None:
    gateway_init(tmp_path / "gw")
    with GatewayProcess(tmp_path / "gw", "--index-url", test_index.url, "--files-origin", test_index.files_url,
                        "--page-ttl", "0.5", "--batch-window", "0.05") as gw:
        assert gw.publish("app")[0] == 200
        # Pages re-fetched, nothing new: nothing said at info.
        wait_for(lambda: test_index.requests.count("/simple/app/") >= 3, what="two refreshes of app's page")
        assert "foreign-origin" not in gw.log() and "re-signed" not in gw.log() and "refreshed" not in gw.log()
        test_index.add(build_wheel(tmp_path / "dists", "app", "1.1"))
        wait_for(lambda: "re-signed 1 of 1 page(s) checked; 0 unchanged" in gw.log(), what="the changed page's line")
