"""Which projects and which of their files a mirror sync takes.

Decisions, with no I/O but reading requirements files: project names (from
``--project``, a requirements file and its ``-r`` includes, or the root
list), per-project version specifiers, and the file filters (versions,
wheel platform/ABI/Python tags, sdists, yanked).
File names are read with ``packaging`` (the PyPA reference for PEP 427
wheel names and PEP 440 versions); a name it cannot read is not taken.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from proxy.protocol.errors import Fault
from proxy.protocol.index import DistFile
from proxy.protocol.layout import is_valid_project_name


class SelectionError(ValueError):
    """A project name, requirement or filter the user gave is unusable."""

    reason = "bad-selection"
    fault = Fault.OPERATOR


@dataclass(frozen=True)
class Locked:
    """One locked file (``filename``), or any file of ``version`` whose sha256 is one of ``sha256``
    (:mod:`proxy.mirror.lockfiles` reads them and checks them against the signed page)."""

    source: str  # the lock or requirements file, for messages
    sha256: frozenset[str]
    filename: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class Wanted:
    """One project to mirror, with the versions asked for (empty: all), or exactly the files ``locked``.

    ``requirements``: the requirement lines it came from, extras and markers kept, for a resolver to
    follow; ``versions``: the versions a resolver chose for a dependency nobody named (empty: any
    ``spec`` allows).
    """

    project: str  # normalised
    spec: SpecifierSet = field(default_factory=SpecifierSet)
    locked: tuple[Locked, ...] = ()
    requirements: tuple[str, ...] = ()
    versions: frozenset[Version] = frozenset()


_PINNED = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*===?\s*([^\s;\\]+)")
_HASH_OPTION = re.compile(r"--hash[=\s]+sha256:([0-9a-fA-F]{64})")


def parse_hashed(line: str, source: str) -> Wanted | None:
    """A hash-checking requirement line (``name==V --hash=sha256:…``) as a locked selection; None without --hash.

    pip installs only a file whose hash is listed, so the sync takes only those, and fails when none matches.
    """
    hashes = frozenset(h.lower() for h in _HASH_OPTION.findall(line))
    if not hashes:
        return None
    m = _PINNED.match(line)
    if m is None:
        raise SelectionError(f"{source}: {line[:120]!r}: a requirement with --hash must be pinned with ==")
    if not is_valid_project_name(m.group(1)):
        raise SelectionError(f"{source}: not a project name: {m.group(1)!r}")
    return Wanted(canonicalize_name(m.group(1)), locked=(Locked(source, hashes, version=m.group(2)),))


def parse_requirement(text: str) -> Wanted:
    """``name`` or ``name>=1,<2`` (extras and markers are ignored: we mirror files, not installs)."""
    try:
        req = Requirement(text.strip())
    except InvalidRequirement as e:
        raise SelectionError(f"not a requirement: {text.strip()!r} ({e})") from None
    if req.url:
        raise SelectionError(f"{text.strip()!r}: direct URL requirements cannot be mirrored")
    if not is_valid_project_name(req.name):
        raise SelectionError(f"not a project name: {req.name!r}")
    return Wanted(canonicalize_name(req.name), req.specifier, requirements=(str(req),))


# Nested ``-r`` includes deeper than this are a mistake (or a trap), not a requirements set.
MAX_INCLUDE_DEPTH = 16
_INCLUDE = re.compile(r"(?:-r\s*|--requirement(?:\s*=\s*|\s+))(\S+)")


def read_requirements(path: Path, _including: tuple[Path, ...] = ()) -> list[Wanted]:
    """The requirements of a requirements file and of the files it includes.

    ``-r FILE`` / ``--requirement FILE`` lines are followed, relative to the
    including file as pip does; comments, blanks and other pip options
    (constraints, index options) are skipped; a line with ``--hash`` locks files
    (:func:`parse_hashed`), as pip's hash-checking mode does.  An include cycle
    or nesting deeper than :data:`MAX_INCLUDE_DEPTH` is a
    :class:`SelectionError`; an unreadable file an ``OSError``.
    """
    here = path.resolve()
    if here in _including:
        chain = " -> ".join(str(p) for p in (*_including, here))
        raise SelectionError(f"requirements files include each other: {chain}")
    if len(_including) >= MAX_INCLUDE_DEPTH:
        raise SelectionError(f"requirements includes nested deeper than {MAX_INCLUDE_DEPTH} at {path}")
    wanted = []
    with open(path, encoding="utf-8") as f:
        for raw in f.read().replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*$", "", raw).strip()
            include = _INCLUDE.fullmatch(line)
            if include:
                wanted += read_requirements(path.parent / include.group(1), (*_including, here))
                continue
            if not line or line.startswith("-"):
                continue
            hashed = parse_hashed(line, str(path))
            if hashed is not None:
                wanted.append(hashed)
                continue
            # "name[extra]>=1.0 ; marker" and other pip options after the requirement.
            line = line.split(" --", 1)[0].rstrip(" \\")
            wanted.append(parse_requirement(line))
    return wanted


def merge(wanted: Iterable[Wanted]) -> list[Wanted]:
    """One entry per project; specifiers of repeated projects are combined (all must hold), locked files and
    requirement lines joined, resolved versions joined (or dropped when an entry takes any version)."""
    merged: dict[str, Wanted] = {}
    for w in wanted:
        seen = merged.get(w.project)
        merged[w.project] = w if seen is None else Wanted(
            w.project, seen.spec & w.spec, seen.locked + w.locked, seen.requirements + w.requirements,
            seen.versions | w.versions if seen.versions and w.versions else frozenset())
    return list(merged.values())


def parse_spec(text: str | None) -> SpecifierSet:
    try:
        return SpecifierSet(text or "")
    except InvalidSpecifier:
        raise SelectionError(f"not a version specifier: {text!r} (try '>=1.0,<2')") from None


def _python(version: str) -> tuple[int, int]:
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        raise SelectionError(f"--python-version wants X.Y, not {version!r}") from None
    return major, minor


def _runs_on(tag: Tag, major: int, minor: int) -> bool:
    """True when a wheel tag's interpreter part can run on CPython ``major.minor``."""
    if tag.interpreter in (f"py{major}", f"py{major}{minor}", f"cp{major}{minor}"):
        return True
    # abi3 wheels built for cp3X run on every later CPython 3.
    built = tag.interpreter[3:]
    return (
        tag.abi == "abi3"
        and tag.interpreter.startswith(f"cp{major}")
        and built.isdigit()
        and int(built) <= minor
    )


@dataclass(frozen=True)
class FileFilter:
    """Decides, file by file, what a sync takes of a project's page."""

    spec: SpecifierSet = field(default_factory=SpecifierSet)
    platforms: frozenset[str] = frozenset()
    abis: frozenset[str] = frozenset()
    python_versions: tuple[str, ...] = ()
    sdists: bool = True
    yanked: bool = True

    @classmethod
    def of(
        cls,
        spec: str | None = None,
        platforms: Sequence[str] = (),
        abis: Sequence[str] = (),
        python_versions: Sequence[str] = (),
        sdists: bool = True,
        yanked: bool = True,
    ) -> FileFilter:
        """A filter from command-line values; raises :class:`SelectionError` for bad ones."""
        for v in python_versions:
            _python(v)
        return cls(parse_spec(spec), frozenset(platforms), frozenset(abis), tuple(python_versions), sdists, yanked)

    def keeps(self, dist: DistFile, wanted: Wanted) -> bool:
        """True when ``dist`` is a file this sync mirrors for ``wanted``."""
        if dist.yanked and not self.yanked:
            return False
        version, tags = read_filename(dist.filename)
        if version is None:
            return False
        if wanted.versions and version not in wanted.versions:
            return False
        spec = self.spec & wanted.spec
        # Pre-releases are mirrored unless a specifier rules them out (pip decides at install time).
        if spec and not spec.contains(version, prereleases=True):
            return False
        if tags is None:
            return self.sdists
        if self.python_versions and dist.requires_python:
            try:
                requires = SpecifierSet(dist.requires_python)
            except InvalidSpecifier:
                return False
            if not any(requires.contains(v, prereleases=True) for v in self.python_versions):
                return False
        return any(self._tag_ok(t) for t in tags)

    def _tag_ok(self, tag: Tag) -> bool:
        if self.platforms and tag.platform != "any" and tag.platform not in self.platforms:
            return False
        if self.abis and tag.abi not in ("none", "abi3") and tag.abi not in self.abis:
            return False
        return not self.python_versions or any(_runs_on(tag, *_python(v)) for v in self.python_versions)


def read_filename(filename: str) -> tuple[Version | None, frozenset[Tag] | None]:
    """(version, wheel tags) of a file name; tags None for an sdist, version None if unreadable."""
    try:
        if filename.endswith(".whl"):
            _, version, _, tags = parse_wheel_filename(filename)
            return version, tags
        if filename.endswith((".tar.gz", ".zip")):
            return parse_sdist_filename(filename)[1], None
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        pass
    return None, None
