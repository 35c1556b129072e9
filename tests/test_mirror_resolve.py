"""``mirror sync --resolve``: a requirements file's dependency closure, extras included, decided by real pip
through a temporary edge in front of a real gateway, for each Python asked for; and the one-line failure when
pip cannot resolve.  The pure halves (pip's command, its report) are tested with plain values."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from packaging.version import Version

from proxy.mirror.resolve import pip_argv, read_report
from proxy.mirror.select import SelectionError
from proxy.repository.sample import build_wheel
from tests.support.gatewayproc import GatewayProcess, gateway_init
from tests.support.testindex import TestIndex
from tests.test_cli_errors import tufproxy


def _synced(dest: Path) -> set[str]:
    """The wheels in a mirror tree, by name (their HASH.FILENAME copies aside)."""
    return {p.name for p in (dest / "packages").rglob("*.whl") if not re.match(r"[0-9a-f]{64}\.", p.name)}


@pytest.mark.slow
def test_requirements_get_their_closure_with_extras_for_each_python(tmp_path: Path) -> None:
    d = tmp_path / "dists"
    with TestIndex() as index:
        index.add(build_wheel(d, "web", "1.0", requires=["core>=1", "socksy; extra == 'socks'"]))
        index.add(build_wheel(d, "core", "1.0", requires=["tiny"]))
        index.add(build_wheel(d, "core", "2.0", requires=["tiny"], requires_python=">=3.12"), requires_python=">=3.12")
        for name in ("tiny", "socksy", "unrelated"):
            index.add(build_wheel(d, name, "1.0"))
        gateway_init(tmp_path / "gw")
        with GatewayProcess(tmp_path / "gw", "--index-url", index.url, "--batch-window", "0.05") as gw:
            (tmp_path / "req.txt").write_text("web[socks]\n")
            base = ["mirror", "sync", "--upstream", gw.base, "--root", str(gw.root), "--requirements",
                    str(tmp_path / "req.txt")]
            done = tufproxy([*base, "--dest", str(tmp_path / "m"), "--python-version", "3.11",
                             "--python-version", "3.12"], tmp_path)
            assert done.returncode == 0, done.stdout + done.stderr
            assert "resolved 1 requirement(s) with pip: 4 more project(s) their dependencies need " \
                   "(core, socksy, tiny, web)" not in done.stderr  # web is the requirement itself
            assert "resolved 1 requirement(s) with pip: 3 more project(s) their dependencies need " \
                   "(core, socksy, tiny)" in done.stderr, done.stderr
            # 3.11 gets core 1.0, 3.12 core 2.0: both are kept; the extra's dependency too; nothing else.
            assert _synced(tmp_path / "m") == {"web-1.0-py3-none-any.whl", "core-1.0-py3-none-any.whl",
                                               "core-2.0-py3-none-any.whl", "tiny-1.0-py3-none-any.whl",
                                               "socksy-1.0-py3-none-any.whl"}
            # Without --resolve, the file's projects only.
            done = tufproxy([*base, "--dest", str(tmp_path / "n"), "--resolve", "no"], tmp_path)
            assert done.returncode == 0 and _synced(tmp_path / "n") == {"web-1.0-py3-none-any.whl"}, done.stderr
            # A requirement pip cannot satisfy: one line, pip's reason, nothing synced.
            (tmp_path / "bad.txt").write_text("web>=9\n")
            done = tufproxy(["mirror", "sync", "--upstream", gw.base, "--root", str(gw.root), "--requirements",
                             str(tmp_path / "bad.txt"), "--dest", str(tmp_path / "b")], tmp_path)
            assert done.returncode == 2, done.stdout + done.stderr
            [line] = done.stderr.strip().splitlines()
            assert "--resolve: pip could not resolve the requirements: ERROR: Could not find a version that " \
                   "satisfies the requirement web>=9" in line, line
            assert not (tmp_path / "b" / "packages").exists()


def test_pip_is_asked_for_wheels_only_when_resolving_for_another_python() -> None:
    here = pip_argv("http://127.0.0.1:1/simple/", ["web[socks]"], Path("r.json"))
    assert here[-1] == "web[socks]" and "--only-binary" not in here and "--dry-run" in here and "--isolated" in here
    there = pip_argv("http://127.0.0.1:1/simple/", ["web"], Path("r.json"), "3.9", "manylinux_2_17_x86_64", ["cp39"])
    assert there[there.index("--python-version") + 1] == "3.9" and there[there.index("--abi") + 1] == "cp39"
    assert there[there.index("--only-binary") + 1] == ":all:"


def test_a_report_is_read_strictly() -> None:
    report = {"version": "1", "install": [{"metadata": {"name": "Web_App", "version": "1.0"}},
                                          {"metadata": {"name": "tiny", "version": "2.0rc1"}}]}
    assert read_report(json.dumps(report).encode(), "r") == {"web-app": Version("1.0"), "tiny": Version("2.0rc1")}
    for bad in (b"not json", b"{}", json.dumps({"install": [{"metadata": {"name": "../x", "version": "1"}}]}).encode(),
                json.dumps({"install": [{"metadata": {"name": "x", "version": "one"}}]}).encode(),
                json.dumps({"install": [{}]}).encode()):
        with pytest.raises(SelectionError):
            read_report(bad, "r")
