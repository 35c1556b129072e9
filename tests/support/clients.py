"""Run the real clients users run — pip and uv — against a proxy, isolated.

Isolated means: no user or site config (the machine's pip.conf points at
local wheel stores), no cache, a fresh target directory, and no index but
the one under test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        UV_NO_CONFIG="1",
        UV_NO_CACHE="1",
        UV_OFFLINE="0",
        NO_COLOR="1",
    )
    return env


def pip(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m pip ARGS`` with no config and no cache."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "--no-cache-dir", "--isolated", "--disable-pip-version-check", *args],
        capture_output=True, text=True, timeout=timeout, env=clean_env(),
    )


def uv_path() -> str | None:
    """uv as the test extra installed it: beside this Python even when its bin/ is not on PATH
    (README runs the tests as ``.venv/bin/python -m pytest``); else whatever PATH has."""
    with contextlib.suppress(ImportError, FileNotFoundError):
        from uv import find_uv_bin

        return find_uv_bin()
    return shutil.which("uv")


def uv(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``uv ARGS`` with no config and no cache."""
    exe = uv_path()
    assert exe is not None
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, env=clean_env())


def install(client: str, index_url: str, target: Path, *requirements: str,
            pip_args: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """Install ``requirements`` into ``target`` with ``client`` ('pip' or 'uv'); ``pip_args`` go to pip only."""
    if client == "pip":
        return pip("install", *pip_args, "--index-url", index_url, "--target", str(target), *requirements)
    return uv("pip", "install", "--python", sys.executable, "--index-url", index_url,
              "--target", str(target), *requirements)


def http_status(url: str, timeout: float = 30) -> int:
    """The status a GET of ``url`` gets (an error status is an answer here, not an exception)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code
