"""``tufproxy gateway serve`` as a real subprocess on 127.0.0.1, the miss protocol's client side, and an edge for it."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.proxyproc import ProxyProcess


def gateway_init(directory: Path, *args: str) -> None:
    """``tufproxy gateway init DIR`` with few bins (fast), or fail the test.

    Run in this process: it is a fixture here, and a subprocess would spend
    most of its second importing the gateway (``gateway init`` itself runs
    as a subprocess in tests/test_keys.py and test_gateway.py's CLI errors).
    """
    from proxy.cli import build_parser

    parsed = build_parser("gateway").parse_args(["gateway", "init", str(directory), "--bins", "16", *args])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        assert parsed.func(parsed) == 0, err.getvalue()


def metric(base: str, name: str) -> float:
    """The value of the first sample of ``name`` (labels may be part of it) at ``base``/metrics; 0 if absent."""
    text = urllib.request.urlopen(f"{base}metrics", timeout=10).read().decode()
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


class GatewayProcess(ProxyProcess):
    """Start with :meth:`start`; ``base`` is the URL edges use as ``--upstream``."""

    def __init__(self, directory: Path, *args: str) -> None:
        super().__init__(directory, *args)
        self.directory = directory
        self.log_path = directory.parent / f"gateway-{self.port}.log"
        self.audit_path = directory.parent / f"gateway-{self.port}.audit"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "proxy", "gateway", "serve", str(self.directory), "--listen", f"127.0.0.1:{self.port}",
                "--audit-log", str(self.audit_path), *self.args]

    @property
    def root(self) -> Path:
        return self.directory / "public" / "metadata" / "1.root.json"

    def publish(self, project: str, timeout: float = 30) -> tuple[int, dict]:  # type: ignore[type-arg]
        """POST the miss protocol's request; (status, JSON answer)."""
        req = urllib.request.Request(f"{self.base}_tufproxy/publish/{project}", method="POST", data=b"")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def listed(self) -> set[str]:
        """The projects the gateway's root page lists (rendered from its signed bins; asking publishes nothing)."""
        req = urllib.request.Request(f"{self.base}simple/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return {p["name"] for p in json.loads(r.read())["projects"]}

    def audit(self) -> list[dict]:  # type: ignore[type-arg]
        if not self.audit_path.exists():
            return []
        return [json.loads(line) for line in self.audit_path.read_text().splitlines() if line.strip()]

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self._log.close()
        self.proc = None


def edge_for(tmp_path: Path, gw: GatewayProcess, name: str = "edge") -> ProxyProcess:
    """An edge (``tufproxy serve --profile gateway``) pinned to ``gw``'s root, refreshing often."""
    return ProxyProcess(tmp_path / name, "--profile", "gateway", "--upstream", gw.base, "--root", str(gw.root),
                        "--workers", "1", "--refresh-interval", "0.5")


def install_chain_first_try(tmp_path: Path, gw: GatewayProcess, client: str) -> None:
    """``client`` installs app -> lib -> base through an edge (``serve --workers 2``) in front of ``gw``,
    nothing published before: the miss protocol publishes each project, pip and uv never retry."""
    from tests.support.clients import install

    edge = ProxyProcess(tmp_path / "edge", "--profile", "gateway", "--upstream", gw.base, "--root", str(gw.root),
                        "--workers", "2", "--refresh-interval", "3600")
    with edge:
        r = install(client, edge.url, tmp_path / "target", "app")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "503" not in r.stdout + r.stderr and "Retry" not in r.stdout + r.stderr
    assert metric(gw.base, "tufproxy_gateway_published_projects_total") == 3  # summed over the gateway's workers
    assert {p.name for p in (tmp_path / "target").iterdir()} >= {"app", "lib", "base"}
