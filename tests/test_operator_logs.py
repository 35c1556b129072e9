"""What an operator reads says what is wrong: a wrong ``--root`` is named as the likely cause, a second gateway on
one directory is refused in one line, entries a gateway leaves out by design are a metric and one line (not
audit records), gateway records carry the page URL and the edge's request id, and ``tufproxy audit`` on a
gateway's log shows no clients it does not have.

Real ``serve`` and ``gateway serve`` subprocesses, a real index on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from tests.conftest import SampleRepo
from tests.support.gatewayproc import GatewayProcess, gateway_init, metric
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.testindex import TestIndex
from tests.support.upstream import Upstream
from tests.test_cli_errors import ERROR_LINE, tufproxy

WRONG_ROOT = "the upstream's timestamp is signed by none of the pinned root's keys: is --root this upstream's root?"


def _readyz(base: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    try:
        with urllib.request.urlopen(f"{base}readyz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow
def test_a_wrong_root_is_named_as_the_likely_cause(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    other = Repository.init(tmp_path / "other", bins=4)  # a root for another repository
    with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", str(other.metadata_dir / "1.root.json"),
                      "--workers", "1") as edge:
        status, body = _readyz(edge.base)
        assert status == 503 and any(WRONG_ROOT in p for p in body["problems"]), body
        assert WRONG_ROOT in edge.log()


@pytest.mark.slow
def test_gateway_records_logs_and_a_second_gateway(tmp_path: Path) -> None:
    dists = tmp_path / "dists"
    with TestIndex(separate_files_host=True) as index:
        wheel = index.add(build_wheel(dists, "app", "1.0"))
        digest = hashlib.sha256(wheel.data).hexdigest()
        index.raw_pages["app"] = (
            f'<a href="{index.files_url}files/app/app-1.0-py3-none-any.whl#sha256={digest}">app-1.0-py3-none-any.whl</a>'
            f'<a href="{index.files_url}files/app/app-0.1-py2.7.egg#sha256={digest}">app-0.1-py2.7.egg</a>'
            f'<a href="{index.files_url}files/app/other-1.0.tar.gz#sha256={digest}">other-1.0.tar.gz</a>'
            f'<a href="{index.files_url}files/app/app-0.9.tar.gz">app-0.9.tar.gz</a>').encode()
        gateway_init(tmp_path / "gw")
        args = ("--index-url", index.url, "--files-origin", index.files_url, "--deny-project", "evil*")
        with GatewayProcess(tmp_path / "gw", *args) as gw:
            # A second gateway on the same directory: one line, exit 2, naming the first.
            done = tufproxy(["gateway", "serve", str(gw.directory), *args, "--listen", "127.0.0.1:0"], tmp_path)
            assert done.returncode == 2, done.stderr
            [line] = done.stderr.splitlines()
            assert ERROR_LINE.fullmatch(line) and f"is already served by another gateway (pid {gw.proc.pid} on " \
                f"127.0.0.1:{gw.port})" in line, line
            assert gw.publish("app")[0] == 200
            # The .egg and the other project's file: left out by design, counted, one line, no audit record.
            assert metric(gw.base, "tufproxy_gateway_ignored_files_total") == 2
            left_out = [x for x in gw.log().splitlines() if "left out" in x]
            assert len(left_out) == 1 and f"{index.url}app/: left out 2 entries that are not distributions of app" \
                in left_out[0], gw.log()
            # The edge's request id reaches the gateway's record of a policy refusal.
            with ProxyProcess(tmp_path / "edge", "--upstream", gw.base, "--root", str(gw.root),
                              "--workers", "1") as edge:
                asked = urllib.request.Request(f"{edge.url}evil-thing/", headers={"X-Request-Id": "req-from-ci-42"})
                try:
                    urllib.request.urlopen(asked, timeout=30)
                except urllib.error.HTTPError as e:
                    assert e.code == 404
            records = wait_for(lambda: [a for a in gw.audit() if a.get("reason") == "deny-project"] or None,
                               what="the deny record")
            assert records[0]["request_id"] == "req-from-ci-42", records  # type: ignore[index]
            audit = gw.audit()
            assert not [a for a in audit if a.get("reason") == "not-a-file-of-this-project"], audit
            # A real refusal (no hash) stays a record, naming the page it was read from.
            [missing] = [a for a in audit if a.get("reason") == "missing-hash"]
            assert missing["upstream_url"] == f"{index.url}app/" and missing["target"] == "packages/app/app-0.9.tar.gz"
    summary = tufproxy(["audit", str(gw.audit_path)], tmp_path)
    assert summary.returncode == 0 and "None" not in summary.stdout, summary.stdout
    assert "missing-hash" in summary.stdout and "deny-project" in summary.stdout
