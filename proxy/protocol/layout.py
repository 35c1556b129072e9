"""Where things live in a tufproxy repository: target paths and URLs.

One module owns the mapping between what a pip client asks for (request
paths under ``/simple/`` and ``/packages/``), the TUF target path that
vouches for it, and the file name a consistent-snapshot repository serves
it under.  The signer (``proxy.repository``) and the proxy both use it, so
the two can never disagree.

Target paths (PEP 458 leaves the exact strings open; see docs/guides/repository.md, "Layout"):

=================================  ==========================================
``simple/index.html``              root project list, PEP 503 HTML
``simple/index.json``              root project list, PEP 691 JSON
``simple/<project>/index.html``    project page, PEP 503 HTML
``simple/<project>/index.json``    project page, PEP 691 JSON
``packages/<project>/<file>``      a distribution file (wheel or sdist)
``packages/<project>/<file>.metadata``  PEP 658 core metadata of a wheel
=================================  ==========================================

``<project>`` is the PEP 503 normalised name (``packaging.utils.canonicalize_name``).  The served tree puts
metadata under ``metadata/`` and targets at the root, each target also
under ``<hash>.<basename>`` for every hash it is listed with (consistent
snapshots, TUF spec 5.7.3) so a CDN can cache it forever.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import Enum
from urllib.parse import unquote

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

from proxy.protocol.errors import Fault

METADATA_DIR = "metadata"
# A synced mirror's own state (never served) and the manifest in it that records the sync's profile.
MIRROR_STATE_DIR = ".mirror"
MIRROR_MANIFEST = "manifest.json"
ROOT_INDEX_HTML = "simple/index.html"
PROVENANCE_SUFFIX = ".provenance"
ROOT_INDEX_JSON = "simple/index.json"

# PEP 508 names: ASCII letters and digits, with . _ - inside.
_VALID_NAME_RE = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
# Distribution file names we accept as one path segment: no separators,
# no leading dot, nothing a shell or URL would reinterpret.
_VALID_FILENAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+!-]*$")
MAX_NAME_LENGTH = 200
MAX_FILENAME_LENGTH = 255
MAX_REQUEST_PATH = 1024
# A gateway's answer to a publish, with the metadata and page bodies it carries (a snapshot of 16,384 bins is 534 KB).
MAX_PUBLISH_ANSWER = 8 << 20


class PageFormat(str, Enum):
    """The two renderings of an index page."""

    HTML = "html"
    JSON = "json"


class TargetKind(str, Enum):
    """What a request path names."""

    ROOT_INDEX = "root-index"
    PROJECT_INDEX = "project-index"
    FILE = "file"
    CORE_METADATA = "core-metadata"
    PROVENANCE = "provenance"  # a file's PEP 740 provenance object, a signed target beside its page


def is_valid_project_name(name: str) -> bool:
    """True when ``name`` is a PEP 508 project name of sane length."""
    return len(name) <= MAX_NAME_LENGTH and bool(_VALID_NAME_RE.match(name))


def is_valid_filename(filename: str) -> bool:
    """True when ``filename`` is safe as one path segment of a target path."""
    return (
        len(filename) <= MAX_FILENAME_LENGTH
        and ".." not in filename
        and bool(_VALID_FILENAME_RE.match(filename))
    )


def project_page_target(project: str, fmt: PageFormat) -> str:
    """Target path of a project's index page in the given rendering."""
    return f"simple/{canonicalize_name(project)}/index.{fmt.value}"


def root_page_target(fmt: PageFormat) -> str:
    """Target path of the root project list in the given rendering."""
    return ROOT_INDEX_HTML if fmt is PageFormat.HTML else ROOT_INDEX_JSON


def file_target(project: str, filename: str) -> str:
    """Target path of a distribution file."""
    return f"packages/{canonicalize_name(project)}/{filename}"


def core_metadata_target(project: str, filename: str) -> str:
    """Target path of the PEP 658 ``.metadata`` file of a distribution."""
    return f"{file_target(project, filename)}.metadata"


def page_file_href(project: str, filename: str) -> str:
    """The href a project page (``/simple/<project>/``) uses for one of its files.

    Relative, so the page works unchanged behind any host, port or path
    prefix: served by a static HTTP server or by the proxy.
    """
    return f"../../{file_target(project, filename)}"


def consistent_name(target_path: str, digest: str) -> str:
    """``dir/HASH.basename``: where a consistent snapshot serves a target."""
    dirname, sep, basename = target_path.rpartition("/")
    return f"{dirname}{sep}{digest}.{basename}"


def provenance_target(project: str, filename: str) -> str:
    """The target path of ``filename``'s PEP 740 provenance object (the gateway signs it beside the page)."""
    return f"simple/{project}/{filename}{PROVENANCE_SUFFIX}"


def provenance_of(target_path: str) -> tuple[str, str] | None:
    """(project, filename) if ``target_path`` is a :func:`provenance_target`, else None."""
    directory, _, base = target_path.rpartition("/")
    head, _, project = directory.partition("/")
    if head != "simple" or not project or "/" in project or not base.endswith(PROVENANCE_SUFFIX):
        return None
    return project, base[: -len(PROVENANCE_SUFFIX)]


def metadata_filename(role: str, version: int | None) -> str:
    """``VERSION.ROLE.json`` (or ``ROLE.json`` for timestamp and probes)."""
    return f"{role}.json" if version is None else f"{version}.{role}.json"


@dataclass(frozen=True)
class TargetRequest:
    """A client request path resolved to what it asks for."""

    kind: TargetKind
    project: str | None = None  # normalised
    filename: str | None = None
    requested_name: str | None = None  # project name as the client spelt it
    trailing_slash: bool = True  # PEP 503 project URLs end in "/"

    def target_path(self, fmt: PageFormat = PageFormat.HTML) -> str:
        """The TUF target path that vouches for this request."""
        if self.kind is TargetKind.ROOT_INDEX:
            return root_page_target(fmt)
        assert self.project is not None
        if self.kind is TargetKind.PROJECT_INDEX:
            return project_page_target(self.project, fmt)
        assert self.filename is not None
        if self.kind is TargetKind.FILE:
            return file_target(self.project, self.filename)
        if self.kind is TargetKind.PROVENANCE:
            return provenance_target(self.project, self.filename)
        return core_metadata_target(self.project, self.filename)

    @property
    def redirect_to(self) -> str | None:
        """Relative URL of the canonical project page, if this is not it (PEP 503)."""
        if self.requested_name is None or (self.requested_name == self.project and self.trailing_slash):
            return None
        return f"../{self.project}/" if self.trailing_slash else f"{self.project}/"


class BadRequestPath(ValueError):
    """The client's path names nothing a repository can hold."""

    reason = "bad-path"
    fault = Fault.CLIENT


# A pure function of the path, and hot: a warm proxy sees the same paths again and again.
# Only successful parses are cached (lru_cache does not keep exceptions).
@functools.lru_cache(maxsize=4096)
def parse_request_path(path: str) -> TargetRequest:
    """Map a client request path to what it asks for.

    Accepts ``/simple/``, ``/simple/<name>/`` and
    ``/packages/<project>/<file>[.metadata]``.  Anything else, and anything
    hostile (``..``, encoded separators, NUL, over-long names), raises
    :class:`BadRequestPath`; the caller answers 404 or 400.
    """
    if len(path) > MAX_REQUEST_PATH:
        raise BadRequestPath("path too long")
    parts = [unquote(p) for p in path.split("/")]
    for part in parts:
        if part in (".", "..") or any(c in part for c in "/\\\x00"):
            raise BadRequestPath("relative, encoded-separator or NUL segments are not allowed")
    if parts[0] != "":
        raise BadRequestPath("path must be absolute")
    parts = parts[1:]
    if parts == ["simple", ""] or parts == ["simple"]:
        return TargetRequest(TargetKind.ROOT_INDEX)
    if len(parts) in (2, 3) and parts[0] == "simple" and (len(parts) == 2 or parts[2] in ("", "index.html")):
        name = parts[1]
        if not is_valid_project_name(name):
            raise BadRequestPath(f"not a valid project name: {name[:80]!r}")
        return TargetRequest(TargetKind.PROJECT_INDEX, canonicalize_name(name), requested_name=name,
                             trailing_slash=len(parts) == 3)
    if len(parts) == 3 and parts[0] == "packages":
        project, filename = parts[1], parts[2]
        if not is_valid_project_name(project) or canonicalize_name(project) != project:
            raise BadRequestPath(f"not a normalised project name: {project[:80]!r}")
        if not is_valid_filename(filename):
            raise BadRequestPath(f"not a valid file name: {filename[:80]!r}")
        if filename.endswith(".metadata"):
            return TargetRequest(TargetKind.CORE_METADATA, project, filename[: -len(".metadata")])
        if filename.endswith(PROVENANCE_SUFFIX):
            return TargetRequest(TargetKind.PROVENANCE, project, filename[: -len(PROVENANCE_SUFFIX)])
        return TargetRequest(TargetKind.FILE, project, filename)
    raise BadRequestPath("no such route")


SDIST_SUFFIXES = (".tar.gz", ".zip")


def project_and_version(filename: str) -> tuple[str, str] | None:
    """(normalised project, PEP 440 version) a wheel or sdist file name carries, or None."""
    try:
        if filename.endswith(".whl"):
            project, version, _, _ = parse_wheel_filename(filename)
        elif filename.endswith(SDIST_SUFFIXES):
            project, version = parse_sdist_filename(filename)
        else:
            return None
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return project, str(version)


def project_of_filename(filename: str) -> str | None:
    """The normalised project a distribution file name belongs to, or None if it is none."""
    named = project_and_version(filename)
    return None if named is None else named[0]


def version_of_filename(filename: str) -> str | None:
    """The version a distribution file name carries, or None if it is no distribution name."""
    named = project_and_version(filename)
    return None if named is None else named[1]
