"""deploy/gateway/ and dashboards/tufproxy-gateway.json agree with the gateway's code.

The commands they run parse with the real CLI, the example config names
only real settings and documents each one, and the dashboard queries only
metrics that ``proxy.gateway.metrics`` exports.
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from proxy.cli import build_parser
from proxy.cli.gateway import OPTIONS
from proxy.gateway.metrics import GatewayMetrics
from proxy.gateway.policy import POLICY_KEYS, resolve_policy

ROOT = Path(__file__).resolve().parents[1]
GATEWAY = ROOT / "deploy" / "gateway"
_NAME = re.compile(r"\btufproxy_[A-Za-z0-9_:]*")
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created")}


def _parse(argv: list[str]) -> object:
    return build_parser().parse_args(argv)


def test_example_config_documents_every_setting() -> None:
    text = (GATEWAY / "gateway.toml").read_text()
    commented = tomllib.loads("\n".join(re.findall(r"^#\s*([a-z0-9_]+\s*=.*)$", text, re.M)))
    assert set(tomllib.loads(text)) | set(commented) == {o.name for o in OPTIONS} | POLICY_KEYS
    policy_values = {k: v for k, v in (commented | tomllib.loads(text)).items() if k in POLICY_KEYS}
    assert resolve_policy(None, {}, policy_values, "gateway.toml").private_project == ("acme-*",)


def test_compose_k8s_and_systemd_run_real_commands() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((GATEWAY / "compose.yaml").read_text())["services"]
    for service in ("gateway", "edge"):
        args = _parse(compose[service]["command"])
        assert args.command == ("gateway" if service == "gateway" else "serve")
    assert not any("tufproxy-gateway" in v for v in compose["edge"]["volumes"]), "the edge must not see the gateway's keys"
    docs = list(yaml.safe_load_all((GATEWAY / "k8s" / "gateway.yaml").read_text()))
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert _parse(container["args"]).gateway_command == "serve"
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert set(tomllib.loads(cm["data"]["gateway.toml"])) <= {o.name for o in OPTIONS}
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((GATEWAY / "systemd" / "tufproxy-gateway.service").read_text())
    argv = shlex.split(unit["Service"]["ExecStart"])[1:]
    assert _parse(argv).gateway_command == "serve"
    assert unit["Service"]["ProtectSystem"] == "strict"


def test_dashboard_queries_only_exported_metrics() -> None:
    exported = {f.name + s for f in GatewayMetrics().registry.collect() for s in _SUFFIXES.get(f.type, ("",))}
    text = (ROOT / "dashboards" / "tufproxy-gateway.json").read_text()
    exprs = re.findall(r'"(?:expr|definition)": "((?:[^"\\]|\\.)*)"', text)
    referenced = {n for e in exprs for n in _NAME.findall(e)}
    assert {"tufproxy_gateway_pages_fetched_total", "tufproxy_gateway_publishes_total",
            "tufproxy_gateway_publish_duration_seconds_bucket", "tufproxy_gateway_pins_refused_total"} <= referenced
    assert referenced <= exported, referenced - exported
    json.loads(text)


def test_gateway_guide_commands_parse() -> None:
    section = (ROOT / "docs" / "guides" / "gateway.md").read_text()
    lines = re.sub(r"\\\n\s*", " ", section).splitlines()
    commands = [line.split("#")[0].strip() for line in lines if line.startswith("tufproxy ")]
    assert any(c.startswith("tufproxy gateway serve") for c in commands)
    for command in commands:
        _parse(shlex.split(command)[1:])


def test_the_replica_overlay_and_units_run_real_commands() -> None:
    """deploy/gateway/k8s-ha and the replica unit: two replicas on one bucket, each with the lease, one process."""
    yaml = pytest.importorskip("yaml")
    docs = list(yaml.safe_load_all((GATEWAY / "k8s-ha" / "replicas.yaml").read_text()))
    (stateful,) = [d for d in docs if d["kind"] == "StatefulSet"]
    assert stateful["spec"]["replicas"] == 2
    (container,) = stateful["spec"]["template"]["spec"]["containers"]
    args = _parse([a.replace("$(POD_NAME)", "tufproxy-gateway-0") for a in container["args"]])
    assert args.gateway_command == "serve" and args.workers == "1" and args.replica_url  # type: ignore[attr-defined]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    settings = tomllib.loads(cm["data"]["gateway.toml"])
    assert set(settings) <= {o.name for o in OPTIONS} and settings["leader_lease"] > 0 and settings["store"]
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "Service"} == {"tufproxy-gateway",
                                                                               "tufproxy-gateway-replicas"}
    # The overlay runs the bucket too, and the replicas' endpoint names its Service.
    kustomization = yaml.safe_load((GATEWAY / "k8s-ha" / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["replicas.yaml", "bucket.yaml"]
    bucket_docs = list(yaml.safe_load_all((GATEWAY / "k8s-ha" / "bucket.yaml").read_text()))
    (store,) = [d for d in bucket_docs if d["kind"] == "StatefulSet"]
    (service,) = [d for d in bucket_docs if d["kind"] == "Service"]
    pods = store["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pods.items()
    assert settings["s3_endpoint_url"] == f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    assert "-s3" in store["spec"]["template"]["spec"]["containers"][0]["args"]
    gateway_selectors = [d["spec"]["selector"] for d in docs if d["kind"] == "Service"]
    assert not any(sel.items() <= pods.items() for sel in gateway_selectors)  # the gateways' Services miss it
    # The compose file: two replicas on the bucket, an edge that knows both.
    compose = yaml.safe_load((GATEWAY / "compose-ha.yaml").read_text())["services"]
    urls = []
    for name in ("gateway-a", "gateway-b"):
        replica = _parse(compose[name]["command"])
        assert replica.gateway_command == "serve" and replica.workers == "1"  # type: ignore[attr-defined]
        assert replica.leader_lease and replica.store and replica.s3_endpoint_url == "http://bucket:8333"  # type: ignore[attr-defined]
        urls.append(replica.replica_url)  # type: ignore[attr-defined]
        assert set(compose[name]["environment"]) <= {o.env for o in OPTIONS} | {"TUFPROXY_AUDIT_LOG"}
    assert urls == ["http://gateway-a:8081/", "http://gateway-b:8081/"]
    edge = _parse(compose["edge"]["command"])
    assert edge.command == "serve" and edge.gateway_url == urls and edge.upstream == urls  # type: ignore[attr-defined]
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((GATEWAY / "systemd" / "tufproxy-gateway-replica.service").read_text())
    argv = shlex.split(unit["Service"]["ExecStart"].replace("${REPLICA_URL}", "http://gw-a.internal:8081/"))[1:]
    parsed = _parse(argv)
    assert parsed.gateway_command == "serve" and parsed.workers == "1"  # type: ignore[attr-defined]
    assert unit["Service"]["EnvironmentFile"] == "/etc/tufproxy/replica.env"
    assert unit["Service"]["ProtectSystem"] == "strict"
