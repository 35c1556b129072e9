"""The HTTP face of the proxy: the Simple API and files, served only once verified.

Request flow: the path is resolved by :mod:`proxy.layout` to a target; the
trust core says what that target must be (length, hashes) under the
freshest trusted metadata; the bytes come from the verified store or are
streamed from a mirror into it, checked as they arrive; then they are
served — pages re-rendered from their verified bytes with links to this
proxy, files with sendfile, ranges and conditional requests.

Every refusal is typed: :func:`_refusal_response` turns it into an HTTP
error whose reason phrase pip prints, an audit record and a metric.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urljoin

from aiohttp import web

from proxy import index
from proxy.audit import AuditLog, AuditWriteError
from proxy.logs import new_request_id, request_id
from proxy.layout import (
    BadRequestPath,
    PageFormat,
    TargetKind,
    TargetRequest,
    is_valid_filename,
    page_file_href,
    parse_request_path,
)
from proxy.metrics import CONTENT_TYPE_LATEST, Metrics
from proxy.profiles import TUFPROXY, Profile
from proxy.repository.distributions import version_of_filename
from proxy.store import Blob, BlobMismatch, BlobStore, IndexCache, StoreError, StoreFull
from proxy.trust import TrustedClient, VerifiedTarget
from proxy.trust.errors import (
    ExpiredMetadata,
    HashMismatch,
    LengthMismatch,
    MetadataPending,
    RepositoryError,
    TrustError,
    UnknownTarget,
    UpstreamUnreachable,
)
from proxy.upstream import DownloadError, DownloadLengthError, Fetcher

log = logging.getLogger(__name__)

_CONTENT_TYPES = {
    index.MediaType.JSON_V1: "application/vnd.pypi.simple.v1+json",
    index.MediaType.HTML_V1: "application/vnd.pypi.simple.v1+html",
    index.MediaType.HTML: "text/html; charset=utf-8",
}
_RENDERED_CACHE_SIZE = 4096
# Hashes a page may vouch for a file with; the store checks every one given.
_PAGE_HASHES = frozenset({"sha256", "sha384", "sha512", "blake2b-256"})
# Reason phrases travel in the status line: printable ASCII, bounded.
_REASON_RE = re.compile(r"[^\x20-\x7e]")


@dataclass(frozen=True)
class ProxySettings:
    """What the server needs besides its collaborators."""

    max_file_size: int = 4 * 2**30
    max_page_size: int = 64 * 2**20
    max_core_metadata_size: int = 16 * 2**20
    # /readyz wants an upstream reached within this many seconds (a few refresh intervals).
    upstream_freshness: float = 180.0


def _reason_phrase(text: str) -> str:
    return _REASON_RE.sub("?", text)[:300]


class Proxy:
    """The aiohttp application and the state behind it."""

    def __init__(
        self,
        trust: TrustedClient,
        fetcher: Fetcher,
        store: BlobStore,
        pages: IndexCache,
        audit: AuditLog,
        metrics: Metrics,
        settings: ProxySettings = ProxySettings(),
        profile: Profile = TUFPROXY,
        file_origins: tuple[str, ...] = (),
        on_miss: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        self.trust = trust
        self.on_miss = on_miss
        self.profile = profile
        # URL prefixes a verified page may point files at (warehouse profile): the mirrors
        # and any file host the operator named. Anything else is never fetched.
        self.file_origins = tuple(m.targets_url for m in trust.mirrors) + file_origins
        self.fetcher = fetcher
        self.store = store
        self.pages = pages
        self.audit = audit
        self.metrics = metrics
        self.settings = settings
        self._inflight: dict[str, asyncio.Future[Blob]] = {}
        self._rendered: OrderedDict[tuple[str, str, str], bytes] = OrderedDict()
        # Blobs re-hashed since this process started: the cheap trigger for bit-rot checks.
        self._rechecked: set[str] = set()
        self._evictions_reported = 0

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get("/metrics", self._metrics, name="metrics")
        app.router.add_get("/healthz", self._healthz, name="healthz")
        app.router.add_get("/readyz", self._readyz, name="readyz")
        app.router.add_get("/{tail:.*}", self._dispatch, name="simple")
        return app

    # -- plumbing ------------------------------------------------------
    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        start = time.monotonic()
        route = "other"
        rid = new_request_id(request.headers.get("X-Request-Id"))
        token = request_id.set(rid)
        try:
            route = request.get("route", request.match_info.route.name or "other")
            response = await handler(request)
            route = request.get("route", route)
        except web.HTTPException as e:
            response = e
        except (TrustError, StoreError, AuditWriteError) as e:
            route = request.get("route", route)
            response = self._refusal_response(request, e)
        finally:
            request_id.reset(token)
        response.headers["X-Request-Id"] = rid
        status = response.status
        self.metrics.requests.labels(route, str(status)).inc()
        self.metrics.request_seconds.labels(route).observe(time.monotonic() - start)
        if isinstance(response, web.HTTPException):
            raise response
        return response

    def _refusal_response(self, request: web.Request, error: Exception) -> web.Response:
        """Status, one-line reason, audit record and metric for a refusal."""
        if isinstance(error, UnknownTarget):
            why = f" ({error.detail})" if error.detail else ""
            return _text(404, f"not found: no signed target {error.target}{why}")
        if isinstance(error, MetadataPending):
            # Not known yet: pip retries a 503 (honouring Retry-After), while a 404 ends its resolve.
            response = _text(503, str(error), reason_slug=error.reason)
            response.headers["Retry-After"] = str(error.retry_after)
            return response
        if isinstance(error, ExpiredMetadata):
            status, text = 503, f"trusted metadata expired and cannot be refreshed: {error}"
        elif isinstance(error, RepositoryError):
            status, text = 502, f"refused by TUF verification ({error.reason}): {error}"
        elif isinstance(error, UpstreamUnreachable):
            status, text = 502, f"upstream unreachable: {error}"
        elif isinstance(error, StoreFull):
            status, text = 503, f"cache full, cannot store new files: {error}"
        elif isinstance(error, AuditWriteError):
            log.error("failing closed: %s", error)
            return _text(500, "audit log unwritable: refusing to serve")
        else:
            status, text = 500, f"internal store error: {error}"
        reason = getattr(error, "reason", type(error).__name__)
        if isinstance(error, (RepositoryError, UpstreamUnreachable)) and not request.get("audited"):
            self._audit_refusal(request, error, None)
        log.warning("%s %s -> %d %s", request.method, request.path, status, text)
        return _text(status, text, reason_slug=reason)

    def _audit_refusal(self, request: web.Request, error: Exception, url: str | None) -> None:
        reason = getattr(error, "reason", type(error).__name__)
        if isinstance(error, RepositoryError):
            self.metrics.verification_failures.labels(reason).inc()
        self.audit.refused(
            request_id=request_id.get(),
            client=request.remote,
            request_path=request.path,
            target=getattr(error, "target", None) or request.get("target"),
            role=getattr(error, "role", None),
            upstream_url=url,
            reason=reason,
            message=str(error),
            expected=getattr(error, "expected", None),
            actual=getattr(error, "actual", None),
            trusted_versions=self._trusted_versions(),
        )
        request["audited"] = True

    def _trusted_versions(self) -> dict[str, int]:
        status = self.trust.status()
        return {role: info["version"] for role, info in status.get("roles", {}).items()}

    async def _metrics(self, request: web.Request) -> web.Response:
        self.update_gauges()
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def update_gauges(self) -> None:
        """Bring the gauges (trusted versions, expiry, cache size) up to date: at each scrape, and
        periodically in workers, whose gauges other workers report."""
        status = self.trust.status()
        now = time.time()
        for role, info in status.get("roles", {}).items():
            self.metrics.role_version.labels(role).set(info["version"])
            self.metrics.role_expiry.labels(role).set(info["expires"].timestamp() - now)
        if status.get("last_refresh"):
            self.metrics.last_refresh.set(status["last_refresh"])
        self.metrics.cache_bytes.set(self.store.usage())
        # The store counts evictions itself; the counter catches up at each scrape.
        self.metrics.cache_evictions.inc(self.store.evictions - self._evictions_reported)
        self._evictions_reported = self.store.evictions

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        """Ready: trusted metadata unexpired, cache writable, an upstream reached lately."""
        status = self.trust.status()
        problems = []
        if not status["ready"]:
            problems.append("no unexpired trusted metadata")
        last = status.get("last_refresh")
        if last is None or time.time() - last > self.settings.upstream_freshness:
            problems.append(f"no successful metadata refresh in {self.settings.upstream_freshness:.0f}s"
                            + (f" (last error: {status['last_error']})" if status.get("last_error") else ""))
        try:
            await asyncio.to_thread(self.store.probe_writable)
        except StoreError as e:
            problems.append(f"cache not writable: {e}")
        body = {
            "ready": not problems,
            "problems": problems,
            "roles": {r: {"version": i["version"], "expires": str(i["expires"])} for r, i in status["roles"].items()},
            "last_refresh": last,
        }
        return web.json_response(body, status=200 if not problems else 503)

    # -- routes --------------------------------------------------------
    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        try:
            req = parse_request_path(request.rel_url.raw_path)
        except BadRequestPath as e:
            if request.path in ("/", ""):
                raise web.HTTPFound("simple/") from None
            request["route"] = "bad_path"
            return _text(404, f"not found: {e}")
        request["route"] = req.kind.value.replace("-", "_")
        if req.kind in (TargetKind.ROOT_INDEX, TargetKind.PROJECT_INDEX):
            if req.redirect_to is not None:
                raise web.HTTPMovedPermanently(req.redirect_to)
            return await self._page(request, req)
        return await self._file(request, req)

    async def _page(self, request: web.Request, req: TargetRequest) -> web.Response:
        media = index.negotiate(request.headers.get("Accept"))
        if media is None:
            return _text(406, "none of the Accept types is served: try application/vnd.pypi.simple.v1+json or text/html")
        fmt = PageFormat.JSON if media is index.MediaType.JSON_V1 else PageFormat.HTML
        source = self.profile.page_source_format(fmt)
        if req.kind is TargetKind.ROOT_INDEX:
            target_path = self.profile.root_target(fmt)
            if target_path is None:
                return _text(404, f"the root project list is not signed in the {self.profile.name} layout: "
                                  "ask for /simple/<project>/")
        else:
            assert req.project is not None
            target_path = self.profile.page_target(req.project, source)
        request["target"] = target_path
        target = await self._page_target(req.project, target_path)
        key = (target.path, _first_hash(target), fmt.value)
        body = self._rendered.get(key)
        if body is None:
            raw = await self._verified_page_bytes(request, target)
            try:
                body = _render(req, raw, source, fmt)
            except index.IndexParseError as e:
                raise _Malformed(target.path, str(e)) from e
            self._rendered[key] = body
            if len(self._rendered) > _RENDERED_CACHE_SIZE:
                self._rendered.popitem(last=False)
        else:
            self._rendered.move_to_end(key)
            self.metrics.cache_hits.labels("page").inc()
        return web.Response(body=body, headers={"Content-Type": _CONTENT_TYPES[media], "Vary": "Accept"})

    async def _page_target(self, project: str | None, target_path: str) -> VerifiedTarget:
        """A page's signed target; on a miss, the gateway's miss protocol (proxy/gateway/edge.py) may publish it."""
        try:
            return await self.trust.get_target(target_path)
        except UnknownTarget:
            if project is None or self.on_miss is None or not await self.on_miss(project):
                raise
            return await self.trust.get_target(target_path)

    async def _verified_page_bytes(self, request: web.Request, target: VerifiedTarget) -> bytes:
        cache_key = f"{target.path}@{_first_hash(target)}"
        data = self.pages.get(cache_key)
        if data is not None:
            self.metrics.cache_hits.labels("page").inc()
            return data
        self.metrics.cache_misses.labels("page").inc()
        if target.length > self.settings.max_page_size:
            raise LengthMismatch(f"{target.path}: signed length {target.length} exceeds the page limit",
                                 target=target.path, expected=self.settings.max_page_size, actual=target.length)
        refusal: RepositoryError | None = None
        failures: list[Exception] = []
        for i, url in enumerate(self.trust.target_urls(target)):
            start = time.monotonic()
            try:
                data = await self.fetcher.fetch_bytes(url, target.length)
                target.verify(data)
            except DownloadLengthError as e:
                refusal = _mismatch(target, e)
                self._fetch_outcome(i, start, "refused")
                self._audit_refusal(request, refusal, url)
                continue
            except RepositoryError as e:
                refusal = e
                self._fetch_outcome(i, start, "refused")
                self._audit_refusal(request, e, url)
                continue
            except DownloadError as e:
                failures.append(e)
                self._fetch_outcome(i, start, "error")
                continue
            self._fetch_outcome(i, start, "ok", len(data))
            self.pages.set(cache_key, data)
            return data
        if refusal is not None:
            raise refusal
        raise UpstreamUnreachable(target.path, failures)

    def _fetch_outcome(self, mirror: int, start: float, outcome: str, nbytes: int = 0) -> None:
        self.metrics.upstream_fetches.labels(str(mirror), outcome).inc()
        self.metrics.upstream_seconds.labels(str(mirror)).observe(time.monotonic() - start)
        if nbytes:
            self.metrics.upstream_bytes.labels(str(mirror)).inc(nbytes)

    async def _file(self, request: web.Request, req: TargetRequest) -> web.StreamResponse:
        target_path = req.target_path()
        request["target"] = target_path
        if self.profile.files_are_targets:
            target = await self.trust.get_target(target_path)
            source = _Source(target, self.trust.target_urls(target), exact=True)
        else:
            source = await self._source_from_page(request, req)
        target = source.target
        if target.length > self.settings.max_file_size:
            raise LengthMismatch(f"{target_path}: {target.length} bytes is over the --max-file-size limit",
                                 target=target_path, expected=self.settings.max_file_size, actual=target.length)
        blob = await self._blob(request, source)
        self.audit.accepted(request_id=request_id.get(), client=request.remote, request_path=request.path, target=target_path,
                            role=target.role, length=blob.size, hashes=target.hashes)
        return _PinnedFileResponse(self.store, blob)

    async def _source_from_page(self, request: web.Request, req: TargetRequest) -> _Source:
        """A file trusted through its project's verified page (sha256, and size where given)."""
        assert req.project is not None and req.filename is not None
        page_format = self.profile.signed_formats[0]
        page_target = await self._page_target(req.project, self.profile.page_target(req.project, page_format))
        raw = await self._verified_page_bytes(request, page_target)
        try:
            page = _parse(raw, req.project, page_format)
        except index.IndexParseError as e:
            raise _Malformed(page_target.path, str(e)) from e
        dist = next((f for f in page.files if f.filename == req.filename), None)
        if dist is None:
            raise UnknownTarget(req.target_path())
        role = f"{page_target.role} (via {page_target.path})"
        if req.kind is TargetKind.CORE_METADATA:
            hashes = dist.core_metadata if isinstance(dist.core_metadata, dict) else {}
            length, suffix = self.settings.max_core_metadata_size, ".metadata"
        else:
            hashes, length, suffix = dist.hashes, dist.size or self.settings.max_file_size, ""
        hashes = {a: v for a, v in hashes.items() if a in _PAGE_HASHES}
        if not hashes:
            # Without a hash the page vouches for nothing: refuse rather than serve it unverified.
            raise UnknownTarget(req.target_path())
        urls = []
        for page_url in self.trust.target_urls(page_target):
            url = urljoin(page_url, dist.url) + suffix
            if url not in urls and url.startswith(self.file_origins):
                urls.append(url)
        if not urls:
            raise _ForeignLink(req.target_path(), dist.url)
        target = VerifiedTarget(path=req.target_path(), length=length, hashes=hashes, role=role)
        return _Source(target, urls, exact=dist.size is not None and suffix == "")

    async def _blob(self, request: web.Request, source: _Source) -> Blob:
        target = source.target
        kind = "metadata" if target.path.endswith(".metadata") else "file"
        sha = target.hashes.get("sha256")
        if sha is not None:
            blob = self.store.get(sha, target.length if source.exact else None)
            if blob is not None and await self._recheck(blob, target):
                self.metrics.cache_hits.labels(kind).inc()
                return blob
        self.metrics.cache_misses.labels(kind).inc()
        key = f"{target.path}@{_first_hash(target)}"
        future = self._inflight.get(key)
        if future is None:
            future = asyncio.ensure_future(self._download_once(request, source, key))
            self._inflight[key] = future
            future.add_done_callback(lambda f: self._inflight.pop(key, None))
        else:
            self.metrics.singleflight_joins.inc()
        # shield: a client that goes away does not cancel the fetch others wait for.
        return await asyncio.shield(future)

    async def _download_once(self, request: web.Request, source: _Source, key: str) -> Blob:
        """``_download`` under the cross-process lock of ``key``: other workers (or replicas on a
        shared volume) asked for the same file wait for the one fetching it, then find its blob."""
        async with self.store.fetch_lock(key):
            sha = source.target.hashes.get("sha256")
            blob = self.store.get(sha, source.target.length if source.exact else None) if sha else None
            return blob if blob is not None else await self._download(request, source)

    async def _recheck(self, blob: Blob, target: VerifiedTarget) -> bool:
        if blob.sha256 in self._rechecked:
            return True
        with self.store.in_use(blob.sha256):
            sound = await asyncio.to_thread(self.store.verify, blob, target.hashes)
        if sound:
            self._rechecked.add(blob.sha256)
        else:
            log.error("blob %s failed its re-check (bit rot?): evicted, refetching", blob.sha256)
        return sound

    async def _download(self, request: web.Request, source: _Source) -> Blob:
        target = source.target
        refusal: RepositoryError | None = None
        failures: list[Exception] = []
        for i, url in enumerate(source.urls):
            start = time.monotonic()
            received = 0
            try:
                async with self.store.writer(target.length, target.hashes, exact=source.exact) as writer:
                    async with self.fetcher.stream(url, target.length) as body:
                        async for chunk in body:
                            received += len(chunk)
                            await writer.write(chunk)
                    blob = await writer.commit()
            except (BlobMismatch, DownloadLengthError) as e:
                refusal = _mismatch(target, e, source.exact)
                self._fetch_outcome(i, start, "refused", received)
                self._audit_refusal(request, refusal, url)
                continue
            except DownloadError as e:
                failures.append(e)
                self._fetch_outcome(i, start, "error", received)
                continue
            self._fetch_outcome(i, start, "ok", received)
            self._rechecked.add(blob.sha256)
            return blob
        if refusal is not None:
            raise refusal
        raise UpstreamUnreachable(target.path, failures)


@dataclass(frozen=True)
class _Source:
    """What a file must be and where to fetch it; ``exact``: the length is signed, not a bound."""

    target: VerifiedTarget
    urls: list[str]
    exact: bool


class _PinnedFileResponse(web.FileResponse):
    """aiohttp's FileResponse (sendfile, Range, If-None-Match, HEAD), with the blob
    pinned while it is sent so eviction cannot pull it away mid-response."""

    def __init__(self, store: BlobStore, blob: Blob) -> None:
        super().__init__(
            blob.path,
            headers={
                "Content-Type": "application/octet-stream",
                # A file name's bytes never change on an index: let clients and caches keep it.
                "Cache-Control": "public, max-age=31536000, immutable",
            },
        )
        self._store = store
        self._sha256 = blob.sha256

    async def prepare(self, request: web.BaseRequest):  # type: ignore[no-untyped-def]
        with self._store.in_use(self._sha256):
            return await super().prepare(request)


class _Malformed(RepositoryError):
    """A page whose bytes verified but which is not a Simple API page."""

    reason = "malformed-page"

    def __init__(self, target: str, detail: str) -> None:
        super().__init__(f"{target}: signed page does not parse: {detail}", target=target)


class _ForeignLink(RepositoryError):
    """A verified page points a file at a host that is not a configured upstream."""

    reason = "foreign-link"

    def __init__(self, target: str, url: str) -> None:
        super().__init__(f"{target}: the page links to {url[:200]}, which is not a configured upstream "
                         "(add it with --files-url)", target=target)


def _first_hash(target: VerifiedTarget) -> str:
    return next(iter(target.hashes.values()))


def _mismatch(target: VerifiedTarget, error: Exception, exact: bool = True) -> RepositoryError:
    """A store or transport length/hash failure as the trust error it is.

    With an inexact length (a bound, not a signed value) only going past
    the bound is a length failure; anything else is the hash's verdict.
    """
    if isinstance(error, BlobMismatch) and (
        error.actual_length == error.expected_length if exact else error.actual_length <= error.expected_length
    ):
        return HashMismatch(f"{target.path}: bytes do not match the signed hashes",
                            target=target.path, role=target.role,
                            expected=error.expected_hashes, actual=error.actual_hashes)
    actual = getattr(error, "actual_length", None)
    return LengthMismatch(f"{target.path}: upstream sent {actual if actual is not None else 'more'} bytes, {target.length} signed",
                          target=target.path, role=target.role, expected=target.length, actual=actual)


def _parse(raw: bytes, project: str, fmt: PageFormat) -> index.ProjectPage:
    return index.parse_project_json(raw, project) if fmt is PageFormat.JSON else index.parse_project_html(raw, project)


def _render(req: TargetRequest, raw: bytes, source: PageFormat, fmt: PageFormat) -> bytes:
    """Re-render a verified page (read as ``source``, written as ``fmt``) with every file link pointing at this proxy."""
    if req.kind is TargetKind.ROOT_INDEX:
        plist = index.parse_project_list_json(raw) if source is PageFormat.JSON else index.parse_project_list_html(raw)
        return index.render_project_list_json(plist) if fmt is PageFormat.JSON else index.render_project_list_html(plist)
    assert req.project is not None
    project = req.project
    page = _parse(raw, project, source)
    # A name the router refuses could never be fetched through this proxy (and a '#' in it
    # would break the link): leave such entries out rather than fail the whole page.
    page = dataclasses.replace(page, files=tuple(f for f in page.files if is_valid_filename(f.filename)))
    page = index.with_urls(page, lambda f: page_file_href(project, f.filename))
    if fmt is PageFormat.JSON and not page.versions:
        # An HTML page has no PEP 700 versions list: derive it from the file names.
        versions = dict.fromkeys(v for f in page.files if (v := version_of_filename(f.filename)))
        page = dataclasses.replace(page, versions=tuple(versions))
    return index.render_project_json(page) if fmt is PageFormat.JSON else index.render_project_html(page)


def _text(status: int, text: str, reason_slug: str | None = None) -> web.Response:
    headers = {"X-Tufproxy-Reason": reason_slug} if reason_slug else None
    return web.Response(status=status, reason=_reason_phrase(text), text=text + "\n", headers=headers)
