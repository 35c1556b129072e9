"""``tufproxy gateway up``: one command, a gateway and an edge, pip and uv through them, Ctrl-C stops both."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.repository.sample import build_wheel
from tests.support.clients import clean_env, install
from tests.support.net import free_port
from tests.support.testindex import TestIndex


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_gateway_up_initialises_serves_and_stops(tmp_path: Path) -> None:
    with TestIndex(separate_files_host=True) as index:
        for name, version, requires in (("up-app", "1.0", ["up-lib"]), ("up-lib", "1.0", [])):
            index.add(build_wheel(tmp_path / "dists", name, version, requires=requires))
        edge, gateway = free_port(), free_port()
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "gateway", "up", str(tmp_path / "gw"),
                                 "--index-url", index.url, "--files-origin", index.files_url,
                                 "--listen", f"127.0.0.1:{edge}", "--gateway-listen", f"127.0.0.1:{gateway}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
        try:
            assert proc.stdout is not None
            lines = []
            for line in proc.stdout:  # the command prints these once both are ready
                lines.append(line)
                if line.startswith("Ctrl-C"):
                    break
            out = "".join(lines)
            assert f"initialised {tmp_path / 'gw'}" in out, (out, proc.stderr and proc.stderr.read())
            assert f"pip install --index-url http://127.0.0.1:{edge}/simple/ PROJECT" in out
            assert f"export UV_DEFAULT_INDEX=http://127.0.0.1:{edge}/simple/" in out
            for client in ("pip", "uv"):
                done = install(client, f"http://127.0.0.1:{edge}/simple/", tmp_path / client, "up-app")
                assert done.returncode == 0, done.stderr
                assert {p.name.split("-")[0] for p in (tmp_path / client).glob("*.dist-info")} == {"up_app", "up_lib"}
        finally:
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 0
        assert not _port_open(edge) and not _port_open(gateway)


@pytest.mark.slow
def test_gateway_up_names_a_child_that_cannot_start(tmp_path: Path) -> None:
    busy = free_port()
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", busy))
        holder.listen()
        done = subprocess.run([sys.executable, "-m", "proxy", "gateway", "up", str(tmp_path / "gw"),
                               "--index-url", "http://127.0.0.1:9/simple/", "--gateway-listen", f"127.0.0.1:{busy}",
                               "--listen", f"127.0.0.1:{free_port()}"],
                              capture_output=True, text=True, timeout=120, env=clean_env())
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == ("tufproxy gateway up: error: the gateway exited at start "
                                                    "(status 2); see its log above")
