"""deploy/prometheus/rules.yml is valid (``promtool check rules``), and its connection alert fires on the metrics
a real process exports: ``promtool test rules`` against series named as ``/metrics`` names them."""

from __future__ import annotations

import json
import re
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


TESTS = RULES.parent / "rules_test.yml"
_NAME = re.compile(r"\btufproxy_[a-z_]+")
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created")}


def _alerts() -> dict[str, dict]:  # type: ignore[type-arg]
    return {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}


def test_every_metric_a_rule_reads_is_exported() -> None:
    from proxy.gateway.metrics import GatewayMetrics
    from proxy.util.metrics import Metrics

    registries = [Metrics().registry, GatewayMetrics().registry, CollectorRegistry()]
    ListenerMetrics(registries[2], Limits())
    exported = {f.name + s for r in registries for f in r.collect() for s in _SUFFIXES.get(f.type, ("",))}
    read = {n for rule in _alerts().values() for n in _NAME.findall(rule["expr"])}
    assert read <= exported, read - exported


@needs_promtool
def test_every_alert_fires_when_it_should_and_not_before(tmp_path: Path) -> None:
    """deploy/prometheus/rules_test.yml's cases, each expected alert given its annotations from rules.yml."""
    alerts = _alerts()
    spec = yaml.safe_load(TESTS.read_text())
    tested = set()
    for case in spec["tests"]:
        for check in case["alert_rule_test"]:
            tested.add(check["alertname"])
            for alert in check["exp_alerts"]:
                labels = alert["exp_labels"]
                alert["exp_annotations"] = {
                    k: " ".join(v.replace("{{ $labels.instance }}", labels.get("instance", ""))
                                .replace("{{ $labels.job }}", labels["job"]).split())
                    for k, v in alerts[check["alertname"]]["annotations"].items()}
    assert tested | {"TufproxyConnectionsNearCap"} == set(alerts), set(alerts) - tested  # that one: above
    (tmp_path / "rules.yml").write_text(RULES.read_text())
    (tmp_path / "rules_test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    r = subprocess.run([str(promtool), "test", "rules", "rules_test.yml"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr
