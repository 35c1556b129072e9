"""A requirement set's dependency closure, decided by pip's own resolver against a verified index.

``mirror sync --resolve`` hands the requirement lines it was given
(extras and markers kept) to ``pip install --dry-run --report``, once for
each ``--python-version`` × ``--platform`` asked for, with ``--index-url``
a temporary edge that verifies every page and file it serves against the
upstream's signed metadata.  The projects and versions pip's reports
install become :class:`~proxy.mirror.select.Wanted` entries.  Nothing here
resolves anything itself: a hand-written resolver would disagree with
the installers the mirror is for.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from proxy.mirror.select import SelectionError, Wanted, merge
from proxy.protocol.layout import is_valid_project_name

__all__ = ["pip_argv", "read_report", "resolve"]

# pip fetches metadata (and builds sdists' metadata) for every candidate it tries.
TIMEOUT = 900.0
MAX_REPORT = 64 << 20
MAX_ERROR = 400


def pip_argv(index_url: str, requirements: Sequence[str], report: Path, python_version: str | None = None,
             platform: str | None = None, abis: Sequence[str] = ()) -> list[str]:
    """The pip command that resolves ``requirements`` against ``index_url`` and writes its report to ``report``."""
    argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--isolated",
            "--no-input", "--disable-pip-version-check", "--no-cache-dir", "--index-url", index_url,
            "--report", str(report)]
    if python_version is not None:
        argv += ["--python-version", python_version]
    if platform is not None:
        argv += ["--platform", platform]
    for abi in abis:
        argv += ["--abi", abi]
    if python_version is not None or platform is not None or abis:
        # pip resolves for another interpreter only from wheels: it cannot run another one's sdist builds.
        argv += ["--only-binary", ":all:"]
    return [*argv, *requirements]  # parsed requirements: none starts with "-"


def read_report(data: bytes, source: str) -> dict[str, Version]:
    """Project -> version of each distribution a pip installation report (``--report``) installs."""
    try:
        report: Any = json.loads(data)
        items = report["install"]
    except (ValueError, KeyError, TypeError) as e:
        raise SelectionError(f"{source}: not a pip installation report ({e})") from None
    picked: dict[str, Version] = {}
    for item in items if isinstance(items, list) else ():
        metadata = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(metadata, dict):
            raise SelectionError(f"{source}: an installed item without metadata")
        name = metadata.get("name")
        if not isinstance(name, str) or not is_valid_project_name(name):
            raise SelectionError(f"{source}: an installed item without a project name")
        try:
            picked[canonicalize_name(name)] = Version(str(metadata.get("version")))
        except InvalidVersion:
            raise SelectionError(f"{source}: {name}: not a version: {metadata.get('version')!r}") from None
    return picked


def _run(argv: list[str], report: Path) -> dict[str, Version]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
                              check=False)
    except subprocess.TimeoutExpired:
        raise SelectionError(f"pip did not resolve within {TIMEOUT:.0f} s") from None
    except OSError as e:
        raise SelectionError(f"cannot run pip ({e.strerror}): --resolve needs pip in tufproxy's Python") from None
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR")] or lines[-1:] or [f"exit status {done.returncode}"]
        if "No module named pip" in done.stderr:
            errors = ["--resolve needs pip in tufproxy's Python (python -m pip)"]
        raise SelectionError("pip could not resolve the requirements: " + " ".join(errors)[:MAX_ERROR])
    with open(report, "rb") as f:
        return read_report(f.read(MAX_REPORT + 1)[:MAX_REPORT], "pip's report")


def resolve(index_url: str, requirements: Sequence[str], python_versions: Sequence[str] = (),
            platforms: Sequence[str] = (), abis: Sequence[str] = ()) -> list[Wanted]:
    """The closure of ``requirements`` over every Python × platform asked for (none: tufproxy's own), each
    dependency at the versions pip chose; :class:`SelectionError` when pip cannot resolve them."""
    wanted = []
    with tempfile.TemporaryDirectory(prefix="tufproxy-resolve-") as work:
        report = Path(work) / "report.json"
        pythons: Sequence[str | None] = python_versions or [None]
        targets: Sequence[str | None] = platforms or [None]
        for python, platform in itertools.product(pythons, targets):
            for project, version in _run(pip_argv(index_url, requirements, report, python, platform, abis),
                                         report).items():
                wanted.append(Wanted(project, versions=frozenset([version])))
    return merge(wanted)
