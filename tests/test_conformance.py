"""The public TUF client conformance suite (tuf-conformance) against ``tufproxy client``.

The suite lives in ``shared/tuf-conformance`` beside the repository (read
only; the nearest such folder above the repository root).  It pins its own tuf for its repository simulator, so it runs in a
virtual environment of its own, built once and kept in ``.conformance-env/``
(rebuilt when the suite's pyproject changes); the client under test is this
interpreter's ``python -m proxy client``.  Any failure, error or skip fails
the test; the suite's summary is printed either way.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# ../shared/tuf-conformance from the repository root (from a git worktree, a folder further up).
SUITE = next((d / "shared" / "tuf-conformance" for d in REPO.parents if (d / "shared" / "tuf-conformance").is_dir()),
             REPO.parent / "shared" / "tuf-conformance")
SUITE_ENV = REPO / ".conformance-env"
_INSTALL_TIMEOUT = 600
_SUITE_TIMEOUT = 2400


def _suite_python() -> Path:
    """The suite's own interpreter, with the suite installed (non-editable: shared/ is read-only)."""
    stamp = hashlib.sha256((SUITE / "pyproject.toml").read_bytes()).hexdigest()
    python = SUITE_ENV / "bin" / "python"
    if python.exists() and (SUITE_ENV / ".stamp").exists() and (SUITE_ENV / ".stamp").read_text() == stamp:
        return python
    building = SUITE_ENV.with_name(f"{SUITE_ENV.name}.{os.getpid()}.tmp")
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", building], check=True, timeout=_INSTALL_TIMEOUT)
    subprocess.run([building / "bin" / "python", "-m", "pip", "install", "-q", SUITE],
                   check=True, timeout=_INSTALL_TIMEOUT)
    (building / ".stamp").write_text(stamp)
    shutil.rmtree(SUITE_ENV, ignore_errors=True)
    # Built aside and renamed when complete (only ``bin/python -m`` is used, which survives the move).
    os.replace(building, SUITE_ENV)
    return python


@pytest.mark.slow
@pytest.mark.timeout(_SUITE_TIMEOUT + 2 * _INSTALL_TIMEOUT)
def test_tuf_conformance_suite_passes_completely(tmp_path: Path) -> None:
    if not (SUITE / "tuf_conformance").is_dir():
        pytest.fail(f"the TUF conformance suite is missing: expected a copy of tuf-conformance at {SUITE} "
                    "(the shared/ folder beside the repository)")
    if shutil.which("faketime") is None:
        pytest.fail("faketime is not on PATH: the conformance suite needs it (.ci/run installs it with apt-get)")
    python = _suite_python()
    client = tmp_path / "tufproxy-client"
    client.write_text(f'#!/bin/sh\nPYTHONPATH={shlex.quote(str(REPO))} exec {shlex.quote(sys.executable)} '
                      '-m proxy client "$@"\n')
    client.chmod(0o755)
    started = time.monotonic()
    done = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", "tuf_conformance", "--entrypoint", client],
        cwd=SUITE, capture_output=True, text=True, timeout=_SUITE_TIMEOUT,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else "(no output)"
    print(f"tuf-conformance against tufproxy client: {summary} (wall {time.monotonic() - started:.0f} s)")
    problems = [line for line in lines if re.match(r"(FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", line)]
    assert done.returncode == 0 and not problems, "\n".join([*problems, summary, done.stderr[-4000:]])
    assert re.fullmatch(r"=* ?\d+ passed in [^,]*", summary), summary
