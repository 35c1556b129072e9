"""``tufproxy why``: a real gateway with a cooldown and a deny rule explains what pip would only call
"no matching distribution"."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from proxy.repository.sample import build_wheel
from tests.support.clients import install
from tests.support.gatewayproc import GatewayProcess, edge_for, gateway_init
from tests.support.net import free_port
from tests.support.proxyproc import ProxyProcess
from tests.support.testindex import TestIndex
from tests.test_cli_errors import tufproxy


@pytest.mark.slow
def test_why_names_the_cooldown_the_deny_rule_and_what_is_offered(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    fresh = (now - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = (now - timedelta(days=90)).strftime("%Y-%m-%dT%H:%M:%SZ")
    with TestIndex() as index:
        index.add(build_wheel(tmp_path / "d", "lib", "1.0"), upload_time=old)
        index.add(build_wheel(tmp_path / "d", "lib", "2.0"), upload_time=fresh)
        index.add(build_wheel(tmp_path / "d", "evil", "1.0"), upload_time=old)
        index.add(build_wheel(tmp_path / "d", "gone", "1.0"), upload_time=old)
        index.add(build_wheel(tmp_path / "d", "gone", "1.1"), upload_time=old)
        gateway_init(tmp_path / "gw")
        with GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--min-release-age", "30d",
                            "--deny-project", "evil") as gw:
            # pip sees no 2.0 and says only that; the edge relays the gateway's account to whoever reaches only it.
            with edge_for(tmp_path, gw) as edge:
                r = install("pip", edge.url, tmp_path / "t", "lib>=2")
                assert r.returncode != 0 and "(from versions: 1.0)" in r.stderr, r.stderr
                via_edge = tufproxy(["why", "lib>=2", "--edge", edge.base], tmp_path)
                assert via_edge.returncode == 1 and "hidden  lib-2.0-py3-none-any.whl: by min-release-age" \
                    in via_edge.stdout, via_edge.stdout + via_edge.stderr
                # A client asking for the hidden file itself (a lock made elsewhere) is told why, and what to ask.
                status, body = _get(f"{edge.base}packages/lib/lib-2.0-py3-none-any.whl")
                assert status == 404 and "lib-2.0-py3-none-any.whl: hidden by the gateway's policy (min-release-age);" \
                    " `tufproxy why 'lib==2.0' --edge URL` says more" in body, body
                status, body = _get(f"{edge.base}packages/lib/lib-3.0-py3-none-any.whl")
                assert status == 404 and "lib-3.0-py3-none-any.whl: the index does not list it for lib" in body, body
                # A revoked file: its 404 and why say so, whoever asks first.
                revoked = tufproxy(["gateway", "revoke", str(tmp_path / "gw"), "gone", "gone-1.0-py3-none-any.whl",
                                    "--reason", "malware report"], tmp_path)
                assert revoked.returncode == 0, revoked.stderr
                status, body = _get(f"{edge.base}packages/gone/gone-1.0-py3-none-any.whl")
                assert status == 404 and "gone-1.0-py3-none-any.whl: hidden by the gateway's policy (revoked)" in body, body
                done = tufproxy(["why", "gone==1.0", "--edge", edge.base], tmp_path)
                assert done.returncode == 1 and done.stdout.startswith(
                    "hidden  gone-1.0-py3-none-any.whl: by revoked, uploaded "), done.stdout
                assert "held back" not in done.stdout
                bad = tufproxy(["why", "lib", "--edge", edge.base, "--gateway", gw.base], tmp_path)
                assert bad.returncode == 2 and "give --gateway URL or --edge URL" in bad.stderr
            # An edge whose gateways are all down says so, in one line.
            gone = ProxyProcess(tmp_path / "gone", "--profile", "gateway", "--upstream", gw.base, "--gateway-url",
                                f"http://127.0.0.1:{free_port()}/", "--root", str(gw.root), "--workers", "1")
            with gone:
                done = tufproxy(["why", "lib", "--edge", gone.base], tmp_path)
                assert done.returncode == 2 and "HTTP 502" in done.stderr and "all mirrors failed" in done.stderr, \
                    done.stderr
                assert len(done.stderr.strip().splitlines()) == 1
            done = tufproxy(["why", "lib>=2", "--gateway", gw.base], tmp_path)
            assert done.returncode == 1, done.stdout + done.stderr
            [line] = done.stdout.splitlines()
            assert line.startswith(f"hidden  lib-2.0-py3-none-any.whl: by min-release-age, uploaded {fresh[:10]}")
            assert "(files uploaded after " in line
            done = tufproxy(["why", "lib", "--gateway", gw.base], tmp_path)
            assert done.returncode == 0 and "offered 1 file(s) of lib: 1.0" in done.stdout, done.stdout
            done = tufproxy(["why", "evil", "--gateway", gw.base], tmp_path)
            assert done.returncode == 1 and "evil: not offered: evil: denied by policy (deny-project 'evil')" \
                in done.stdout, done.stdout
            done = tufproxy(["why", "nothing-here", "--gateway", gw.base], tmp_path)
            assert done.returncode == 1 and "nothing-here: not offered: " in done.stdout, done.stdout


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
