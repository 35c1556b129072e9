"""README's recipes, run as written: the organisation's, the air-gapped site's and the security team's.

Each ``<!-- recipe: NAME -->`` block is read from README.md and run line by
line in a shell whose PATH starts with this venv's ``bin/`` (so ``tufproxy``,
``pip`` and ``uv`` are the ones the test extra installed), with the
placeholders a reader replaces (hosts, ports, directories, the public
index) swapped for temporary ones on 127.0.0.1; a line ending in ``&`` is a
server, waited for on its port.  The index is a local one holding the
demo's dependency chain.  pip and uv install into temporary targets.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.repository.sample import build_wheel
from tests.support.clients import clean_env, uv_path
from tests.support.net import free_port
from tests.support.poll import wait_for
from tests.support.testindex import TestIndex

ROOT = Path(__file__).resolve().parents[1]
_RECIPE = re.compile(r"<!-- recipe: ([\w-]+) -->\n```sh\n(.*?)```", re.DOTALL)


def recipes() -> dict[str, list[str]]:
    return {name: body.strip().splitlines() for name, body in _RECIPE.findall((ROOT / "README.md").read_text())}


class World:
    """The temporary stand-ins for what a reader's recipe names, and the servers it started."""

    def __init__(self, tmp: Path, index: TestIndex) -> None:
        self.tmp, self.index = tmp, index
        self.ports = {8080: free_port(), 8081: free_port(), 8090: free_port()}
        self.servers: list[subprocess.Popen[bytes]] = []
        self.installs = 0
        bindir = Path(sys.executable).parent
        uv = uv_path()
        extra = f"{Path(uv).parent}{os.pathsep}" if uv else ""
        self.env = {**clean_env(), "PATH": f"{bindir}{os.pathsep}{extra}{os.environ['PATH']}"}

    def substitute(self, line: str) -> str:
        for host in ("edge.internal", "gateway.internal", "mirror.internal", "0.0.0.0"):
            for port, real in self.ports.items():
                line = line.replace(f"{host}:{port}", f"127.0.0.1:{real}")
        line = (line.replace("https://index.example/simple/", self.index.url)
                .replace("https://files.index.example/", self.index.files_url))
        for path in ("/srv/gateway", "/var/cache/tufproxy", "/var/log/tufproxy", "/media/usb/mirror"):
            line = line.replace(path, str(self.tmp / path.strip("/").replace("/", "-")))
        if re.match(r"(uv )?pip install ", line):
            self.installs += 1
            target = self.tmp / f"target{self.installs}"
            python = f" --python {shlex.quote(sys.executable)}" if line.startswith("uv ") else ""
            line = line.replace("pip install ", f"pip install --target {target}{python} ", 1)
            if not line.startswith("uv "):
                line = f"pip --no-cache-dir --disable-pip-version-check {line.removeprefix('pip ')}"
        return line

    def run(self, line: str) -> str:
        command = self.substitute(line)
        if command.endswith("&"):
            command = command.removesuffix("&").strip()
            log = open(self.tmp / f"server{len(self.servers)}.log", "wb")  # noqa: SIM115 - the server's life
            server = subprocess.Popen(command, shell=True, cwd=self.tmp, env=self.env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
            self.servers.append(server)
            port = int(re.search(r"--listen 127\.0\.0\.1:(\d+)", command).group(1))  # type: ignore[union-attr]
            wait_for(lambda: server.poll() is not None or _answers(port), f"{line[:40]} to listen", timeout=30)
            assert server.poll() is None, (self.tmp / f"server{len(self.servers) - 1}.log").read_text()
            return ""
        done = subprocess.run(command, shell=True, cwd=self.tmp, env=self.env, capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, f"{line}\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}"
        return done.stdout

    def stop(self) -> None:
        for server in self.servers:
            os.killpg(server.pid, 15)
            server.wait(timeout=30)


def _answers(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    index = TestIndex(separate_files_host=True)
    dists = tmp_path / "dists"
    for name, version, requires in (("demo-app", "1.0", ["demo-lib>=1.0"]), ("demo-lib", "1.0", ["demo-base"]),
                                    ("demo-lib", "1.1", ["demo-base"]), ("demo-base", "2.0", [])):
        index.add(build_wheel(dists, name, version, requires=requires))
    with index:
        w = World(tmp_path, index)
        try:
            yield w
        finally:
            w.stop()


def _installed(target: Path) -> set[str]:
    return {p.name.split("-")[0] for p in target.glob("*.dist-info")}


@pytest.mark.slow
def test_the_recipes_run_as_written(world: World) -> None:
    found = recipes()
    assert set(found) == {"organisation", "air-gapped", "security-team"}
    for line in found["organisation"]:
        world.run(line)
    assert _installed(world.tmp / "target1") == _installed(world.tmp / "target2") == {"demo_app", "demo_lib",
                                                                                      "demo_base"}
    for line in found["air-gapped"]:
        world.run(line)
    assert _installed(world.tmp / "target3") == {"demo_app", "demo_lib", "demo_base"}
    out = [world.run(line) for line in found["security-team"]]
    assert "refused" in out[0] and "demo-lib" in out[2] and "revoked" in out[2]
