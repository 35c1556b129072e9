"""Bad input to the command line: one line on stderr, exit status 2, never a traceback.

Every invocation runs as a real ``python -m proxy`` subprocess, as a user
would type it.  Also here: ``tufproxy demo`` reruns in place, and every
command logs in the one format of :mod:`proxy.util.logs`.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from proxy.repository import Repository
from tests.conftest import SampleRepo
from tests.support.proxyproc import ProxyProcess
from tests.support.tree import signed_timestamp
from tests.support.upstream import Upstream

ROOT = Path(__file__).resolve().parents[1]
UNREACHABLE = "http://127.0.0.1:9/"
# The one error prefix: the full (sub)command, then "error:".
ERROR_LINE = re.compile(r"tufproxy( [a-z]+)*: error: \S.*")
# The one log format, whichever command logs.
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} level=[A-Z]+ logger=proxy[.\w]* request_id=\S+ \S.*")


def _env(**extra: str) -> dict[str, str]:
    """This environment without settings of ours, plus ``extra``; ``-m proxy`` imports this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUFPROXY_")}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def tufproxy(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", *argv], cwd=cwd, env=_env(**env), capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _files(tmp: Path) -> None:
    (tmp / "bad-workers.toml").write_text('workers = "two"\n')
    (tmp / "unknown-key.toml").write_text('upstream = "http://127.0.0.1:9/"\nwrokers = 2\n')
    (tmp / "broken.toml").write_text("workers = \n")
    (tmp / "not-a-root.json").write_text("{}")
    (tmp / "a.txt").write_text("lib\n-r b.txt\n")
    (tmp / "b.txt").write_text("--requirement a.txt\n")


# (id, argv with {tmp}, {port} and {root} (a valid root), what the one line must say); "env-" cases set
# TUFPROXY_READ_TIMEOUT.
CASES: list[tuple[str, list[str], str]] = [
    ("serve-without-root", ["serve", "--upstream", UNREACHABLE], "--root is required"),
    ("serve-root-missing", ["serve", "--upstream", UNREACHABLE, "--root", "{tmp}/absent.json", "--workers", "2",
                            "--cache-dir", "{tmp}/c1"], "cannot read the pinned root"),
    ("serve-root-invalid-2-workers", ["serve", "--upstream", UNREACHABLE, "--root", "{tmp}/not-a-root.json",
                                      "--workers", "2", "--cache-dir", "{tmp}/c2"], "not a valid self-signed root"),
    ("serve-root-invalid-1-worker", ["serve", "--upstream", UNREACHABLE, "--root", "{tmp}/not-a-root.json",
                                     "--workers", "1", "--cache-dir", "{tmp}/c3"], "not a valid self-signed root"),
    ("audit-accepted-maybe", ["serve", "--upstream", UNREACHABLE, "--root", "r.json", "--audit-accepted", "maybe"],
     "--audit-accepted: wants yes or no, not 'maybe'"),
    ("listen-bogus", ["serve", "--upstream", UNREACHABLE, "--root", "r.json", "--listen", "bogus"],
     "--listen: wants HOST:PORT, not 'bogus'"),
    ("env-bogus", ["serve", "--upstream", UNREACHABLE, "--root", "r.json"], "TUFPROXY_READ_TIMEOUT: wants a number"),
    ("toml-bad-value", ["serve", "--config", "{tmp}/bad-workers.toml", "--upstream", UNREACHABLE, "--root", "r.json"],
     "{tmp}/bad-workers.toml: workers: wants a whole number from 1 to 256, not 'two'"),
    ("toml-unknown-key", ["serve", "--config", "{tmp}/unknown-key.toml", "--root", "r.json"],
     "unknown settings in {tmp}/unknown-key.toml: wrokers"),
    ("toml-syntax", ["serve", "--config", "{tmp}/broken.toml"], "cannot read config file {tmp}/broken.toml"),
    ("serve-busy-port", ["serve", "--upstream", UNREACHABLE, "--root", "{tmp}/not-a-root.json", "--workers", "2",
                         "--listen", "127.0.0.1:{port}"], "cannot listen on 127.0.0.1:{port}"),
    # One process: the port is bound before the initial refresh, whose failure would log a warning first.
    ("serve-busy-port-unreachable-upstream", ["serve", "--upstream", UNREACHABLE, "--root", "{root}", "--workers",
                                              "1", "--cache-dir", "{tmp}/c4", "--listen", "127.0.0.1:{port}"],
     "cannot listen on 127.0.0.1:{port}"),
    ("audit-missing-log", ["audit", "/nonexistent.log"], "cannot read the audit log /nonexistent.log"),
    ("mirror-upstream-not-url", ["mirror", "sync", "--upstream", "htp:/bad", "--root", "r.json", "--dest", "{tmp}/m",
                                 "--project", "lib"], "--upstream must be an http(s) URL or an existing directory"),
    ("mirror-upstream-no-dir", ["mirror", "sync", "--upstream", "{tmp}/absent", "--root", "r.json", "--dest",
                                "{tmp}/m", "--project", "lib"], "--upstream must be an http(s) URL or an existing"),
    ("mirror-requirements-missing", ["mirror", "sync", "--upstream", UNREACHABLE, "--root", "r.json", "--dest",
                                     "{tmp}/m", "--requirements", "{tmp}/absent.txt"], "cannot read requirements file"),
    ("mirror-requirements-cycle", ["mirror", "sync", "--upstream", UNREACHABLE, "--root", "r.json", "--dest",
                                   "{tmp}/m", "--requirements", "{tmp}/a.txt"], "requirements files include each other"),
    ("mirror-root-missing", ["mirror", "sync", "--upstream", UNREACHABLE, "--root", "{tmp}/absent.json", "--dest",
                             "{tmp}/m", "--project", "lib"], "cannot read the pinned root"),
    ("mirror-verify-no-tree", ["mirror", "verify", "{tmp}/absent"], "give --root"),
    ("usage-bad-int", ["mirror", "sync", "--jobs", "many"], "argument --jobs: invalid int value"),
    ("usage-unknown-command", ["frobnicate"], "invalid choice"),
    ("repo-not-a-repo", ["repo", "status", "{tmp}/absent"], "is not a repository"),
    ("cache-not-a-cache", ["cache", "verify", "{tmp}/absent"], "not a tufproxy cache"),
    ("demo-listen-bogus", ["demo", "--dir", "{tmp}/demo", "--listen", "bogus"], "--listen: wants HOST:PORT, not 'bogus'"),
    ("demo-dists-missing", ["demo", "--dir", "{tmp}/demo", "--dists", "{tmp}/absent", "--listen", "127.0.0.1:0"],
     "{tmp}/absent"),
    ("demo-busy-port", ["demo", "--dir", "{tmp}/demo", "--listen", "127.0.0.1:{port}"], "cannot listen on 127.0.0.1:{port}"),
]


@pytest.fixture(scope="module")
def valid_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = Repository.init(tmp_path_factory.mktemp("root") / "repo", bins=4)
    return repo.metadata_dir / "1.root.json"


@pytest.mark.slow
@pytest.mark.parametrize("name,argv,says", CASES, ids=[c[0] for c in CASES])
def test_a_bad_invocation_is_one_line_and_exit_2(name: str, argv: list[str], says: str, tmp_path: Path,
                                                 busy_port: int, valid_root: Path) -> None:
    _files(tmp_path)

    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp_path)).replace("{port}", str(busy_port)).replace("{root}", str(valid_root))

    env = {"TUFPROXY_READ_TIMEOUT": "soon"} if name.startswith("env-") else {}
    done = tufproxy([fill(a) for a in argv], tmp_path, **env)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert ERROR_LINE.fullmatch(lines[0]) and fill(says) in lines[0], lines[0]
    assert lines[0].count("--listen") <= 1


def _demo_until_ready(cwd: Path) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """Start ``tufproxy demo``, wait (bounded) until it says it serves, stop it with Ctrl-C."""
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "demo", "--listen", "127.0.0.1:0"], cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        for line in proc.stdout:  # ends at EOF if the demo exits early
            out.append(line.rstrip("\n"))
            if line.startswith("Ctrl-C stops both.") or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out + rest.splitlines(), subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


@pytest.mark.slow
def test_demo_reruns_in_place(tmp_path: Path) -> None:
    first, done = _demo_until_ready(tmp_path)
    assert done.returncode == 0 and "Ctrl-C stops both." in first, (first, done.stderr)
    assert "signed 5 new file(s), 0 already there" in first
    again, done = _demo_until_ready(tmp_path)
    assert done.returncode == 0 and "Ctrl-C stops both." in again, (again, done.stderr)
    assert "reusing signed repository tufproxy-demo/repo" in again
    assert "signed 0 new file(s), 5 already there" in again
    assert done.stderr == ""


@pytest.mark.slow
def test_every_command_logs_in_one_format(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    # serve: the server's own warning about an unpinned root.
    with ProxyProcess(tmp_path / "cache", "--repository", str(sample_repo.repo.public_dir), "--workers", "1") as proxy:
        pass
    serve_lines = [line for line in proxy.log().splitlines() if "level=" in line]
    assert any("trusting the root in the served tree itself" in line for line in serve_lines), proxy.log()
    # mirror sync: the trust core's warning about expired metadata, then the command's one error line.
    upstream.replace("/metadata/timestamp.json", signed_timestamp(sample_repo.repo, expires_delta=-timedelta(days=3)))
    done = tufproxy(["mirror", "sync", "--upstream", upstream.url, "--root",
                     str(sample_repo.repo.metadata_dir / "1.root.json"), "--dest", str(tmp_path / "m"),
                     "--project", "lib"], tmp_path)
    assert done.returncode == 2
    *logged, error = done.stderr.splitlines()
    assert logged and ERROR_LINE.fullmatch(error) and "expired" in error
    for line in [*serve_lines, *logged]:
        assert LOG_LINE.fullmatch(line), line

