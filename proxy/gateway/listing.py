"""A project's page at the indexes: fetched, bounded, validated, first index wins.

:meth:`IndexClient.listing` asks the ``--index-url`` indexes in order for
the project (PEP 691 JSON preferred, PEP 503 HTML accepted) and returns
the first index's page that lists it, never a merge (uv's
``first-index``); which indexes it may ask is the policy's decision
(:meth:`proxy.gateway.policy.Policy.choose_index`: the ledger's index
alone for a project published before, the first alone for a name claimed
private).  The indexes are asked through the one failover loop
(:func:`proxy.transport.failover.failover`, which says what each answer
means): a 404 or 410 moves on to the next index; any other failure (a 403
included) is a refusal, so a broken first index never lets a later one
answer for it.

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

from proxy.gateway.policy import IndexState, Policy, Refusal
from proxy.protocol import index
from proxy.protocol.errors import Fault
from proxy.protocol.layout import is_valid_filename
from proxy.transport.credentials import origin, strip_credentials
from proxy.transport.failover import Exhausted, Outcome, Tried, failover
from proxy.transport.indexhttp import IndexHTTP, RedirectRefused
from proxy.transport.upstream import DownloadHTTPError, DownloadLengthError

# Entries left out of a page by design (not a distribution of the project): counted, not refusals.
IGNORED = "not-a-file-of-this-project"
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


def foreign_origin(files: str, where: str) -> str:
    """The one line a missing ``--files-origin`` gets, fix first (a status line may cut the rest)."""
    return f"the index links files on {files}/; start the gateway with --files-origin {files}/ ({where})"


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
    page_url: str = ""  # where the page was read (after redirects), for audit records


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

        def states(tried: Tried) -> list[IndexState | None]:
            # A "not here" moves on; any other failure, a lie included, is an index that did not answer.
            return [None if o is None else IndexState.ABSENT if o is Outcome.MISSING else IndexState.UNREACHABLE
                    for o in tried.outcomes()]

        def choose(tried: Tried) -> int | None:
            return policy.choose_index(project, states(tried), served).probe

        try:
            return await failover([f"{base}{project}/" for base in urls],
                                  lambda i, url: self._from_index(urls[i], url, project), choose=choose)
        except Exhausted as e:
            tried = e.tried
        choice = policy.choose_index(project, states(tried), served)
        assert choice.refusal is not None
        if choice.refusal.kind is Fault.UPSTREAM:
            failed = next(a for a in tried.attempts if a.outcome is not Outcome.MISSING)
            raise self._refused(failed.url, failed.error) from failed.error
        return choice.refusal

    async def first_index_page(self, project: str) -> Listing | None:
        """The first index's page of ``project``, checked as for publishing (None: not listed)."""
        base = self.index_urls[0]
        project = canonicalize_name(project)
        try:
            return await self._from_index(base, f"{base}{project}/", project)
        except DownloadHTTPError as e:
            if e.status in (404, 410):
                return None
            raise

    def _refused(self, url: str, error: Exception | None) -> PageRefused:
        """Why an index that did not answer with a page ends the search."""
        if isinstance(error, DownloadLengthError):
            return PageRefused("oversized-page", f"{url}: page larger than {self.max_page_size} bytes", url)
        if isinstance(error, RedirectRefused):
            return PageRefused("bad-redirect", str(error), url)
        return IndexUnreachable(str(error), url)

    async def _from_index(self, base: str, url: str, project: str) -> Listing:
        """The page at ``url``; transport errors raised as they are, for :func:`failover` to read."""
        allowed = (origin(base),)
        async with self.http.get(url, self.max_page_size, allowed, accept=ACCEPT) as response:
            chunks = [chunk async for chunk in response.body]
            final_url, content_type = response.url, response.content_type
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
                raise PageRefused("foreign-origin", foreign_origin(origin(url), f"{dist.filename} on {page_url}"), page_url)
            named = dist_project(dist.filename)
            if not is_valid_filename(dist.filename) or named is None or named[0] != project:
                dropped.append((dist.filename[:200], IGNORED))
            elif "sha256" not in dist.hashes or len(dist.hashes["sha256"]) != 64:
                dropped.append((dist.filename, "missing-hash"))
            else:
                provenance = strip_credentials(urljoin(page_url, dist.provenance))[0] if dist.provenance else None
                kept.append(dataclasses.replace(dist, url=url, provenance=provenance))
        return Listing(project, base, dataclasses.replace(page, files=tuple(kept)), dropped, page_url)
