"""Deciding what to answer, without sending anything: the proxy's logic apart from HTTP.

:meth:`Resolver.resolve` takes an :class:`Ask` (plain values from the
request) and returns one decision value, in the way aiohttp's
``FileResponse`` decides before it sends:

* :class:`Redirect` (PEP 503 name normalisation, ``/`` to ``/simple/``);
* :class:`Page`: a verified index page, re-rendered with links to us,
  with its ETag and headers (the hottest kept ready to send);
* :class:`NotModified`: the client's ``If-None-Match`` names the page the
  trusted metadata vouches for now (decided without the store);
* :class:`CachedFile`: a verified blob, PINNED until the decision is
  released (call :meth:`CachedFile.release`, or use it as a context manager);
* :class:`KeptFile`: a small verified file's bytes, kept in memory for the
  hot path (:meth:`Resolver.ready`), with the headers ``FileResponse`` sends;
* :class:`Streamed`: a cold download to follow as it arrives;
* :class:`Refused`: a typed refusal, for :mod:`proxy.serving.refusals` to answer.

Request flow: the path is resolved by :mod:`proxy.protocol.layout` to a target; the
trust core says what that target must be under the freshest trusted
metadata (for profiles whose files are not targets, through the project's
verified page); the bytes come from the verified store or from the one
fetch-and-verify.  An unknown project page is offered to ``on_miss`` once.
A ``.metadata`` request also starts its file's fetch, within
:class:`~proxy.storage.downloads.ReadAheads`' bounds: pip and uv ask for a
version's metadata while resolving and for its file only once everything
is resolved, so the file is verified and stored by then.

A warm request does the least that keeps every check: path parsing and
content negotiation are memoised (pure functions of the request), the
trust core remembers lookups per trusted state but checks expiry at every
one, and a rendered page is kept under its signed digest, so it can never
be served once the trusted state stops vouching for that digest.  A small
file (a ``.metadata``, most pure-Python wheels) served from the store is
kept in memory too, under its verified sha256, and answered ready only
while the trusted target it was derived from is still the live one.  A
``.metadata`` answered ready starts no read-ahead: its file's was started
when the ``.metadata`` was first served.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from proxy.protocol import index
from proxy.protocol.access import marked_private, not_listed
from proxy.protocol.errors import (
    BadPath,
    ClientMistake,
    LengthMismatch,
    NotAcceptable,
    RepositoryError,
    StoreError,
    TrustError,
    UnknownTarget,
    UpstreamUnreachable,
)
from proxy.protocol.hashing import accepted_hashes, verify_bytes
from proxy.protocol.layout import (
    PROVENANCE_SUFFIX,
    BadRequestPath,
    PageFormat,
    TargetKind,
    TargetRequest,
    is_valid_filename,
    page_file_href,
    parse_request_path,
    provenance_target,
    version_of_filename,
)
from proxy.protocol.profiles import TUFPROXY, Profile
from proxy.serving.provenance import EdgeProvenance
from proxy.serving.refusals import Asker, Refusals
from proxy.serving.streaming import file_validators
from proxy.storage.audit import AuditLog, AuditWriteError
from proxy.storage.downloads import Download, Downloads, ReadAheads
from proxy.storage.pagecache import HotPages, IndexCache
from proxy.storage.store import Blob, BlobStore
from proxy.transport.upstream import Fetcher
from proxy.trust import TrustedClient, VerifiedTarget
from proxy.trust.fetch import MissingUpstream, Observer, Pace, Want, fetch_bytes
from proxy.trust.pagefiles import MAX_CORE_METADATA_SIZE, file_urls, file_want
from proxy.util import timing
from proxy.util.metrics import Metrics

if TYPE_CHECKING:
    from proxy.storage.tiered import SharedTier

log = logging.getLogger(__name__)
CONTENT_TYPES = {
    index.MediaType.JSON_V1: "application/vnd.pypi.simple.v1+json",
    index.MediaType.HTML_V1: "application/vnd.pypi.simple.v1+html",
    index.MediaType.HTML: "text/html; charset=utf-8",
}
# Media types by Accept header and requests by path: pure functions, a few hot inputs.
_negotiate = functools.lru_cache(maxsize=256)(index.negotiate)
_parse_path = functools.lru_cache(maxsize=8192)(parse_request_path)
_FORMATS = {media: PageFormat.JSON if media is index.MediaType.JSON_V1 else PageFormat.HTML for media in index.MediaType}
_PAGE_KINDS = (TargetKind.ROOT_INDEX, TargetKind.PROJECT_INDEX)
# The route label of each kind of request (metrics, audit).
_ROUTES = {kind: kind.value.replace("-", "_") for kind in TargetKind}
# Sources of files (what each must be, where it comes from), remembered per trusted target.
_SOURCES_SIZE = 16384
# Page-cache writes under way at once, and the bytes they hold (see Resolver._write_page).
_PAGE_WRITES = 64
_PAGE_WRITE_BYTES = 64 * 2**20
# Verified raw pages kept in memory per process.
_RAW_BYTES = 64 * 2**20
# Small cold files being read into memory once sent, at once (more are read when next asked for).
_KEEPING = 16
_READY_PLANS_SIZE = 8192
# Files answered from memory: each at most KEPT_FILE_MAX bytes, at most KEPT_FILES_BYTES in all (per process).
KEPT_FILE_MAX = 512 * 1024
KEPT_FILES_BYTES = 32 * 2**20
# What every file answer carries besides its own ETag, Last-Modified and length.
FILE_HEADERS = {
    "Content-Type": "application/octet-stream",
    # A file name's bytes never change on an index: let clients and caches keep it.
    "Cache-Control": "public, max-age=31536000, immutable",
}
# A follower of a fetch that failed for an upstream reason gets one fresh fetch of its own.
UPSTREAM_FAILURES = (UpstreamUnreachable, MissingUpstream)
OnMiss = Callable[[str], Awaitable[bool | None]]
# Why a file is not on its project's signed page (project, filename) -> the 404's detail.
Missing = Callable[[str, str], Awaitable[str]]


@dataclass(frozen=True)
class ProxySettings:
    """What the server needs besides its collaborators."""

    max_file_size: int = 4 * 2**30
    max_page_size: int = 64 * 2**20
    max_core_metadata_size: int = MAX_CORE_METADATA_SIZE
    # /readyz wants an upstream reached within this many seconds (a few refresh intervals).
    upstream_freshness: float = 180.0
    # True: hold every byte of a cold file until it is verified (no streaming).
    verify_before_send: bool = False
    # Files fetched at once ahead of their request, when their .metadata is asked for (0: none).
    read_ahead: int = 8
    pace: Pace = Pace()
    unknown_length_downloads: int = 4


@dataclass
class Ask(Asker):
    """A request, as plain values.  ``whole``: the client needs a finished file (Range, conditional, HEAD);
    ``resume``: it asks for part of a file (Range), so it may hold the rest from an earlier answer."""

    accept: str | None = None
    whole: bool = False
    resume: bool = False
    if_none_match: str | None = None
    route: str = "other"
    # Whether the client may read a private project (by name); None: it may not.
    private_ok: Callable[[str], bool] | None = None


@dataclass(frozen=True)
class Redirect:
    location: str
    permanent: bool


@dataclass(frozen=True)
class Page:
    """A rendered page and the headers to send with it (ETag: signed digest and media type)."""

    body: bytes
    content_type: str
    etag: str
    headers: Mapping[str, str]


@dataclass(frozen=True)
class KeptFile:
    """A small verified file in memory: its bytes, their sha256, and the headers aiohttp's ``FileResponse``
    sends for the blob they were read from (its ETag and Last-Modified come from that file's stat)."""

    body: bytes
    sha256: str
    mtime_ns: int  # of the blob file when read: the ETag's, and a replaced file's tell
    headers: Mapping[str, str]


class _PagePlan(NamedTuple):
    route: str
    media: index.MediaType
    target_path: str


class _FilePlan(NamedTuple):
    route: str
    kind: str  # the cache metrics' label
    lookup_path: str  # the signed target the file's source derives from: its own, or its page's
    target_path: str


@dataclass(frozen=True)
class NotModified:
    """The client holds the page the trusted metadata vouches for now: 304 with these headers."""

    headers: Mapping[str, str]


class CachedFile:
    """A verified blob, pinned in the store from the decision until :meth:`release`."""

    def __init__(self, store: BlobStore, blob: Blob) -> None:
        self.store = store
        self.blob = blob
        store.pin(blob.sha256)
        self._pinned = True

    def release(self) -> None:
        if self._pinned:
            self._pinned = False
            self.store.unpin(self.blob.sha256)

    def __enter__(self) -> CachedFile:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


@dataclass(frozen=True)
class Streamed:
    """A cold download to stream: ``length`` is exact when signed, else None (chunked)."""

    download: Download
    length: int | None
    served: Callable[[Blob], None]  # call once the whole verified file went out
    # For a follower whose fetch failed for an upstream reason before it sent a byte: one fresh fetch.
    again: Callable[[], Download] | None


@dataclass(frozen=True)
class Refused:
    error: BaseException


Decision = Redirect | Page | NotModified | CachedFile | Streamed | Refused


@dataclass(frozen=True)
class _Source:
    """What a file must be and where to fetch it."""

    want: Want
    role: str
    urls: list[str]


class _AuditingObserver(Observer):
    """Each mirror attempt as a metric; each lie as an audit record naming the request."""

    def __init__(self, resolver: Resolver, asker: Asker) -> None:
        self.resolver = resolver
        self.asker = asker

    def attempt(self, mirror: int, outcome: str, nbytes: int, seconds: float) -> None:
        m = self.resolver.metrics
        m.upstream_fetches.labels(str(mirror), outcome).inc()
        m.upstream_seconds.labels(str(mirror)).observe(seconds)
        if nbytes:
            m.upstream_bytes.labels(str(mirror)).inc(nbytes)

    def refused(self, error: RepositoryError, url: str) -> None:
        self.resolver.refusals.record(self.asker, error, url)


class Resolver:
    """Decides every request of the Simple API and files; knows nothing of HTTP."""

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
        on_miss: OnMiss | None = None,
        ask_ahead: Callable[[str], None] | None = None,
        missing: Missing | None = None,
        page_fetcher: Fetcher | None = None,
        shared: SharedTier | None = None,
        provenance: EdgeProvenance | None = None,
    ) -> None:
        self.trust = trust
        self.provenance = provenance  # --verify-provenance
        self.fetcher = fetcher
        # Pages are small and every resolve needs them: give them a pool file downloads cannot fill.
        self.page_fetcher = page_fetcher or fetcher
        self.store = store
        self.pages = pages
        self.audit = audit
        self.metrics = metrics
        self.settings = settings
        self.profile = profile
        self.on_miss = on_miss
        self.ask_ahead = ask_ahead  # a miss asked of the gateway before the lookup has read what it needs
        self.missing = missing
        self.refusals = Refusals(audit, metrics, trust)
        # URL prefixes a verified page may point files at (warehouse profile): the mirrors
        # and any file host the operator named. Anything else is never fetched.
        self.file_origins = tuple(m.targets_url for m in trust.mirrors) + file_origins
        self.downloads = Downloads(store, fetcher, settings.pace, settings.unknown_length_downloads, shared=shared)
        self._hot: HotPages[Page] = HotPages()
        self._files: HotPages[KeptFile] = HotPages(max_entries=4096, max_bytes=KEPT_FILES_BYTES)
        # Verified raw pages by cache key: a file's request reads its page, and so does its read-ahead.
        self._raw: HotPages[bytes] = HotPages(max_entries=1024, max_bytes=_RAW_BYTES)
        # A root list rendered from the bins (a layout that signs none): (its projects, media type, page).
        self._root_kept: tuple[tuple[str, ...], index.MediaType, Page] | None = None
        # (path, Accept) -> what ready() needs of a request (pure, like _parse_path and _negotiate).
        self._ready_plans: dict[tuple[str, str | None], _PagePlan | _FilePlan | None] = {}
        # Request target path -> (the trusted target it was derived from, its source).
        self._sources: dict[str, tuple[VerifiedTarget, _Source]] = {}
        # Blobs and pages re-hashed since this process started: the cheap trigger for bit-rot checks.
        self._rechecked: set[str] = set()
        self._ahead = ReadAheads(settings.read_ahead)
        self._ahead_tasks: set[asyncio.Task[None]] = set()
        self._page_writes: set[asyncio.Future[None]] = set()
        self._page_write_bytes = 0
        self._keeping: set[asyncio.Future[bool]] = set()  # small cold files read into memory once sent

    async def resolve(self, ask: Ask) -> Decision:
        """The decision for ``ask``; never raises a refusal, returns it."""
        try:
            return await self._resolve(ask)
        except (TrustError, StoreError, AuditWriteError, ClientMistake) as e:
            return Refused(e)

    async def _resolve(self, ask: Ask) -> Decision:
        try:
            req = _parse_path(ask.path)
        except BadRequestPath as e:
            if ask.path in ("/", ""):
                return Redirect("simple/", permanent=False)
            ask.route = "bad_path"
            raise BadPath(str(e)) from None
        ask.route = _ROUTES[req.kind]
        if req.kind in _PAGE_KINDS:
            if req.redirect_to is not None:
                return Redirect(req.redirect_to, permanent=True)
            return await self._page(ask, req)
        return await self._file(ask, req)

    # -- pages ---------------------------------------------------------
    def ready(self, path: str, accept: str | None, if_none_match: str | None,
              conditional: bool = False) -> tuple[str, Page | NotModified | KeptFile] | None:
        """The route and answer of a request that is ready now, with no wait: its target remembered
        under the live trusted state (expiry checked now) and its page kept rendered (or the client's
        ETag naming it), or its file kept in memory.  ``conditional``: the request carries Range or a
        condition a file's answer depends on.  None: :meth:`resolve` it (which may fetch, wait or refuse).
        """
        plans, key = self._ready_plans, (path, accept)
        if key in plans:
            plan = plans[key]
        else:
            plan = self._ready_plan(path, accept)
            if len(plans) >= _READY_PLANS_SIZE:
                del plans[next(iter(plans))]
            plans[key] = plan
        if plan is None:
            return None
        if isinstance(plan, _FilePlan):
            # A file's conditions (a part, a tag, a date) are FileResponse's to answer.
            return None if conditional or if_none_match is not None else self._ready_file(plan)
        route, media, target_path = plan
        target = self.trust.remembered(target_path)
        if target is None or marked_private(target.custom):
            return None
        answer = self._kept(target, media, if_none_match)
        return None if answer is None else (route, answer)

    def _ready_file(self, plan: _FilePlan) -> tuple[str, KeptFile] | None:
        """A kept file, if the source it was checked against derives from the target trusted now."""
        target = self.trust.remembered(plan.lookup_path)
        if target is None or marked_private(target.custom):
            return None
        known = self._sources.get(plan.target_path)
        kept = self._files.get(plan.target_path)
        if known is None or known[0] is not target or kept is None or kept.sha256 != known[1].want.hashes.get("sha256"):
            return None
        # Still stored, as the same file (its use recorded, as a store hit's is): else the ETag
        # kept is not FileResponse's any more, or the blob went; the full path answers.
        blob = self.store.get(kept.sha256, len(kept.body))
        if blob is None or blob.mtime_ns != kept.mtime_ns:
            return None
        self.metrics.hit(plan.kind)
        return plan.route, kept

    def _ready_plan(self, path: str, accept: str | None) -> _PagePlan | _FilePlan | None:
        """What ready() needs of a page or file request (see :class:`_PagePlan`, :class:`_FilePlan`);
        None for any other request, and for files whose every answer must go through :meth:`_file`."""
        try:
            req = _parse_path(path)
            if req.kind in (TargetKind.FILE, TargetKind.CORE_METADATA):
                return self._file_plan(req)
            if req.kind not in _PAGE_KINDS or req.redirect_to is not None:
                return None
            if req.kind is TargetKind.ROOT_INDEX and not self.profile.root_list_signed:
                return None  # listed from every bin, never ready without a look
            media, _, target_path = self._page_plan(req, accept)
        except (BadRequestPath, ClientMistake):
            return None
        return _PagePlan(_ROUTES[req.kind], media, target_path)

    def _file_plan(self, req: TargetRequest) -> _FilePlan | None:
        # Each answer of these is audited, or checked again: never from memory.
        if self.audit.log_accepted or (self.provenance is not None and req.kind is TargetKind.FILE):
            return None
        target_path = req.target_path()
        if self.profile.files_are_targets:
            lookup = target_path
        else:
            assert req.project is not None
            lookup = self.profile.page_target(req.project, self.profile.signed_formats[0])
        kind = "metadata" if req.kind is TargetKind.CORE_METADATA else "file"
        return _FilePlan(_ROUTES[req.kind], kind, lookup, target_path)

    async def _page(self, ask: Ask, req: TargetRequest) -> Page | NotModified:
        if req.kind is TargetKind.ROOT_INDEX and not self.profile.root_list_signed:
            return await self._listed_root(ask)
        media, source, target_path = self._page_plan(req, ask.accept)
        if req.kind is TargetKind.ROOT_INDEX:
            ask.target = target_path
            target = await self.trust.get_target(target_path)
        else:
            assert req.project is not None
            target = await self._page_target(ask, req.project, source)
        answer = self._kept(target, media, ask.if_none_match)
        if answer is not None:
            return answer
        raw = await self._page_bytes(ask, target)
        fmt = _FORMATS[media]
        try:
            body = _render(req, raw, source, fmt)
        except index.IndexParseError as e:
            raise _Malformed(target.path, str(e)) from e
        etag = _etag(_first_hash(target), media)
        page = Page(body, CONTENT_TYPES[media], etag,
                    {"Content-Type": CONTENT_TYPES[media], "Vary": "Accept", "ETag": etag})
        self._hot.put((target.path, _first_hash(target), media.value), page, len(body))
        return page

    async def _listed_root(self, ask: Ask) -> Page | NotModified:
        """The root list of a layout that signs none: the public projects whose page target the verified
        metadata holds (every bin walked; after a publish only the bins it changed), rendered here."""
        media = _negotiate(ask.accept)
        if media is None:
            raise NotAcceptable(ask.accept or "")
        listed = await self.trust.listed(self.profile.page_project)
        names = tuple(project for project, target in listed if not marked_private(target.custom))
        kept = self._root_kept
        if kept is None or kept[0] != names or kept[1] is not media:
            plist = index.ProjectList(projects=names)
            json_wanted = media is index.MediaType.JSON_V1
            body = index.render_project_list_json(plist) if json_wanted else index.render_project_list_html(plist)
            etag = _etag(hashlib.sha256(body).hexdigest(), media)
            page = Page(body, CONTENT_TYPES[media], etag, {"Content-Type": CONTENT_TYPES[media], "Vary": "Accept", "ETag": etag})
            kept = self._root_kept = (names, media, page)
        page = kept[2]
        if ask.if_none_match is not None and _etag_matches(ask.if_none_match, page.etag):
            return NotModified(_not_modified_headers(page.etag))
        return page

    def _page_plan(self, req: TargetRequest, accept: str | None) -> tuple[index.MediaType, PageFormat, str]:
        """A page request's media type (negotiated), the signed format it is rendered from, and its target path."""
        media = _negotiate(accept)
        if media is None:
            raise NotAcceptable(accept or "")
        source = self.profile.page_source_format(_FORMATS[media])
        if req.kind is TargetKind.ROOT_INDEX:
            target_path = self.profile.root_target(_FORMATS[media])
            assert target_path is not None  # else listed from the bins (_listed_root)
            return media, source, target_path
        assert req.project is not None
        return media, source, self.profile.page_target(req.project, source)

    def _kept(self, target: VerifiedTarget, media: index.MediaType, if_none_match: str | None) -> Page | NotModified | None:
        """The answer without the page's bytes: 304 when ``If-None-Match`` names the page ``target``
        vouches for, else the page if it is kept rendered; None: render it."""
        digest = _first_hash(target)
        page = self._hot.get((target.path, digest, media.value))
        if page is not None:
            self.metrics.hit("page")
        if if_none_match is not None:
            etag = page.etag if page is not None else _etag(digest, media)
            if _etag_matches(if_none_match, etag):
                return NotModified(_not_modified_headers(etag))
        return page

    async def _page_target(self, ask: Ask, project: str, fmt: PageFormat) -> VerifiedTarget:
        """A project page's signed target; an unknown one is offered to ``on_miss`` once.

        ``on_miss`` returning False means "still unknown" (404); True (or None,
        for hooks that signal only by raising) means "look up once more".
        """
        path = self.profile.page_target(project, fmt)
        ask.target = path
        started = time.monotonic()
        lookup: Awaitable[VerifiedTarget] = self.trust.get_target(path)
        if self.ask_ahead is not None and self.trust.remembered(path) is None:
            lookup = asyncio.ensure_future(lookup)
            lookup.add_done_callback(lambda t: t.cancelled() or t.exception())  # read here, or by nobody
            try:
                await asyncio.sleep(0)  # one step: a lookup of roles already read ends in it
            except asyncio.CancelledError:
                lookup.cancel()
                raise
            if not lookup.done():  # it reads a role first (a bin-n): a miss would wait for that, then ask
                self.ask_ahead(project)
        try:
            target = await lookup
        except UnknownTarget:
            # Phases of a miss only: a warm answer names none, so it is the same whichever path sends it.
            timing.record("lookup", time.monotonic() - started)
            if self.on_miss is None or await self.on_miss(project) is False:
                raise
            with timing.phase("relookup"):  # its bin-n, as the metadata refreshed for the miss names it
                target = await self.trust.get_target(path)
        if marked_private(target.custom) and not (ask.private_ok is not None and ask.private_ok(project)):
            # Exactly what a project no index lists gets: a client that may not read it cannot tell.
            if self.on_miss is None:
                raise UnknownTarget(path)
            raise UnknownTarget(f"simple/{project}/", detail=f"gateway: {not_listed(project)}")
        return target

    async def _page_bytes(self, ask: Ask, target: VerifiedTarget) -> bytes:
        """A page's verified bytes: from the page cache (re-hashed at first use here), or fetched."""
        algorithm, digest = next(iter(accepted_hashes(target.path, target.hashes, target.role).items()))
        cache_key = IndexCache.key(target.path, algorithm, digest)
        data = self._raw.get(cache_key)
        if data is not None:
            self.metrics.hit("page")
            return data
        data = await asyncio.to_thread(self.pages.get, cache_key)
        if data is not None:
            if cache_key not in self._rechecked:
                try:
                    verify_bytes(target.path, target.hashes, target.length, data, role=target.role)
                except RepositoryError:
                    # Someone wrote the cache volume, or bit rot: drop it and fetch again.
                    log.error("cached page %s failed its re-check: dropped, refetching", target.path)
                    await asyncio.to_thread(self.pages.delete, cache_key)
                    data = None
                else:
                    self._rechecked.add(cache_key)
            if data is not None:
                self.metrics.hit("page")
                self._raw.put(cache_key, data, len(data))
                return data
        self.metrics.miss("page")
        if target.length > self.settings.max_page_size:
            raise LengthMismatch(f"{target.path}: signed length {target.length} exceeds the page limit",
                                 target=target.path, expected=self.settings.max_page_size, actual=target.length)
        want, urls, observer = Want.of(target), self.trust.target_urls(target), _AuditingObserver(self, ask)

        def fetch(urls: list[str], observer: Observer) -> Awaitable[bytes]:
            return fetch_bytes(self.page_fetcher, want, urls, pace=self.settings.pace, observer=observer)
        shared = self.downloads.shared
        with timing.phase("page"):
            data = await (fetch(urls, observer) if shared is None else shared.page(algorithm, digest, urls, observer,
                                                                                    fetch))
        self._rechecked.add(cache_key)
        self._raw.put(cache_key, data, len(data))
        await self._write_page(cache_key, data)
        return data

    async def _write_page(self, cache_key: str, data: bytes) -> None:
        """Start storing a verified page on disk; its request is answered from memory meanwhile.

        Waiting for the write cost a cold install's pages up to 33 ms each:
        the workers' writes queue for the page cache's one SQLite write lock.
        At most :data:`_PAGE_WRITES` wait at once, holding at most
        :data:`_PAGE_WRITE_BYTES`; a burst past them waits here.  A page too
        large for the memory it is answered from is written before it is
        answered, so that the next request for it finds it on disk.
        """
        if len(data) > _RAW_BYTES // 4:  # HotPages keeps no value larger than that
            await asyncio.to_thread(self._store_page, cache_key, data)
            return
        while self._page_writes and (len(self._page_writes) >= _PAGE_WRITES
                                     or self._page_write_bytes + len(data) > _PAGE_WRITE_BYTES):
            await asyncio.wait(set(self._page_writes), return_when=asyncio.FIRST_COMPLETED)
        self._page_write_bytes += len(data)
        task = asyncio.ensure_future(asyncio.to_thread(self._store_page, cache_key, data))
        self._page_writes.add(task)

        def done(task: asyncio.Future[None]) -> None:
            self._page_writes.discard(task)
            self._page_write_bytes -= len(data)
            _log_failure("page write", task)

        task.add_done_callback(done)

    def _store_page(self, cache_key: str, data: bytes) -> None:
        try:
            self.pages.set(cache_key, data)
        except StoreError as e:  # the page was answered from memory; this process keeps it there
            log.warning("page %s not stored on disk: %s", cache_key, e)

    # -- files ---------------------------------------------------------
    async def _file(self, ask: Ask, req: TargetRequest) -> CachedFile | Streamed:
        ask.target = req.target_path()
        source = await self._file_source(ask, req)
        if req.kind is TargetKind.CORE_METADATA and self._ahead.at_once:
            self._read_ahead(ask, req)
        want = source.want
        if self.provenance is not None and req.kind is TargetKind.FILE and not self.profile.files_are_targets:
            await self._check_provenance(ask, req, want)
        if want.exact and want.length > self.settings.max_file_size:
            raise LengthMismatch(f"{want.path}: {want.length} bytes is over the --max-file-size limit",
                                 target=want.path, expected=self.settings.max_file_size, actual=want.length)
        kind = "metadata" if want.path.endswith(".metadata") else "file"
        cached = await self._cached(want)
        if cached is not None:
            self.metrics.hit(kind)
            return self._serve(ask, source, cached)
        self.metrics.miss(kind)
        download, joined = self._start(ask, source)
        if not (self.settings.verify_before_send or ask.whole):
            return Streamed(download, want.length if want.exact else None,
                            lambda blob: self._streamed(ask, source, blob),
                            (lambda: self._start(ask, source)[0]) if joined else None)
        try:
            blob = await asyncio.shield(download.result)
        except UPSTREAM_FAILURES:
            if not joined:
                raise
            download, _ = self._start(ask, source)
            blob = await asyncio.shield(download.result)
        return self._serve(ask, source, blob)

    async def _check_provenance(self, ask: Ask, req: TargetRequest, want: Want) -> None:
        """``--verify-provenance``: the file's PEP 740 provenance, verified here (:mod:`proxy.serving.provenance`)."""
        assert self.provenance is not None and req.project is not None and req.filename is not None
        sha256 = want.hashes.get("sha256", "")
        if self.provenance.known(want.path, sha256):
            return
        fmt = self.profile.signed_formats[0]
        page = _parse(await self._page_bytes(ask, await self._page_target(ask, req.project, fmt)), req.project, fmt)
        dist = next((f for f in page.files if f.filename == req.filename), None)
        data = None
        if dist is not None and dist.provenance:
            data = await self._page_bytes(ask, await self.trust.get_target(provenance_target(req.project, req.filename)))
        ask.target = want.path
        await self.provenance.check(req.project, req.filename, want.path, sha256, data)

    def _read_ahead(self, ask: Ask, req: TargetRequest) -> None:
        """Start the file whose ``.metadata`` ``ask`` asked for (:class:`ReadAheads`): verified and stored
        like a request's, so the client's download finds it kept or under way.  A guess: it never refuses."""
        file_req = dataclasses.replace(req, kind=TargetKind.FILE)
        # Its own identity in audit records: no client asked for this file (yet).
        file_ask = dataclasses.replace(ask, request_id=f"{ask.request_id}-ahead", path=f"(read ahead of {ask.path})",
                                       route=_ROUTES[TargetKind.FILE], whole=False, resume=False,
                                       if_none_match=None, audited=False)
        task = asyncio.ensure_future(self._fetch_ahead(file_ask, file_req))
        self._ahead_tasks.add(task)
        task.add_done_callback(self._ahead_tasks.discard)

    async def _fetch_ahead(self, ask: Ask, req: TargetRequest) -> None:
        timing.detach()  # started by a .metadata request, whose answer does not wait for this
        ask.target = req.target_path()
        try:
            source = await self._file_source(ask, req)
        except Exception as e:  # noqa: BLE001 - a guess: the client's own request meets any refusal, and reports it
            log.debug("no read-ahead of %s: %s", ask.target, e)
            return
        want = source.want
        key = _download_key(want)
        if (not want.exact or "sha256" not in want.hashes or want.length > self.settings.max_file_size
                or not self._ahead.admits(key, want.length) or self.downloads.in_flight(key)
                or self.store.get(want.hashes["sha256"], want.length)):
            return
        download, _ = self._start(ask, source)
        self._ahead.started(key, download.result)
        self.metrics.read_ahead.inc()

    async def close(self) -> None:
        """Stop the read-ahead lookups still running (the downloads they started end with the fetcher),
        and let the page writes under way end."""
        for task in self._ahead_tasks:
            task.cancel()
        for keeping in self._keeping:
            keeping.cancel()
        await asyncio.gather(*self._ahead_tasks, *self._keeping, *self._page_writes, return_exceptions=True)

    def _start(self, ask: Ask, source: _Source) -> tuple[Download, bool]:
        want = source.want
        download, joined = self.downloads.start(
            _download_key(want), want, source.urls, _AuditingObserver(self, ask),
            lambda: self.store.get(want.hashes["sha256"], want.length if want.exact else None)
            if "sha256" in want.hashes else None, resume=ask.resume)
        if joined:
            self.metrics.singleflight_joins.inc()
        return download, joined

    async def _cached(self, want: Want) -> Blob | None:
        sha = want.hashes.get("sha256")
        if sha is None:
            return None
        blob = self.store.get(sha, want.length if want.exact else None)
        if blob is None:
            return None
        # A small file is kept in memory for ready(); its read for that is its re-check the first time.
        if blob.size <= KEPT_FILE_MAX and not await self._keep(want, blob):
            return None  # its bytes no longer verify: evicted, fetched anew
        if blob.sha256 in self._rechecked:
            return blob
        with self.store.in_use(blob.sha256):
            sound = await asyncio.to_thread(self.store.verify, blob, dict(want.hashes))
        if not sound:
            log.error("blob %s failed its re-check (bit rot?): evicted, refetching", blob.sha256)
            return None
        self._rechecked.add(blob.sha256)
        return blob

    async def _keep(self, want: Want, blob: Blob) -> bool:
        """Keep a small stored file in memory for :meth:`ready`, read once and verified again against
        ``want``; False if its bytes no longer verify (then it is evicted)."""
        kept = self._files.get(want.path)
        if kept is not None and kept.sha256 == blob.sha256 and kept.mtime_ns == blob.mtime_ns:
            return True
        with self.store.in_use(blob.sha256):
            try:
                kept = await asyncio.to_thread(_read_kept, blob, want)
            except FileNotFoundError:  # another process evicted it since: fetched anew
                return False
            except OSError as e:  # served from the store as before; the store's own checks say why
                log.warning("could not keep %s in memory: %s", want.path, e)
                return True
            except RepositoryError as e:
                log.error("blob %s failed its re-check (bit rot?): evicted, refetching: %s", blob.sha256, e)
                self.store.evict(blob.sha256)
                self._rechecked.discard(blob.sha256)
                return False
        self._files.put(want.path, kept, len(kept.body))
        self._rechecked.add(blob.sha256)
        return True

    def _streamed(self, ask: Ask, source: _Source, blob: Blob) -> None:
        """A cold file went out whole and verified: accepted, and kept in memory if small (in the background)."""
        self._accepted(ask, source, blob)
        if blob.size <= KEPT_FILE_MAX and len(self._keeping) < _KEEPING:
            task = asyncio.ensure_future(self._keep(source.want, blob))
            self._keeping.add(task)
            task.add_done_callback(self._keeping.discard)
            task.add_done_callback(lambda t: _log_failure("keeping a file in memory", t))

    def _serve(self, ask: Ask, source: _Source, blob: Blob) -> CachedFile:
        decision = CachedFile(self.store, blob)  # pinned before any await
        self._accepted(ask, source, blob)
        return decision

    def _accepted(self, ask: Ask, source: _Source, blob: Blob) -> None:
        self._rechecked.add(blob.sha256)
        if self.audit.log_accepted:
            self.audit.accepted(request_id=ask.request_id, client=ask.client, request_path=ask.path,
                                target=source.want.path, role=source.role, length=blob.size,
                                hashes=dict(source.want.hashes))

    async def _file_source(self, ask: Ask, req: TargetRequest) -> _Source:
        """What a file must be, and its URLs: its own target, or its entry on the verified page.

        Remembered per request path for as long as the trust core answers with
        the same target object, i.e. while the trusted state that vouched for
        it is live (the lookup itself, with its expiry check, runs every time).
        A signed target's length is exact; through a page,
        :mod:`proxy.trust.pagefiles` decides (PEP 700 ``size`` exact, else a bound).
        """
        path = req.target_path()
        if self.profile.files_are_targets or req.kind is TargetKind.PROVENANCE:
            target = await self.trust.get_target(path)
        else:
            assert req.project is not None
            target = await self._page_target(ask, req.project, self.profile.signed_formats[0])
            ask.target = path
        known = self._sources.get(path)
        if known is not None and known[0] is target:
            return known[1]
        source = await self._new_file_source(ask, req, target)
        if len(self._sources) >= _SOURCES_SIZE:
            del self._sources[next(iter(self._sources))]
        self._sources[path] = (target, source)
        return source

    async def _new_file_source(self, ask: Ask, req: TargetRequest, target: VerifiedTarget) -> _Source:
        """:meth:`_file_source` for ``target``: the file's own, or its project page's."""
        path = req.target_path()
        if self.profile.files_are_targets or req.kind is TargetKind.PROVENANCE:
            hashes = accepted_hashes(path, target.hashes, target.role)
            return _Source(Want(path, hashes, target.length, True, target.role), target.role,
                           self.trust.target_urls(target))
        assert req.project is not None and req.filename is not None
        page_target = target
        raw = await self._page_bytes(ask, page_target)
        try:
            page = _parse(raw, req.project, self.profile.signed_formats[0])
        except index.IndexParseError as e:
            raise _Malformed(page_target.path, str(e)) from e
        dist = next((f for f in page.files if f.filename == req.filename), None)
        if dist is None:
            raise UnknownTarget(path, await self.missing(req.project, req.filename) if self.missing else None)
        core = req.kind is TargetKind.CORE_METADATA
        want = file_want(path, page_target, dist, core=core, max_file_size=self.settings.max_file_size,
                         max_core_metadata_size=self.settings.max_core_metadata_size)
        urls = file_urls(path, self.trust.target_urls(page_target), dist, core=core, origins=self.file_origins)
        return _Source(want, want.role or "", urls)


class _Malformed(RepositoryError):
    """A page whose bytes verified but which is not a Simple API page."""

    reason = "malformed-page"

    def __init__(self, target: str, detail: str) -> None:
        super().__init__(f"{target}: signed page does not parse: {detail}", target=target)


def _first_hash(target: VerifiedTarget) -> str:
    return _first_hash_of(target.hashes)


def _first_hash_of(hashes: Mapping[str, str]) -> str:
    return next(iter(hashes.values()))


def _download_key(want: Want) -> str:
    return f"{want.path}@{_first_hash_of(want.hashes)}"


_MEDIA_TAGS = {index.MediaType.JSON_V1: "json", index.MediaType.HTML_V1: "html1", index.MediaType.HTML: "html"}


def _etag(digest: str, media: index.MediaType) -> str:
    """A page's ETag: the signed digest it was rendered from, and the media type it was rendered as."""
    return f'"{digest[:40]}-{_MEDIA_TAGS[media]}"'


def _log_failure(what: str, task: asyncio.Future[Any]) -> None:
    """A background task's failure, said (nothing else reads it); nothing was served from it."""
    if not task.cancelled() and (e := task.exception()) is not None:
        log.warning("%s failed: %s: %s", what, type(e).__name__, e)


def _read_kept(blob: Blob, want: Want) -> KeptFile:
    """A stored blob's bytes, verified against ``want`` and its name (RepositoryError if they are not
    those), and the headers aiohttp's ``FileResponse`` builds from its stat."""
    with open(blob.path, "rb") as f:
        st = os.fstat(f.fileno())
        body = f.read(blob.size + 1)
    verify_bytes(want.path, {**want.hashes, "sha256": blob.sha256}, blob.size, body, role=want.role)
    return KeptFile(body, blob.sha256, st.st_mtime_ns, {**FILE_HEADERS, **file_validators(st), "Accept-Ranges": "bytes"})


def _etag_matches(if_none_match: str, etag: str) -> bool:
    """RFC 9110 weak comparison of ``If-None-Match`` with the current ETag (``*`` matches any)."""
    if if_none_match.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in if_none_match.split(",", 64))


@functools.lru_cache(maxsize=1024)
def _not_modified_headers(etag: str) -> Mapping[str, str]:
    return {"ETag": etag, "Vary": "Accept"}


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
    # PEP 740: a file whose signed page names provenance gets ours, the signed target this proxy verifies.
    page = dataclasses.replace(page, files=tuple(
        dataclasses.replace(f, provenance=f"{f.url}{PROVENANCE_SUFFIX}" if f.provenance else None) for f in page.files))
    if fmt is PageFormat.JSON and not page.versions:
        # An HTML page has no PEP 700 versions list: derive it from the file names.
        versions = dict.fromkeys(v for f in page.files if (v := version_of_filename(f.filename)))
        page = dataclasses.replace(page, versions=tuple(versions))
    return index.render_project_json(page) if fmt is PageFormat.JSON else index.render_project_html(page)
