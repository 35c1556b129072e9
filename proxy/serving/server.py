"""The HTTP face of the proxy: thin aiohttp handlers that send what the resolver decided.

:class:`~proxy.serving.resolver.Resolver` decides every Simple API and file
request (no aiohttp there); this module turns its decision into a
response: a page, a pinned blob (sendfile, ``Range``, ``If-None-Match``,
``HEAD``), a cold file streamed as it arrives, or a refusal answered as
:mod:`proxy.serving.refusals` says (status, reason phrase pip prints, audit
record, metric).  It also serves ``/metrics``, ``/healthz`` and ``/readyz``.

A streamed cold file holds back its final byte until every signed hash
matched (:mod:`proxy.serving.streaming`, shared with the gateway); on a refusal
the connection is reset instead (the refusal is still counted and audited
as the table says), so no client ever holds a complete file that was not
verified.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from packaging.utils import canonicalize_name

from proxy.protocol.access import project_of
from proxy.protocol.errors import StoreError, TrustError
from proxy.protocol.layout import is_valid_project_name
from proxy.protocol.requesthead import SimpleHead
from proxy.serving import hotpath
from proxy.serving.access import USER, AccessMiddleware, Resource, refusals_counter
from proxy.serving.guard import ANONYMOUS_USER, Guard, User
from proxy.serving.listener import Limits, Listener
from proxy.serving.refusals import Answer
from proxy.serving.resolver import (
    FILE_HEADERS,
    UPSTREAM_FAILURES,
    Ask,
    CachedFile,
    KeptFile,
    NotModified,
    Page,
    Redirect,
    Refused,
    Resolver,
    Streamed,
)
from proxy.serving.streaming import first_bytes, over_tls, send_download, send_file_over_tls
from proxy.util import timing
from proxy.util.logs import new_request_id, request_id
from proxy.util.metrics import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)
# The route a request resolved to (the resolver knows it better than the router), for the request metrics.
ROUTE = web.RequestKey("route", str)
# Headers that need the whole file on disk (FileResponse answers them): no streaming then.
_WHOLE_FILE_HEADERS = ("Range", "If-None-Match", "If-Modified-Since", "If-Range", "If-Match", "If-Unmodified-Since")


class Proxy:
    """The aiohttp application over a :class:`~proxy.serving.resolver.Resolver`."""

    def __init__(self, resolver: Resolver, guard: Guard | None = None, allow_anonymous_private: bool = False,
                 why: Callable[[str], Awaitable[dict[str, Any]]] | None = None) -> None:
        self.resolver = resolver
        self.why = why  # the gateway's answer to "why is this not offered" (gateway profile), relayed
        # Access control (None: everyone is anonymous; private projects are then served to nobody unless
        # the operator allowed anonymous access to them).
        self.guard = guard
        self.allow_anonymous_private = allow_anonymous_private
        self._said_unguarded = False
        self.access = AccessMiddleware(guard, _resource, resolver.audit, refusals_counter(resolver.metrics.registry)) \
            if guard is not None else None
        self.trust = resolver.trust
        self.store = resolver.store
        self.metrics = resolver.metrics
        self.settings = resolver.settings
        self._evictions_reported = 0
        self.connections: Listener | None = None  # set by listener()
        # Set when the layout assumed at start-up turns out not to be the signed metadata's: /readyz says so.
        self.layout_problem: str | None = None

    def listener(self, limits: Limits, **kwargs: Any) -> Listener:
        """The listener for :meth:`app` (:mod:`proxy.serving.listener`: its connections under ``limits``),
        answering ready pages below aiohttp's web layer; /readyz reports its accept failures."""
        self.connections = Listener(self.app(), limits, registry=self.metrics.registry, ready=self._ready, **kwargs)
        return self.connections

    def _ready(self, head: SimpleHead, protocol: Any) -> bytes | None:
        """The hot path's answer: a page or small file the resolver has ready, counted as the middleware
        counts every request; None: aiohttp takes it."""
        start = time.monotonic()
        if self.guard is not None:
            # Only what is certain at once: a user proved lately (or anonymous) whom the rules allow. Anything
            # else (a password to check, a refusal to audit) is aiohttp's; private pages are never ready().
            user = self.guard.remembered(head.authorization)
            if user is None or self.guard.authorize(user, project_of(head.path)) is not None:
                return None
        ready = self.resolver.ready(head.path, head.accept, head.if_none_match, head.conditional)
        if ready is None:
            return None
        route, answer = ready
        if isinstance(answer, (Page, KeptFile)):
            status, body = 200, answer.body
        else:
            status, body = 304, b""
        data = hotpath.response(status, answer.headers, body, new_request_id(head.request_id), head.method == "HEAD")
        self.metrics.hot_request(route, status, time.monotonic() - start)
        return data

    def app(self) -> web.Application:
        middlewares = [self._middleware] if self.access is None else [self._middleware, self.access.middleware]
        app = web.Application(middlewares=middlewares)
        app.router.add_get("/metrics", self._metrics, name="metrics")
        app.router.add_get("/healthz", self._healthz, name="healthz")
        app.router.add_get("/readyz", self._readyz, name="readyz")
        app.router.add_get("/_tufproxy/why/{project}", self._why, name="why")
        app.router.add_get("/{tail:.*}", self._dispatch, name="simple")
        return app

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        start = time.monotonic()
        rid = new_request_id(request.headers.get("X-Request-Id"))
        token = request_id.set(rid)
        phases = timing.collect()
        try:
            response = await handler(request)
        except web.HTTPException as e:
            response = e
        finally:
            request_id.reset(token)
        route = request.get(ROUTE, request.match_info.route.name or "other")
        response.headers["X-Request-Id"] = rid
        # A page a miss waited for says where the wait went; an answer already on the wire (a file) cannot.
        if not response.prepared and (value := timing.header_for(response.status, phases)) is not None:
            response.headers["Server-Timing"] = value
        self.metrics.request(route, response.status, time.monotonic() - start)
        if isinstance(response, web.HTTPException):
            raise response
        return response

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        headers = request.headers
        ask = Ask(request_id=request_id.get(), client=request.remote, path=request.rel_url.raw_path,
                  accept=headers.get("Accept"), if_none_match=headers.get("If-None-Match"),
                  whole=request.method == "HEAD" or _asks_whole_file(headers), resume="Range" in headers,
                  private_ok=self._private_ok(request.get(USER, ANONYMOUS_USER)))
        decision = await self.resolver.resolve(ask)
        request[ROUTE] = ask.route
        if isinstance(decision, Refused):
            return self._refused(ask, decision.error)
        if isinstance(decision, Redirect):
            raise (web.HTTPMovedPermanently if decision.permanent else web.HTTPFound)(decision.location)
        if isinstance(decision, Page):
            return web.Response(body=decision.body, headers=decision.headers)
        if isinstance(decision, NotModified):
            return web.Response(status=304, headers=decision.headers)
        if isinstance(decision, CachedFile):
            if not ask.whole and over_tls(request):
                try:
                    return await send_file_over_tls(request, decision.blob.path, decision.blob.size, _file_headers())
                finally:
                    decision.release()
            return _PinnedFileResponse(decision)
        return await self._stream(request, ask, decision)

    def _private_ok(self, user: User) -> Callable[[str], bool]:
        if self.guard is None:
            return self._unguarded_private
        return lambda project: self.guard.may_read_private(user, project)  # type: ignore[union-attr]

    def _unguarded_private(self, project: str) -> bool:
        """Without --auth-file nobody is authenticated: private projects go to nobody (said once, for the operator)."""
        if not self.allow_anonymous_private and not self._said_unguarded:
            self._said_unguarded = True
            log.warning("the gateway marks some projects private and this edge has no --auth-file: it serves them "
                        "to nobody (see the access control guide)")
        return self.allow_anonymous_private

    def _refused(self, ask: Ask, error: BaseException) -> web.Response:
        return _answer(self.resolver.refusals.answer(ask, error))

    async def _stream(self, request: web.Request, ask: Ask, decision: Streamed) -> web.StreamResponse:
        """Send a cold file as it arrives, the final byte only once it is verified."""
        download, again = decision.download, decision.again
        while True:
            first = await first_bytes(download, joined=again is not None)
            sent = first if first is not None else await send_download(request, download, _file_headers(),
                                                                        decision.length)
            if not isinstance(sent, BaseException):
                break
            if again is None or not isinstance(sent, UPSTREAM_FAILURES):
                return self._refused(ask, sent)
            # A joined fetch failed for an upstream reason before any byte went out: one fetch of its own.
            download, again = again(), None
        response, blob = sent
        if blob is not None:
            decision.served(blob)
        elif download.result.done() and not download.result.cancelled() and download.result.exception():
            # Too late for a status: the refusal still gets its metric, audit record and log line.
            self.resolver.refusals.answer(ask, download.result.exception())  # type: ignore[arg-type]
        return response

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
        if self.connections is not None:
            self.connections.connections.report()
        # The store counts evictions itself; the counter catches up at each scrape.
        self.metrics.cache_evictions.inc(self.store.evictions - self._evictions_reported)
        self._evictions_reported = self.store.evictions

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _why(self, request: web.Request) -> web.StreamResponse:
        """``tufproxy why --edge``: the gateway's account of a project, asked through this edge (same access rules)."""
        project = request.match_info["project"]
        if not is_valid_project_name(project):
            return _why_failed(400, "bad-project-name", f"not a project name: {project[:100]!r}")
        if self.why is None:
            return _why_failed(404, "no-gateway", "this edge reads no tufproxy gateway: ask its upstream's operator")
        try:
            return web.json_response(await self.why(canonicalize_name(project)))
        except TrustError as e:
            return _why_failed(502, e.reason, str(e)[:500])

    async def _readyz(self, request: web.Request) -> web.Response:
        """Ready: trusted metadata unexpired, cache writable (and the bucket reachable), an upstream reached lately."""
        status = self.trust.status()
        problems = []
        if not status["ready"]:
            problems.append("no unexpired trusted metadata")
        if self.layout_problem is not None:
            problems.append(self.layout_problem)
        accepting = self.connections.connections.problem() if self.connections is not None else None
        if accepting is not None:
            problems.append(accepting)
        last = status.get("last_refresh")
        if last is None or time.time() - last > self.settings.upstream_freshness:
            problems.append(f"no successful metadata refresh in {self.settings.upstream_freshness:.0f}s"
                            + (f" (last error: {status['last_error']}: {status.get('last_error_message')})"
                               if status.get("last_error") else ""))
        try:
            await asyncio.to_thread(self.store.probe_writable)
        except StoreError as e:
            problems.append(f"cache not writable: {e}")
        shared = self.resolver.downloads.shared
        if shared is not None:
            try:
                await shared.probe()
            except StoreError as e:
                problems.append(f"shared bucket unreachable: {e}")
        body = {
            "ready": not problems,
            "problems": problems,
            "roles": {r: {"version": i["version"], "expires": str(i["expires"])} for r, i in status["roles"].items()},
            "last_refresh": last,
        }
        return web.json_response(body, status=200 if not problems else 503)


_OPEN = frozenset(("/healthz", "/readyz", "/metrics"))


def _why_failed(status: int, reason: str, detail: str) -> web.Response:
    return web.json_response({"reason": reason, "detail": detail}, status=status, headers={"X-Tufproxy-Reason": reason})


def _resource(request: web.Request) -> Resource | None:
    """What a request asks of access control: nothing for health and metrics (they name no project)."""
    path = request.rel_url.path
    return None if path in _OPEN else Resource(project_of(path))


def _asks_whole_file(headers: Any) -> bool:
    for name in _WHOLE_FILE_HEADERS:  # noqa: SIM110 - a loop, not any(): this runs on every request
        if name in headers:
            return True
    return False


def _file_headers() -> dict[str, str]:
    """A file answer's headers, X-Request-Id included: an answer sent as it streams is on the wire
    before the middleware could add it."""
    return {**FILE_HEADERS, "X-Request-Id": request_id.get()}


def _answer(answer: Answer) -> web.Response:
    return web.Response(status=answer.status, reason=answer.phrase, text=answer.text + "\n", headers=answer.headers)


class _PinnedFileResponse(web.FileResponse):
    """aiohttp's FileResponse (sendfile, Range, If-None-Match, HEAD) of a decision's pinned blob,
    released once sent so eviction cannot pull it away mid-response."""

    def __init__(self, decision: CachedFile) -> None:
        super().__init__(decision.blob.path, headers=FILE_HEADERS)
        self._decision = decision

    async def prepare(self, request: web.BaseRequest):
        try:
            return await super().prepare(request)
        finally:
            self._decision.release()
