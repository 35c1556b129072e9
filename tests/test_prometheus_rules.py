"""deploy/prometheus/rules.yml is valid (``promtool check rules``), and its connection alert fires on the metrics
a real process exports: ``promtool test rules`` against series named as ``/metrics`` names them."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from proxy.serving.listener import Limits, ListenerMetrics

RULES = Path(__file__).parent.parent / "deploy" / "prometheus" / "rules.yml"
promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(promtool is None, reason="promtool (Debian: prometheus) is not installed; .ci/run installs it")


@needs_promtool
def test_the_rules_are_valid() -> None:
    r = subprocess.run([str(promtool), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_connections_near_the_cap_alert(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    ListenerMetrics(registry, Limits(max_connections=100))
    exported = generate_latest(registry).decode()
    for name in ("tufproxy_connections_open", "tufproxy_connections_max", "tufproxy_accept_errors_total"):
        assert f"\n{name} " in exported or exported.startswith(f"{name} "), f"{name} is not what the process exports"
    (tmp_path / "rules.yml").write_text(RULES.read_text())
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if r["alert"] == "TufproxyConnectionsNearCap")
    annotations = {k: v.replace("{{ $labels.instance }}", "a") for k, v in rule["annotations"].items()}
    (tmp_path / "test.yml").write_text(textwrap.dedent("""\
        rule_files: [rules.yml]
        evaluation_interval: 1m
        tests:
          - interval: 1m
            input_series:
              - series: 'tufproxy_connections_open{job="edge", instance="a"}'
                values: '10+0x3 95+0x10'
              - series: 'tufproxy_connections_max{job="edge", instance="a"}'
                values: '100+0x14'
            alert_rule_test:
              - eval_time: 3m
                alertname: TufproxyConnectionsNearCap
                exp_alerts: []
              - eval_time: 12m
                alertname: TufproxyConnectionsNearCap
                exp_alerts:
                  - exp_labels: {severity: warning, job: edge, instance: a}
                    exp_annotations: ANNOTATIONS
        """).replace("ANNOTATIONS", json.dumps(annotations)))
    r = subprocess.run([str(promtool), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
