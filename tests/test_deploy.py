"""The deployment files under deploy/ and dashboards/ agree with the code.

Every YAML and JSON file parses; the Kubernetes objects, compose file,
Dockerfile and systemd units name settings, subcommands, paths and ports
that exist; the dashboard queries only metrics that ``proxy.util.metrics``
defines.  Nothing here needs docker, kubectl or a cluster.
"""

from __future__ import annotations

import argparse
import configparser
import json
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import pytest

from proxy.cli import build_parser
from proxy.serving.config import OPTIONS, ServeConfig, parse_listen, resolve
from proxy.util.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DASHBOARDS = ROOT / "dashboards"
YAML_FILES = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))
JSON_FILES = sorted([*DEPLOY.rglob("*.json"), *DASHBOARDS.rglob("*.json")])
SETTING_NAMES = {o.name for o in OPTIONS}
# ``# key = value`` lines of an example config: settings left at their default.
_COMMENTED_SETTING = re.compile(r"^#\s*([a-z0-9_]+\s*=.*)$", re.MULTILINE)
# PromQL: a name right before a label matcher or a range is a metric selector.
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*[{\[]")
_TUFPROXY_NAME = re.compile(r"\btufproxy_[A-Za-z0-9_:]*")
_SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("_count", "_sum", "_created"),
}


@pytest.fixture(scope="module")
def yaml() -> ModuleType:
    # PyYAML is not (yet) a declared test dependency.
    return pytest.importorskip("yaml")


def _k8s_objects(yaml: ModuleType) -> dict[str, dict[str, Any]]:
    objects: dict[str, dict[str, Any]] = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["kind"] not in objects, f"two {doc['kind']} objects; the checks below assume one"
            objects[doc["kind"]] = doc
    return objects


def _parse_command(argv: list[str]) -> argparse.Namespace:
    """Parse a ``tufproxy`` command line as the real CLI would, or fail the test."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if argv and argv[0] not in sub.choices:
        pytest.skip(f"`tufproxy {argv[0]}` is not registered in proxy.cli yet")
    try:
        return parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"the CLI rejects: tufproxy {shlex.join(argv)}")


def _tufproxy_argv(command_line: str) -> list[str]:
    argv = shlex.split(command_line)
    assert PurePosixPath(argv[0]).name == "tufproxy", command_line
    return argv[1:]


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    lines = (line.strip() for line in text.splitlines())
    return [(w[0].upper(), w[1].strip()) for line in lines if line and not line.startswith("#")
            for w in [line.split(None, 1)]]


def _dockerfile_arg(instructions: list[tuple[str, str]], name: str) -> str:
    values = [v for k, v in instructions if k == name]
    assert len(values) == 1, f"want exactly one {name} in deploy/Dockerfile, found {len(values)}"
    return values[0]


def _unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string((DEPLOY / "systemd" / name).read_text())
    return unit


def _exported_metric_names() -> set[str]:
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.update(family.name + s for s in _SAMPLE_SUFFIXES.get(family.type, ("",)))
    return names


def _queries(node: Any) -> list[str]:
    """Every PromQL string of a dashboard: panel targets and variable queries."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                found.append(value)
            else:
                found.extend(_queries(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_queries(item))
    return found


def _dashboard() -> dict[str, Any]:
    return json.loads((DASHBOARDS / "tufproxy.json").read_text())


# -- every file parses ---------------------------------------------------


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path: Path, yaml: ModuleType) -> None:
    docs = list(yaml.safe_load_all(path.read_text()))
    assert docs and all(isinstance(d, dict) for d in docs)


@pytest.mark.parametrize("path", JSON_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_json_parses(path: Path) -> None:
    assert isinstance(json.loads(path.read_text()), dict)


def test_files_were_found() -> None:
    assert len(YAML_FILES) >= 10 and (DASHBOARDS / "tufproxy.json") in JSON_FILES


# -- settings ------------------------------------------------------------


def _toml_examples(yaml: ModuleType) -> dict[str, str]:
    cm = _k8s_objects(yaml)["ConfigMap"]
    return {"deploy/tufproxy.toml": (DEPLOY / "tufproxy.toml").read_text(),
            "deploy/k8s/configmap.yaml": cm["data"]["tufproxy.toml"]}


def test_toml_examples_use_real_settings_and_resolve(yaml: ModuleType, tmp_path: Path) -> None:
    for where, text in _toml_examples(yaml).items():
        unknown = set(tomllib.loads(text)) - SETTING_NAMES
        assert not unknown, f"{where}: not settings of tufproxy serve: {unknown}"
        config_file = tmp_path / "tufproxy.toml"
        config_file.write_text(text)
        config = resolve(_parse_command(["serve", "--config", str(config_file)]), environ={})
        assert config.upstream and config.root == Path("/etc/tufproxy/root.json"), where


def test_example_config_documents_every_setting() -> None:
    text = (DEPLOY / "tufproxy.toml").read_text()
    commented = tomllib.loads("\n".join(_COMMENTED_SETTING.findall(text)))
    documented = set(tomllib.loads(text)) | set(commented)
    assert documented == SETTING_NAMES


# -- Kubernetes ------------------------------------------------------------


def test_k8s_pod_is_probed_and_locked_down(yaml: ModuleType) -> None:
    pod = _k8s_objects(yaml)["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


def _cpus(quantity: str | int | float) -> float:
    """A Kubernetes CPU quantity ("2", "500m") in CPUs."""
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _workers_match_cpu_request(container: dict[str, Any], toml_text: str, tmp_path: Path) -> ServeConfig:
    """The pod runs as many workers as CPUs it requests (``--workers``' default would be the node's CPUs)."""
    config_file = tmp_path / "tufproxy.toml"
    config_file.write_text(toml_text)
    args = _parse_command(container["args"])
    assert args.workers is not None or "workers" in tomllib.loads(toml_text), "--workers must be set explicitly"
    args.config = config_file
    config = resolve(args, environ={})
    assert config.workers == max(1, int(_cpus(container["resources"]["requests"]["cpu"])))
    return config


def test_k8s_base_deployment_runs_one_worker_per_requested_cpu(yaml: ModuleType, tmp_path: Path) -> None:
    objects = _k8s_objects(yaml)
    (container,) = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    _workers_match_cpu_request(container, objects["ConfigMap"]["data"]["tufproxy.toml"], tmp_path)


def test_k8s_mounts_match_the_config(yaml: ModuleType) -> None:
    objects = _k8s_objects(yaml)
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    settings = tomllib.loads(objects["ConfigMap"]["data"]["tufproxy.toml"])

    assert settings["cache_dir"] in mounts, f"nothing mounted at cache_dir {settings['cache_dir']}"
    cache = mounts[settings["cache_dir"]]
    assert cache["persistentVolumeClaim"]["claimName"] == objects["PersistentVolumeClaim"]["metadata"]["name"]

    args = _parse_command(container["args"])
    for wanted in (args.config, Path(settings["root"])):
        assert str(wanted.parent) in mounts, f"{wanted} is not in a mounted volume"
        source = mounts[str(wanted.parent)]["configMap"]
        assert source["name"] == objects["ConfigMap"]["metadata"]["name"]
        (item,) = [i for i in source["items"] if i["path"] == wanted.name]
        assert item["key"] in objects["ConfigMap"]["data"]

    (port,) = container["ports"]
    assert port["containerPort"] == parse_listen(settings["listen"])[1]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] in (port["name"], port["containerPort"])


def test_k8s_service_and_monitor_reach_the_pod(yaml: ModuleType) -> None:
    objects = _k8s_objects(yaml)
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    service = objects["Service"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    port_names = {p["name"] for c in objects["Deployment"]["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    monitor = objects["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    assert {e["path"] for e in monitor["endpoints"]} == {"/metrics"}


def test_kustomization_lists_every_manifest(yaml: ModuleType) -> None:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    manifests = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == manifests


# The replicated forms are kustomize overlays of deploy/k8s (siblings: kustomize
# refuses an overlay inside its base).
REPLICATED = ("k8s-statefulset", "k8s-shared-cache", "k8s-bucket")


def _kustomize(overlay: str, yaml: ModuleType) -> dict[str, list[dict[str, Any]]]:
    """The objects ``kubectl kustomize`` renders for an overlay, by kind."""
    import shutil
    import subprocess

    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: cannot render the kustomize overlays")
    done = subprocess.run(["kubectl", "kustomize", str(DEPLOY / overlay)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    objects: dict[str, list[dict[str, Any]]] = {}
    for doc in yaml.safe_load_all(done.stdout):
        objects.setdefault(doc["kind"], []).append(doc)
    return objects


@pytest.mark.parametrize("overlay", REPLICATED)
def test_k8s_replicated_forms_hold_together(overlay: str, yaml: ModuleType, tmp_path: Path) -> None:
    from proxy.serving.serve import DRAIN_SECONDS

    objects = _kustomize(overlay, yaml)
    (workload,) = objects.get("StatefulSet", []) + objects.get("Deployment", [])
    pod = workload["spec"]["template"]["spec"]
    labels = workload["spec"]["template"]["metadata"]["labels"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True

    # the workers the pod runs are the CPUs it asks for, and the drain fits the grace period
    (cm,) = objects["ConfigMap"]
    config = _workers_match_cpu_request(container, cm["data"]["tufproxy.toml"], tmp_path)
    assert config.workers >= 2
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    assert pod["terminationGracePeriodSeconds"] > DRAIN_SECONDS + 5 + pre_stop

    # the cache: one volume per replica, or one ReadWriteMany volume for all
    (cache,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(config.cache_dir)]
    if workload["kind"] == "StatefulSet":
        (template,) = [t for t in workload["spec"]["volumeClaimTemplates"] if t["metadata"]["name"] == cache["name"]]
        assert template["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert "PersistentVolumeClaim" not in objects
        assert any(s["metadata"]["name"] == workload["spec"]["serviceName"] for s in objects["Service"])
    else:
        (claim,) = objects["PersistentVolumeClaim"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == cache["name"]]
        assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
        assert workload["spec"]["strategy"]["type"] == "RollingUpdate"

    if overlay == "k8s-bucket":
        # the bucket form: the store from the environment, resolved by the same table as the flags
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        with_env = resolve(_parse_command(["serve", "--config", str(tmp_path / "tufproxy.toml")]),
                           environ={k: v for k, v in env.items() if k.startswith("TUFPROXY_")})
        assert with_env.store is not None and with_env.store.startswith("s3://")
        assert [s["secretRef"]["name"] for s in container["envFrom"]] == ["tufproxy-s3"]

    (hpa,) = objects["HorizontalPodAutoscaler"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (workload["kind"], workload["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2
    (pdb,) = objects["PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for service in objects["Service"]:
        assert service["spec"]["selector"].items() <= labels.items()


# -- compose, Prometheus, Grafana ------------------------------------------


def test_compose_wires_prometheus_and_grafana(yaml: ModuleType) -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    assert compose["tufproxy"]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert compose["tufproxy"]["read_only"] is True

    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (target,) = [t for job in prometheus["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    host, port = target.rsplit(":", 1)
    assert host in compose
    assert int(port) == parse_listen(tomllib.loads((DEPLOY / "tufproxy.toml").read_text())["listen"])[1]

    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/tufproxy.yaml").read_text())
    (dashboards_path,) = [p["options"]["path"] for p in provider["providers"]]
    assert f"../dashboards:{dashboards_path}:ro" in compose["grafana"]["volumes"]
    datasources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert [d["type"] for d in datasources["datasources"]] == ["prometheus"]


# -- Dockerfile ------------------------------------------------------------


def test_dockerfile_runs_a_real_command_as_non_root() -> None:
    docker = _dockerfile()
    assert _dockerfile_arg(docker, "FROM").startswith("python:3.11-slim")
    assert _dockerfile_arg(docker, "USER").split(":")[0] not in ("root", "0")
    argv = json.loads(_dockerfile_arg(docker, "ENTRYPOINT")) + json.loads(_dockerfile_arg(docker, "CMD"))
    args = _parse_command(_tufproxy_argv(shlex.join(argv)))
    assert args.command == "serve"
    # the --config the image runs with is the example config it copies in
    assert f"deploy/tufproxy.toml {args.config}" in [v for k, v in docker if k == "COPY"]

    settings = tomllib.loads((DEPLOY / "tufproxy.toml").read_text())
    assert json.loads(_dockerfile_arg(docker, "VOLUME")) == [settings["cache_dir"]]
    port = parse_listen(settings["listen"])[1]
    assert _dockerfile_arg(docker, "EXPOSE") == str(port)
    assert f"127.0.0.1:{port}/healthz" in _dockerfile_arg(docker, "HEALTHCHECK")


# -- systemd ---------------------------------------------------------------


def test_systemd_units_run_real_commands_hardened() -> None:
    proxy = _unit("tufproxy.service")["Service"]
    assert _parse_command(_tufproxy_argv(proxy["ExecStart"])).command == "serve"
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
        assert proxy[key] == "yes", key
    assert proxy["ProtectSystem"] == "strict"
    assert proxy["DynamicUser"] == "yes" or proxy.get("User") == "tufproxy"
    settings = tomllib.loads((DEPLOY / "tufproxy.toml").read_text())
    assert settings["cache_dir"] == f"/var/cache/{proxy['CacheDirectory']}"

    refresh = _unit("tufproxy-repo-refresh.service")["Service"]
    args = _parse_command(_tufproxy_argv(refresh["ExecStart"]))
    assert (args.command, refresh["Type"]) == ("repo", "oneshot")
    assert refresh["ProtectSystem"] == "strict" and refresh["NoNewPrivileges"] == "yes"

    timer = _unit("tufproxy-repo-refresh.timer")["Timer"]
    assert timer["OnCalendar"] == "hourly"
    assert timer["Unit"] == "tufproxy-repo-refresh.service"


def test_readme_commands_parse() -> None:
    text = (DEPLOY / "README.md").read_text()
    commands = re.findall(r"`(tufproxy [^`]+)`", text)
    commands += re.findall(r"^(tufproxy .+?)\s*(?:#.*)?$", text, re.MULTILINE)
    assert commands
    for command in commands:
        _parse_command(_tufproxy_argv(command))


# -- dashboard -------------------------------------------------------------


def test_dashboard_queries_only_exported_metrics() -> None:
    queries = _queries(_dashboard())
    referenced = {n for q in queries for n in _TUFPROXY_NAME.findall(q)}
    referenced |= {n for q in queries for n in _SELECTOR.findall(q)}
    assert referenced, "no metric found in the dashboard's queries"
    assert referenced <= _exported_metric_names(), referenced - _exported_metric_names()


def test_dashboard_panels_use_the_datasource_variable() -> None:
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert dashboard["schemaVersion"] >= 36
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert _TUFPROXY_NAME.search(target["expr"]), panel["title"]
