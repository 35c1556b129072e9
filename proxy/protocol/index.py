"""The Simple Repository API as data: parse, render and negotiate index pages.

Owns the PEP 503 HTML and PEP 691 JSON forms of project pages and of the
root project list, with the PEP 592 (yanked), 629 (repository version),
658/714 (core metadata) and 700 (size, upload time, versions) additions,
and PEP 691 content negotiation.  No I/O: bytes in, objects out, so the
signer (which renders the pages it signs) and the proxy (which parses
upstream pages and rewrites their links) share one definition.

Upstream pages are hostile input.  Parsers raise :class:`IndexParseError`
for anything malformed (bad UTF-8, wrong JSON types, an unsupported major
API version, too many files) and *skip* file entries whose name is unusable
as a path segment (empty, blank-edged, ``/``, ``\\``, NUL or other control characters,
``..``, over-long) or repeats an earlier entry's name, so one junk link
cannot take a whole project offline.  Renderers escape every string and
are deterministic: the same page always gives the same bytes.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import html
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote, unquote, urljoin, urlsplit

from packaging.utils import canonicalize_name

from proxy.protocol.errors import Fault
from proxy.protocol.layout import MAX_FILENAME_LENGTH

API_VERSION = "1.1"
# PEP 792: a page that carries a project status marker says at least this version.
STATUS_API_VERSION = "1.4"
STATUSES = ("active", "archived", "quarantined", "deprecated")
MAX_STATUS_REASON = 1000
DEFAULT_MAX_FILES = 100_000
# The root list is the one page that is legitimately huge (PyPI lists ~600k).
MAX_PROJECTS = 2_000_000

_API_VERSION_RE = re.compile(r"([0-9]{1,6})\.([0-9]{1,6})")
_HASH_NAME_RE = re.compile(r"[a-z0-9_]{1,32}")
_HASH_VALUE_RE = re.compile(r"[0-9a-f]{1,256}")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_PREFERRED_HASH = "sha256"


class IndexParseError(ValueError):
    """An index page is malformed, hostile, or of an unsupported API version."""

    reason = "bad-page"
    fault = Fault.REPOSITORY


@dataclass(frozen=True)
class DistFile:
    """One distribution file as a project page lists it."""

    filename: str
    url: str  # without fragment; hashes travel in ``hashes``
    hashes: dict[str, str]  # lower-case name -> lower-case hex
    requires_python: str | None = None
    yanked: bool | str = False  # False, True, or the reason (PEP 592)
    core_metadata: bool | dict[str, str] = False  # PEP 658/714
    size: int | None = None  # PEP 700, JSON only
    upload_time: str | None = None  # PEP 700, JSON only, ISO 8601 as given


@dataclass(frozen=True)
class ProjectPage:
    """A project's page: its files, and (PEP 700) its versions."""

    name: str  # normalised
    files: tuple[DistFile, ...]
    versions: tuple[str, ...] = ()
    api_version: str = API_VERSION
    status: str | None = None  # PEP 792 project status, as the page gave it (None: not given, i.e. active)
    status_reason: str | None = None

    def with_status(self, status: str | None, reason: str | None) -> ProjectPage:
        """This page carrying a PEP 792 status marker (api-version raised to 1.4), or none."""
        version = self.api_version
        if status is not None and _version_tuple(version) < _version_tuple(STATUS_API_VERSION):
            version = STATUS_API_VERSION
        return dataclasses.replace(self, status=status, status_reason=reason if status is not None else None,
                                   api_version=version)


@dataclass(frozen=True)
class ProjectList:
    """The root page: every project the index holds."""

    projects: tuple[str, ...]  # names as listed


# ---------------------------------------------------------------- validation


def _is_usable_filename(filename: str) -> bool:
    return (
        0 < len(filename) <= MAX_FILENAME_LENGTH
        and filename == filename.strip()
        and ".." not in filename
        and "/" not in filename
        and "\\" not in filename
        and not _CONTROL_RE.search(filename)
    )


def _hash_entry(name: str, value: str) -> tuple[str, str] | None:
    """A ``(name, hex)`` pair in canonical case, or None if either is junk."""
    name, value = name.lower(), value.lower()
    if _HASH_NAME_RE.fullmatch(name) and _HASH_VALUE_RE.fullmatch(value):
        return name, value
    return None


def _version_tuple(version: str) -> tuple[int, int]:
    match = _API_VERSION_RE.fullmatch(version)
    return (int(match.group(1)), int(match.group(2))) if match else (1, 0)


def _status(status: Any, reason: Any) -> tuple[str | None, str | None]:
    """A PEP 792 marker as a page gives it; an unknown status is kept (a later spec may add one), bounded."""
    if status is None:
        return None, None
    if not isinstance(status, str) or not status or len(status) > 40 or _CONTROL_RE.search(status):
        raise IndexParseError("malformed project-status")
    if reason is not None and not isinstance(reason, str):
        raise IndexParseError("malformed project-status reason")
    return status, _CONTROL_RE.sub(" ", reason[:MAX_STATUS_REASON]) if reason else None


def _check_api_version(version: str) -> str:
    match = _API_VERSION_RE.fullmatch(version)
    if not match:
        raise IndexParseError(f"malformed repository version {version[:40]!r}")
    # PEP 629: a client must refuse a major version it does not know.
    if match.group(1) != "1":
        raise IndexParseError(f"unsupported repository version {version!r}")
    return version


def _decode(data: bytes) -> str:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("index pages are parsed from bytes")
    try:
        return bytes(data).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise IndexParseError(f"page is not UTF-8: {exc.reason} at byte {exc.start}") from None


def _unique_files(candidates: Iterable[DistFile]) -> tuple[DistFile, ...]:
    # First entry wins: a later one of the same name could point elsewhere.
    seen: set[str] = set()
    files = []
    for dist in candidates:
        if _is_usable_filename(dist.filename) and dist.filename not in seen:
            seen.add(dist.filename)
            files.append(dist)
    return tuple(files)


# ---------------------------------------------------------------- HTML parsing


def _parse_fragment_hash(fragment: str) -> dict[str, str]:
    name, sep, value = fragment.partition("=")
    entry = _hash_entry(name, value) if sep else None
    return dict([entry]) if entry else {}


def _parse_core_metadata_attr(value: str | None) -> bool | dict[str, str]:
    """``"true"`` or ``"<hashname>=<hex>"`` (PEP 658); anything else means absent."""
    if value is None:
        return False
    if value.strip().lower() == "true":
        return True
    hashes = _parse_fragment_hash(value.strip())
    return hashes or False


class _AnchorCollector(HTMLParser):
    """Collects ``<a>`` tags with their text, the first ``<base>``, and the version meta."""

    def __init__(self, max_anchors: int) -> None:
        super().__init__(convert_charrefs=True)
        self.max_anchors = max_anchors
        self.anchors: list[tuple[dict[str, str | None], str]] = []
        self.base: str | None = None
        self.api_version: str | None = None
        self.meta: dict[str, str] = {}  # PEP 792's pypi:project-status and pypi:project-status-reason
        self._open: tuple[dict[str, str | None], list[str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes: dict[str, str | None] = {}
        for key, value in attrs:
            attributes.setdefault(key, value)  # first of a repeated attribute wins, as in browsers
        if tag == "a":
            self._close_anchor()
            if len(self.anchors) >= self.max_anchors:
                raise IndexParseError(f"page lists more than {self.max_anchors} links")
            self._open = (attributes, [])
        elif tag == "base" and self.base is None and attributes.get("href"):
            self.base = attributes["href"]
        elif tag == "meta" and attributes.get("name") == "pypi:repository-version" and self.api_version is None:
            self.api_version = attributes.get("content") or ""
        elif tag == "meta" and attributes.get("name") in ("pypi:project-status", "pypi:project-status-reason"):
            self.meta.setdefault(str(attributes["name"]), attributes.get("content") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._close_anchor()

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._open[1].append(data)

    def close(self) -> None:
        super().close()
        self._close_anchor()

    def _close_anchor(self) -> None:
        if self._open is not None:
            attributes, text = self._open
            self.anchors.append((attributes, "".join(text).strip()))
            self._open = None


def _collect(data: bytes, max_anchors: int) -> _AnchorCollector:
    text = _decode(data)
    collector = _AnchorCollector(max_anchors)
    try:
        collector.feed(text)
        collector.close()
    except IndexParseError:
        raise
    except (AssertionError, ValueError, IndexError) as exc:
        # html.parser signals some malformed declarations this way.
        raise IndexParseError(f"unparseable HTML: {exc}") from None
    return collector


def _html_dist_file(attributes: dict[str, str | None], text: str, base: str | None) -> DistFile | None:
    href = attributes.get("href")
    if not href:
        return None
    # partition, not urldefrag: that re-serialises the URL and can alter it.
    url, _, fragment = (urljoin(base, href) if base else href).partition("#")
    # PEP 503: the link text is the file name; fall back to the URL's last segment.
    filename = text or unquote(urlsplit(url).path.rpartition("/")[2])
    core = attributes.get("data-core-metadata", attributes.get("data-dist-info-metadata"))
    yanked_attr = attributes.get("data-yanked", False)
    yanked: bool | str = True if yanked_attr is None or yanked_attr == "" else yanked_attr
    return DistFile(
        filename=filename,
        url=url,
        hashes=_parse_fragment_hash(fragment),
        requires_python=attributes.get("data-requires-python") or None,
        yanked=yanked,
        core_metadata=_parse_core_metadata_attr(core),
    )


def parse_project_html(data: bytes, name: str, *, max_files: int = DEFAULT_MAX_FILES) -> ProjectPage:
    """Parse a PEP 503 project page.  Relative hrefs stay relative (resolved
    against ``<base href>`` when the page has one); the caller resolves them
    against the page URL if it needs absolute ones."""
    collector = _collect(data, max_files)
    version = _check_api_version(collector.api_version) if collector.api_version is not None else "1.0"
    candidates = (_html_dist_file(attrs, text, collector.base) for attrs, text in collector.anchors)
    status, reason = _status(collector.meta.get("pypi:project-status"), collector.meta.get("pypi:project-status-reason"))
    return ProjectPage(
        name=canonicalize_name(name),
        files=_unique_files(d for d in candidates if d is not None),
        api_version=version,
        status=status,
        status_reason=reason,
    )


def parse_project_list_html(data: bytes) -> ProjectList:
    """Parse a PEP 503 root page: the link texts are the project names."""
    collector = _collect(data, MAX_PROJECTS)
    if collector.api_version is not None:
        _check_api_version(collector.api_version)
    return ProjectList(projects=tuple(text for _attrs, text in collector.anchors if text))


# ---------------------------------------------------------------- JSON parsing


def _reject_constant(token: str) -> Any:
    raise IndexParseError(f"JSON constant {token} is not allowed")


def _load_json(data: bytes) -> dict[str, Any]:
    text = _decode(data)
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except IndexParseError:
        raise
    except RecursionError:
        raise IndexParseError("JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and over-long integers
        raise IndexParseError(f"invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise IndexParseError("JSON page is not an object")
    meta = obj.get("meta")
    if not isinstance(meta, dict) or not isinstance(meta.get("api-version"), str):
        raise IndexParseError("JSON page has no meta.api-version")
    _check_api_version(meta["api-version"])
    return obj


def _typed(obj: dict[str, Any], key: str, types: tuple[type, ...], default: Any = None) -> Any:
    value = obj.get(key, default)
    # bool is an int subclass; no field here accepts one where it wants a number.
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise IndexParseError(f"{key!r} has the wrong type ({type(value).__name__})")
    return value


def _json_hashes(value: Any, key: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise IndexParseError(f"{key!r} is not a mapping of strings")
    return dict(entry for entry in (_hash_entry(k, v) for k, v in value.items()) if entry)


def _json_dist_file(entry: Any) -> DistFile:
    if not isinstance(entry, dict):
        raise IndexParseError("a file entry is not an object")
    yanked = _typed(entry, "yanked", (bool, str), False)
    for key in ("core-metadata", "dist-info-metadata", "data-dist-info-metadata"):
        if key in entry:  # PEP 714: the new key wins, legacy ones are a fallback
            core = _typed(entry, key, (bool, dict))
            if isinstance(core, dict):
                core = _json_hashes(core, key) or True
            break
    else:
        core = False
    size = _typed(entry, "size", (int, type(None)))
    if size is not None and size < 0:
        raise IndexParseError("'size' is negative")
    url = _typed(entry, "url", (str,)).partition("#")[0]
    return DistFile(
        filename=_typed(entry, "filename", (str,)),
        url=url,
        hashes=_json_hashes(entry.get("hashes", {}), "hashes"),
        requires_python=_typed(entry, "requires-python", (str, type(None))) or None,
        yanked=True if yanked == "" else yanked,
        core_metadata=core,
        size=size,
        upload_time=_typed(entry, "upload-time", (str, type(None))),
    )


def parse_project_json(data: bytes, name: str, *, max_files: int = DEFAULT_MAX_FILES) -> ProjectPage:
    """Parse a PEP 691 project page; its ``name`` must be the project asked for."""
    obj = _load_json(data)
    listed = _typed(obj, "name", (str,))
    if canonicalize_name(listed) != canonicalize_name(name):
        raise IndexParseError(f"page is for {listed[:80]!r}, not {name[:80]!r}")
    files = _typed(obj, "files", (list,))
    versions = _typed(obj, "versions", (list,), [])
    if len(files) > max_files or len(versions) > max_files:
        raise IndexParseError(f"page lists more than {max_files} files or versions")
    if not all(isinstance(v, str) for v in versions):
        raise IndexParseError("'versions' holds a non-string")
    marker = _typed(obj, "project-status", (dict,), {})
    status, reason = _status(marker.get("status"), marker.get("reason"))
    return ProjectPage(
        name=canonicalize_name(name),
        files=_unique_files(_json_dist_file(entry) for entry in files),
        versions=tuple(versions),
        api_version=obj["meta"]["api-version"],
        status=status,
        status_reason=reason,
    )


def parse_project_list_json(data: bytes) -> ProjectList:
    """Parse a PEP 691 root page."""
    projects = _typed(_load_json(data), "projects", (list,))
    if len(projects) > MAX_PROJECTS:
        raise IndexParseError(f"list holds more than {MAX_PROJECTS} projects")
    names = []
    for entry in projects:
        if not isinstance(entry, dict):
            raise IndexParseError("a project entry is not an object")
        names.append(_typed(entry, "name", (str,)))
    return ProjectList(projects=tuple(n for n in names if n))


# ---------------------------------------------------------------- rendering


def _attr(value: str) -> str:
    return html.escape(value, quote=True)


def _html_hash(hashes: dict[str, str]) -> tuple[str, str] | None:
    """The one hash an HTML link can carry: sha256 if present, else the first by name."""
    if not hashes:
        return None
    name = _PREFERRED_HASH if _PREFERRED_HASH in hashes else min(hashes)
    return name, hashes[name]


def _html_core_metadata(core: bool | dict[str, str]) -> str | None:
    if core is False:
        return None
    chosen = _html_hash(core) if isinstance(core, dict) else None
    return f"{chosen[0]}={chosen[1]}" if chosen else "true"


def _html_link(dist: DistFile) -> str:
    if "#" in dist.url:
        raise ValueError(f"file URL must not carry a fragment: {dist.url[:80]!r}")
    chosen = _html_hash(dist.hashes)
    href = f"{dist.url}#{chosen[0]}={chosen[1]}" if chosen else dist.url
    parts = [f'<a href="{_attr(href)}"']
    if dist.requires_python:
        parts.append(f' data-requires-python="{_attr(dist.requires_python)}"')
    if dist.yanked is not False:
        reason = dist.yanked if isinstance(dist.yanked, str) else ""
        parts.append(f' data-yanked="{_attr(reason)}"')
    core = _html_core_metadata(dist.core_metadata)
    if core is not None:
        # PEP 714: the legacy attribute too, with the same value, for older clients.
        parts.append(f' data-core-metadata="{_attr(core)}" data-dist-info-metadata="{_attr(core)}"')
    parts.append(f">{_attr(dist.filename)}</a><br />")
    return "".join(parts)


def _html_document(title: str, api_version: str, links: Iterator[str], head: Iterable[tuple[str, str]] = ()) -> bytes:
    lines = [
        "<!DOCTYPE html>",
        "<html>",
        "  <head>",
        f'    <meta name="pypi:repository-version" content="{_attr(api_version)}">',
        *(f'    <meta name="{_attr(name)}" content="{_attr(content)}">' for name, content in head),
        f"    <title>{_attr(title)}</title>",
        "  </head>",
        "  <body>",
        f"    <h1>{_attr(title)}</h1>",
        *(f"    {link}" for link in links),
        "  </body>",
        "</html>",
        "",
    ]
    return "\n".join(lines).encode("utf-8")


def _json_document(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def render_project_html(page: ProjectPage) -> bytes:
    """PEP 503 page with the PEP 592/629/658/714 attributes and a hash fragment per link."""
    head = [("pypi:project-status", page.status)] if page.status is not None else []
    if page.status is not None and page.status_reason:
        head.append(("pypi:project-status-reason", page.status_reason))
    return _html_document(f"Links for {page.name}", page.api_version, (_html_link(f) for f in page.files), head)


def _json_file(dist: DistFile) -> dict[str, Any]:
    core: bool | dict[str, str] = dict(dist.core_metadata) if isinstance(dist.core_metadata, dict) else dist.core_metadata
    if core == {}:
        core = True
    entry: dict[str, Any] = {
        "filename": dist.filename,
        "url": dist.url,
        "hashes": dict(dist.hashes),
        "yanked": True if dist.yanked == "" else dist.yanked,
        "core-metadata": core,
        # What PyPI emits beside core-metadata; PEP 714 forbids the plain
        # "dist-info-metadata" key in JSON because pip 22.3-23.1 crash on it.
        "data-dist-info-metadata": core,
    }
    optional = {"requires-python": dist.requires_python, "size": dist.size, "upload-time": dist.upload_time}
    entry.update((k, v) for k, v in optional.items() if v is not None)
    return entry


def render_project_json(page: ProjectPage) -> bytes:
    """PEP 691 project page (PEP 700 fields where known), compact, keys sorted."""
    obj: dict[str, Any] = {
        "meta": {"api-version": page.api_version},
        "name": page.name,
        "files": [_json_file(f) for f in page.files],
        "versions": list(page.versions),
    }
    if page.status is not None:
        obj["project-status"] = {"status": page.status, **({"reason": page.status_reason} if page.status_reason else {})}
    return _json_document(obj)


def render_project_list_html(plist: ProjectList) -> bytes:
    """PEP 503 root page; each link is ``<normalised-name>/`` relative to it."""
    links = (f'<a href="{_attr(quote(canonicalize_name(n), safe=""))}/">{_attr(n)}</a><br />' for n in plist.projects)
    return _html_document("Simple index", API_VERSION, links)


def render_project_list_json(plist: ProjectList) -> bytes:
    """PEP 691 root page."""
    return _json_document({"meta": {"api-version": API_VERSION}, "projects": [{"name": n} for n in plist.projects]})


def with_urls(page: ProjectPage, url_for: Callable[[DistFile], str]) -> ProjectPage:
    """The same page with every file's URL replaced by ``url_for(file)``."""
    return dataclasses.replace(page, files=tuple(dataclasses.replace(f, url=url_for(f)) for f in page.files))


# ---------------------------------------------------------------- negotiation


class MediaType(enum.Enum):
    """The content types a Simple API response can have (PEP 691)."""

    JSON_V1 = "application/vnd.pypi.simple.v1+json"
    HTML_V1 = "application/vnd.pypi.simple.v1+html"
    HTML = "text/html"


_ALIASES: dict[MediaType, frozenset[str]] = {
    MediaType.JSON_V1: frozenset({MediaType.JSON_V1.value, "application/vnd.pypi.simple.latest+json"}),
    MediaType.HTML_V1: frozenset({MediaType.HTML_V1.value, "application/vnd.pypi.simple.latest+html"}),
    MediaType.HTML: frozenset({MediaType.HTML.value}),
}
# Tie-breaks, least preferred first.  Named explicitly at equal quality: the
# most expressive format wins (PEP 691).
_EXPLICIT_PREFERENCE = (MediaType.HTML, MediaType.HTML_V1, MediaType.JSON_V1)
# Reached only through a wildcard: legacy HTML, as Warehouse does for */*,
# because a client naming none of our types may be a browser or an old tool.
_WILDCARD_PREFERENCE = (MediaType.JSON_V1, MediaType.HTML_V1, MediaType.HTML)
MAX_ACCEPT_LENGTH = 4096
MAX_ACCEPT_ITEMS = 50
_MEDIA_RANGE_RE = re.compile(r"([a-z0-9!#$&^_.+-]+|\*)/([a-z0-9!#$&^_.+-]+|\*)")
_QVALUE_RE = re.compile(r"0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?")


def _accept_items(accept: str) -> list[tuple[str, float]]:
    """``(media-range, q)`` pairs; malformed items are dropped."""
    if len(accept) > MAX_ACCEPT_LENGTH:
        # Cut at an item boundary so a truncated ";q=0.01" never reads as q=1.
        accept = accept[: accept.rfind(",", 0, MAX_ACCEPT_LENGTH) + 1]
    items = []
    for item in accept.split(",")[:MAX_ACCEPT_ITEMS]:
        media_range, *params = (p.strip() for p in item.split(";"))
        media_range = media_range.lower()
        if not _MEDIA_RANGE_RE.fullmatch(media_range) or (media_range.startswith("*/") and media_range != "*/*"):
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                value = value.strip()
                q = float(value) if _QVALUE_RE.fullmatch(value) else -1.0
                break
        if q >= 0:
            items.append((media_range, q))
    return items


# Clients send one of a handful of Accept strings, over and over (bench: 11% of a warm page request).
@functools.lru_cache(maxsize=256)
def negotiate(accept: str | None) -> MediaType | None:
    """Pick the response type for an ``Accept`` header, or None for 406.

    Each offer takes the quality of the most specific range that matches it
    (exact type, then ``type/*``, then ``*/*``, per RFC 9110); ``q=0``
    excludes it.  The highest quality wins; at equal quality an explicitly
    named type beats a wildcard match; among explicit names JSON v1 beats
    HTML v1 beats ``text/html`` (PEP 691 recommends the most featureful and
    ``text/html`` last), while among wildcard matches ``text/html`` comes
    first, so ``*/*`` (curl, browsers, old tools) gets plain HTML.  The
    ``latest`` aliases count as the v1 types.  A missing, empty or wholly
    unparseable header is treated as ``*/*`` and so gets ``text/html``.
    Only the first 50 items within the first 4 KiB are read.
    """
    items = _accept_items(accept or "")
    if not items:
        return MediaType.HTML
    best: tuple[float, int, int] | None = None
    chosen: MediaType | None = None
    for offer in MediaType:
        major = offer.value.partition("/")[0]
        quality, specificity = -1.0, -1
        for media_range, q in items:
            if media_range in _ALIASES[offer]:
                rank = 2
            elif media_range == f"{major}/*":
                rank = 1
            elif media_range == "*/*":
                rank = 0
            else:
                continue
            if rank > specificity or (rank == specificity and q > quality):
                quality, specificity = q, rank
        if quality <= 0:
            continue
        order = _EXPLICIT_PREFERENCE if specificity == 2 else _WILDCARD_PREFERENCE
        key = (quality, 1 if specificity == 2 else 0, order.index(offer))
        if best is None or key > best:
            best, chosen = key, offer
    return chosen
