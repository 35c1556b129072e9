"""What operators and security teams see: metrics, the audit log, health, the dashboard's queries."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tuf.api.metadata import Metadata

from tests.conftest import SampleRepo
from tests.support.clients import install
from tests.support.proxyproc import ProxyProcess
from tests.support.tree import signed_timestamp
from tests.support.upstream import Reply, Upstream

TAMPERED = "/packages/lib/lib-1.0-py3-none-any.whl"


def get(url: str, **headers: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def samples(metrics_text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def _flip(data: bytes | None) -> Reply:
    bad = bytearray(data or b"")
    bad[-10] ^= 0xFF
    return Reply(200, bytes(bad))


def start(tmp_path: Path, sample: SampleRepo, upstream: Upstream) -> ProxyProcess:
    root = tmp_path / "root.json"
    root.write_bytes(sample.root_bytes)
    # No read-ahead: each download is then a miss the first time and a hit the second, whatever the timing
    # (read ahead, a first download is a hit or joins the fetch, depending on which comes first).
    return ProxyProcess(tmp_path / "cache", "--upstream", f"http://user:secret@{upstream.url[7:]}",
                        "--root", str(root), "--audit-log", str(tmp_path / "audit.log"), "--read-ahead", "0").start()


@pytest.mark.slow
def test_metrics_and_audit_record_after_real_traffic(tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream) -> None:
    upstream.override(r"/packages/lib/[0-9a-f]{64}\.lib-1\.0-py3-none-any\.whl", _flip)
    with start(tmp_path, sample_repo, upstream) as proxy:
        assert install("pip", proxy.url, tmp_path / "a", "app").returncode == 0
        assert install("pip", proxy.url, tmp_path / "b", "app").returncode == 0  # every file now a cache hit
        status, body = get(proxy.base + TAMPERED.lstrip("/"))
        assert status == 502 and b"hash-mismatch" in body
        status, text = get(proxy.base + "metrics")
        assert status == 200
        found = samples(text.decode())
        assert get(proxy.base + "healthz")[0] == 200
        status, ready = get(proxy.base + "readyz")
        assert status == 200 and json.loads(ready)["ready"] is True
        dashboard_names = _dashboard_metric_names()
        exported = {name for name, _ in found}
        assert dashboard_names <= exported, f"dashboard queries metrics not exported: {dashboard_names - exported}"

    assert value(found, "tufproxy_requests_total", route="file", status="200") == 6  # three wheels, twice
    assert value(found, "tufproxy_requests_total", route="file", status="502") == 1
    assert value(found, "tufproxy_cache_hits_total", kind="file") == 3
    assert value(found, "tufproxy_cache_misses_total", kind="file") == 4  # three wheels and the tampered one
    assert value(found, "tufproxy_cache_hits_total", kind="metadata") == 3  # PEP 658 files pip read first
    assert value(found, "tufproxy_cache_misses_total", kind="metadata") == 3
    assert value(found, "tufproxy_verification_failures_total", reason="hash-mismatch") == 1
    assert value(found, "tufproxy_upstream_fetches_total", mirror="0", outcome="refused") == 1
    assert value(found, "tufproxy_request_duration_seconds_count", route="file") == 7
    ts = Metadata.from_bytes((sample_repo.repo.metadata_dir / "timestamp.json").read_bytes()).signed
    assert value(found, "tufproxy_trusted_role_version", role="timestamp") == ts.version
    assert 0 < value(found, "tufproxy_role_expiry_seconds", role="timestamp") <= 86400
    assert 300 * 86400 < value(found, "tufproxy_role_expiry_seconds", role="root") <= 366 * 86400
    assert value(found, "tufproxy_last_successful_refresh_timestamp_seconds") > 0
    # Bounded label values only: no project names or paths anywhere.
    assert not re.search(r'"(app|lib|base)[-/"]', text.decode())

    lines = (tmp_path / "audit.log").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    (refused,) = [r for r in records if r["event"] == "refused"]
    assert refused["reason"] == "hash-mismatch"
    assert refused["target"] == TAMPERED.lstrip("/")
    assert refused["request_path"] == TAMPERED
    assert refused["client"] == "127.0.0.1"
    assert len(refused["expected"]) == len(refused["actual"]) == 64 and refused["expected"] != refused["actual"]
    assert refused["trusted_versions"]["timestamp"] == ts.version
    assert refused["upstream_url"].startswith("http://127.0.0.1:") and "secret" not in json.dumps(records)
    assert refused["request_id"] and refused["time"]

    summary = subprocess.run([sys.executable, "-m", "proxy", "audit", str(tmp_path / "audit.log"), "--json"],
                             capture_output=True, text=True, check=True).stdout
    assert json.loads(summary)["by_reason"] == {"hash-mismatch": 1}


@pytest.mark.slow
def test_readyz_says_what_is_wrong_when_metadata_is_expired(tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream) -> None:
    upstream.replace("/metadata/timestamp.json", signed_timestamp(sample_repo.repo, expires_delta=-timedelta(days=3)))
    with start(tmp_path, sample_repo, upstream) as proxy:
        status, body = get(proxy.base + "readyz")
    report = json.loads(body)
    assert status == 503 and report["ready"] is False
    assert any("unexpired" in p for p in report["problems"]) and any("expired" in p for p in report["problems"])


@pytest.mark.slow
def test_audit_write_failure_fails_the_request_closed(tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream) -> None:
    upstream.override(r"/packages/lib/[0-9a-f]{64}\.lib-1\.0-py3-none-any\.whl", _flip)
    # /dev/full opens fine and fails every write with ENOSPC.
    (tmp_path / "audit.log").symlink_to("/dev/full")
    with start(tmp_path, sample_repo, upstream) as proxy:
        status, body = get(proxy.base + TAMPERED.lstrip("/"))
    assert status == 500 and b"audit log unwritable" in body


def _dashboard_metric_names() -> set[str]:
    dashboard = json.loads((Path(__file__).parents[1] / "dashboards/tufproxy.json").read_text())
    exprs = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dashboard)
    return {m for e in exprs for m in re.findall(r"\b(tufproxy_[a-z_]+)", e)}
