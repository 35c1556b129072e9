"""The gateway's own state, lost, damaged, truncated or restored (issue 27).

Real ``tufproxy gateway`` processes on 127.0.0.1 over a local index that
changes its answers between requests; edges are real ``tufproxy serve``
processes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.gatewayproc import gateway_init


def gateway_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", "gateway", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def fresh_gateway(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An initialised gateway directory; tests copy it."""
    directory = tmp_path_factory.mktemp("fresh") / "gw"
    gateway_init(directory)
    return directory


@pytest.mark.parametrize("name, damage", [("timestamp.json", b""), ("timestamp.json", b"junk\n"),
                                          ("root.json", b'{"signed": 7}'), ("1.bin-3.json", b"junk\n")])
def test_a_damaged_metadata_file_at_start_up_is_named_in_one_line(tmp_path: Path, fresh_gateway: Path, name: str,
                                                                  damage: bytes) -> None:
    shutil.copytree(fresh_gateway, tmp_path / "gw")
    path = tmp_path / "gw" / "public" / "metadata" / name
    path.write_bytes(damage)
    r = gateway_cli("serve", str(tmp_path / "gw"), "--index-url", "http://127.0.0.1:9/simple/", "--listen", "127.0.0.1:0")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(path) in lines[0] and "damaged" in lines[0] and "internal" not in lines[0], lines[0]
