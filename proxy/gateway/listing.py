"""A project's page at the indexes: fetched, bounded, validated, first index wins.

:meth:`IndexClient.listing` asks the ``--index-url`` indexes in order for
the project (PEP 691 JSON preferred, PEP 503 HTML accepted) and returns
the first index's page that lists it, never a merge (uv's
``first-index``); which indexes it may ask is the policy's decision
(:meth:`proxy.gateway.policy.Policy.choose_index`: the ledger's index
alone for a project published before, the first alone for a name claimed
private).  A 404 moves on to the next index; any other failure is a
refusal, so a broken first index never lets a later one answer for it.

Validation, before anything can be signed: the page is for the project
asked for; its size is bounded; every file name is a distribution file
of that project (``packaging.utils``) and safe as a path segment; every
file has a sha256; every file link stays within the allowed origins (the
index's own origin plus ``--files-origin`` ones, which also keeps a
hostile page from pointing the gateway at internal addresses).  A file
entry without a sha256, or not of this project, is left out and named in
``dropped``; a link outside the allowed origins refuses the whole page.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from urllib.parse import urljoin

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

from proxy.gateway.policy import IndexState, Policy, Refusal, RefusalKind
from proxy.protocol import index
from proxy.protocol.errors import Fault
from proxy.protocol.layout import is_valid_filename
from proxy.transport.indexhttp import IndexHTTP, RedirectRefused, origin, strip_credentials
from proxy.transport.upstream import DownloadError, DownloadHTTPError, DownloadLengthError

ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"


class PageRefused(Exception):
    """The index answered with a page we will not sign; ``reason`` is the slug."""

    reason = "page-refused"  # each instance names its own
    fault = Fault.REPOSITORY
    # Reasons that are our configuration's doing, not the index's (a missing --files-origin).
    OPERATOR_REASONS = frozenset({"foreign-origin"})

    def __init__(self, reason: str, message: str, url: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.url = url
        if reason in self.OPERATOR_REASONS:
            self.fault = Fault.OPERATOR


class IndexUnreachable(PageRefused):
    """No usable answer from the index (network, timeout, 5xx)."""

    fault = Fault.UPSTREAM

    def __init__(self, message: str, url: str | None = None) -> None:
        super().__init__("upstream-unreachable", message, url)


@dataclass(frozen=True)
class Listing:
    """One index's page for a project; file URLs are absolute and credential-free."""

    project: str
    index_url: str
    page: index.ProjectPage
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (filename, reason)


def dist_project(filename: str) -> tuple[str, str] | None:
    """(normalised project, version) of a wheel or sdist file name, or None."""
    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
        else:
            name, version = parse_sdist_filename(filename)
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return str(name), str(version)


class IndexClient:
    """Pages from the configured indexes; see the module docstring."""

    def __init__(self, http: IndexHTTP, files_origins: tuple[str, ...] = (), max_page_size: int = 64 * 2**20) -> None:
        self.http = http
        self.files_origins = files_origins
        self.max_page_size = max_page_size

    @property
    def index_urls(self) -> list[str]:
        return self.http.index_urls

    async def listing(self, project: str, policy: Policy, only: str | None = None) -> Listing | Refusal:
        """The page of the index ``policy.choose_index`` picks, asking indexes lazily, in order.

        ``only`` is the index the ledger says published the project.  The
        refusal says why no index may supply it (a 404); when the policy
        will not look past an unreachable index, that index's
        :class:`IndexUnreachable` is raised.
        """
        project = canonicalize_name(project)
        urls = self.index_urls
        served = None if only is None else urls.index(only) if only in urls else len(urls)
        states: list[IndexState | None] = [None] * len(urls)
        found: dict[int, Listing] = {}
        unreachable: dict[int, IndexUnreachable] = {}
        while (choice := policy.choose_index(project, states, served)).probe is not None:
            i = choice.probe
            try:
                listing = await self._from_index(urls[i], project)
            except IndexUnreachable as e:
                states[i], unreachable[i] = IndexState.UNREACHABLE, e
                continue
            states[i] = IndexState.ABSENT if listing is None else IndexState.LISTED
            if listing is not None:
                found[i] = listing
        if choice.index is not None:
            return found[choice.index]
        assert choice.refusal is not None
        if choice.refusal.kind is RefusalKind.UNREACHABLE:
            raise next(iter(unreachable.values()))
        return choice.refusal

    async def _from_index(self, base: str, project: str) -> Listing | None:
        url = f"{base}{project}/"
        allowed = (origin(base),)
        try:
            async with self.http.get(url, self.max_page_size, allowed, accept=ACCEPT) as response:
                chunks = [chunk async for chunk in response.body]
                final_url, content_type = response.url, response.content_type
        except DownloadHTTPError as e:
            if e.status in (404, 410):
                return None
            raise IndexUnreachable(str(e), url) from e
        except DownloadLengthError as e:
            raise PageRefused("oversized-page", f"{url}: page larger than {self.max_page_size} bytes", url) from e
        except RedirectRefused as e:
            raise PageRefused("bad-redirect", str(e), url) from e
        except DownloadError as e:
            raise IndexUnreachable(str(e), url) from e
        data = b"".join(chunks)
        try:
            if "json" in content_type:
                page = index.parse_project_json(data, project)
            else:
                page = index.parse_project_html(data, project)
        except index.IndexParseError as e:
            raise PageRefused("bad-page", f"{url}: {e}", url) from e
        return self._validated(base, final_url, project, page)

    def _validated(self, base: str, page_url: str, project: str, page: index.ProjectPage) -> Listing:
        allowed = {origin(base), *(origin(o) for o in self.files_origins)}
        kept: list[index.DistFile] = []
        dropped: list[tuple[str, str]] = []
        for dist in page.files:
            url, _ = strip_credentials(urljoin(page_url, dist.url))
            if not url.startswith(("http://", "https://")) or origin(url) not in allowed:
                raise PageRefused("foreign-origin", f"{page_url}: {dist.filename} links to {origin(url)}, "
                                  "which is neither the index nor a --files-origin", page_url)
            named = dist_project(dist.filename)
            if not is_valid_filename(dist.filename) or named is None or named[0] != project:
                dropped.append((dist.filename[:200], "not-a-file-of-this-project"))
            elif "sha256" not in dist.hashes or len(dist.hashes["sha256"]) != 64:
                dropped.append((dist.filename, "missing-hash"))
            else:
                provenance = strip_credentials(urljoin(page_url, dist.provenance))[0] if dist.provenance else None
                kept.append(dataclasses.replace(dist, url=url, provenance=provenance))
        return Listing(project, base, dataclasses.replace(page, files=tuple(kept)), dropped)
