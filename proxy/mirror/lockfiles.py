"""Lock files as a mirror selection: exactly the files they lock, with the hashes they expect.

Reads PEP 751 ``pylock.toml`` (``[[packages]]`` with ``wheels`` and
``sdist``, each with ``hashes``), ``uv.lock`` (``[[package]]`` with
``wheels`` and ``sdist``, each with ``hash = "sha256:…"``) and pip's
hash-checking ``requirements.txt`` (``name==V --hash=sha256:…``, read by
:func:`~proxy.mirror.select.read_requirements`).  The result is a :class:`~proxy.mirror.select.Wanted` per
project carrying :class:`Locked` entries; :func:`check_locked` then decides,
against the project's signed page, which files to take and what disagrees
(a hash differing from the signed one, a file the repository does not sign).
No I/O but reading the file given; no network.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from proxy.mirror.select import Locked, SelectionError, Wanted, merge, read_filename, read_requirements
from proxy.protocol.index import DistFile
from proxy.protocol.layout import is_valid_project_name

__all__ = ["check_locked", "read_lock"]

_HASH = re.compile(r"sha256:([0-9a-fA-F]{64})")


def read_lock(path: Path) -> list[Wanted]:
    """The projects and files ``path`` locks; :class:`SelectionError` for a file that is no lock we read."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SelectionError(f"{path}: not text: {e}") from None
    if path.name.endswith(".toml") or path.suffix == ".lock":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise SelectionError(f"{path}: not TOML: {e}") from None
        if "packages" in data:
            locked = list(_pylock(data, str(path)))
        elif "package" in data:
            locked = list(_uv_lock(data, str(path)))
        else:
            raise SelectionError(f"{path}: neither a pylock.toml ([[packages]]) nor a uv.lock ([[package]])")
    else:
        wanted = read_requirements(path)
        unlocked = [w.project for w in wanted if not w.locked]
        if unlocked:
            raise SelectionError(f"{path}: {unlocked[0]} is not pinned with == and --hash=sha256:... "
                                 "(--requirements takes unpinned requirements)")
        return merge(wanted)
    by_project: dict[str, list[Locked]] = {}
    for project, entry in locked:
        by_project.setdefault(project, []).append(entry)
    return [Wanted(p, SpecifierSet(), tuple(entries)) for p, entries in by_project.items()]


def _project(name: Any, source: str) -> str:
    if not isinstance(name, str) or not is_valid_project_name(name):
        raise SelectionError(f"{source}: not a project name: {name!r}")
    return canonicalize_name(name)


def _filename(entry: Mapping[str, Any], source: str) -> str:
    name = entry.get("name") or unquote(urlsplit(str(entry.get("url") or entry.get("path") or "")).path).rsplit("/", 1)[-1]
    if not name or read_filename(name)[0] is None:
        raise SelectionError(f"{source}: an entry names no distribution file: {dict(entry)!r:.200}")
    return name


def _files(package: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    wheels = package.get("wheels") or []
    sdist = package.get("sdist")
    return [w for w in wheels if isinstance(w, Mapping)] + ([sdist] if isinstance(sdist, Mapping) else [])


def _pylock(data: Mapping[str, Any], source: str) -> Iterable[tuple[str, Locked]]:
    """PEP 751: ``hashes = {sha256 = "…"}`` on each wheel and the sdist."""
    for package in data["packages"]:
        project = _project(package.get("name"), source)
        for entry in _files(package):
            digest = (entry.get("hashes") or {}).get("sha256")
            if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
                raise SelectionError(f"{source}: {project}: {_filename(entry, source)} has no sha256 hash")
            yield project, Locked(source, frozenset({digest.lower()}), _filename(entry, source))


def _uv_lock(data: Mapping[str, Any], source: str) -> Iterable[tuple[str, Locked]]:
    """uv.lock: ``hash = "sha256:…"`` on each wheel and the sdist; the project's own (editable, virtual) is skipped."""
    for package in data["package"]:
        if not (package.get("source") or {}).get("registry"):
            continue
        project = _project(package.get("name"), source)
        for entry in _files(package):
            m = _HASH.fullmatch(str(entry.get("hash", "")))
            if m is None:
                raise SelectionError(f"{source}: {project}: {_filename(entry, source)} has no sha256 hash")
            yield project, Locked(source, frozenset({m.group(1).lower()}), _filename(entry, source))


def check_locked(project: str, locked: Iterable[Locked], files: Iterable[DistFile]) -> tuple[list[DistFile], list[str]]:
    """The signed page's files the lock selects, and one message per disagreement (empty: all agree).

    A locked file name must be on the signed page with the locked sha256; a hashed requirement must match at
    least one signed file of its version (pip's hash-checking mode installs only such a file).
    """
    by_name = {f.filename: f for f in files}
    kept: dict[str, DistFile] = {}
    problems = []
    for entry in locked:
        if entry.filename is not None:
            signed = by_name.get(entry.filename)
            if signed is None:
                problems.append(f"{entry.filename}: locked in {entry.source}, but the repository does not sign it")
            elif signed.hashes.get("sha256", "").lower() not in entry.sha256:
                problems.append(f"{entry.filename}: {entry.source} locks sha256 {min(entry.sha256)}, the signed page "
                                f"says {signed.hashes.get('sha256')}")
            else:
                kept[signed.filename] = signed
            continue
        of_version = [f for f in by_name.values() if str(read_filename(f.filename)[0]) == str(entry.version)]
        matching = [f for f in of_version if f.hashes.get("sha256", "").lower() in entry.sha256]
        if matching:
            kept.update((f.filename, f) for f in matching)
        elif of_version:
            problems.append(f"{project}=={entry.version}: no signed file has a hash {entry.source} allows (signed: "
                            + ", ".join(f"{f.filename} sha256={f.hashes.get('sha256')}" for f in of_version[:3]) + ")")
        else:
            problems.append(f"{project}=={entry.version}: locked in {entry.source}, but the repository signs no file "
                            "of that version")
    return list(kept.values()), problems
