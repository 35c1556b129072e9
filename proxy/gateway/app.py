"""The gateway's HTTP face: the signed tree, the miss protocol, files on demand, operations.

Routes:

* ``GET /metadata/<file>``: TUF metadata; ``timestamp.json`` and
  ``root.json`` with ``Cache-Control: no-cache``, versioned files immutable.
* ``GET /simple/...``: the signed pages and the root list (consistent
  ``HASH.index.*`` names for edges and mirror syncs, plain names for pip
  pointed straight at the gateway; an unpublished project's plain page is
  published first).
* ``GET /packages/<p>/<file>[.metadata]``: from the tree, else streamed from
  the index and checked against its pin (:mod:`proxy.gateway.files`).

A follower of a replica group (``--leader-lease``) answers metadata and
pages from the group's bucket, where the leader publishes, not from its own
directory (which the leader's tree is not); an unpublished project's plain
page is published by the leader first.
* ``GET /_tufproxy/why/<project>``: what a publish would offer and what the
  policy hides, by rule (``tufproxy why``).
* ``POST /_tufproxy/publish/<project>``: the miss protocol (docs/concepts/gateway-design.md):
  200 ``{"project", "timestamp_version"}`` once a timestamp carrying
  the project is written, with ``"expect": {"roles", "targets"}`` when this
  process signed its page lately (the snapshot, bin-n and page targets an
  edge then fetches side by side, :class:`~proxy.gateway.publisher.Foresight`),
  and ``"given"`` (their bytes, the timestamp's where this replica serves its
  own tree, and whether the root after ``root=N`` exists) when asked with
  ``given=1``; neither when ``have=T`` says the edge's timestamp already
  carries the page (an ask ahead of its lookup); 404 ``{"project", "reason"}`` when no index lists
  it; 502 when the index's answer was refused or unreachable.  An answer
  for which this request published (this one, or a plain page published
  first) carries ``Server-Timing`` (:mod:`proxy.util.timing`, set by the
  middleware; a follower relays its leader's):
  ``index`` (the page fetched and screened), ``accept`` (policy, pins,
  rendering), ``batch-wait``, ``sign`` and ``write`` (its batch's files and
  fsyncs), in milliseconds.
* ``/healthz``, ``/readyz``, ``/metrics``.

Refusals map to status by whose fault they are, in :func:`_status`: the
index lied (502), the index is unreachable (502, reason
``upstream-unreachable``), not found (404), our resources (503), the
online key cannot sign (503, ``signing-unavailable``: the token or KMS is
gone; the last signed tree is still served).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import mimetypes
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from aiohttp import web
from packaging.utils import canonicalize_name

from proxy.gateway.files import FileSource
from proxy.gateway.forward import Forwarder
from proxy.gateway.service import Gateway, NotListed
from proxy.protocol import index, refusals
from proxy.protocol.layout import PROVENANCE_SUFFIX, is_valid_filename, is_valid_project_name
from proxy.serving.access import AccessMiddleware, Resource
from proxy.serving.listener import Connections
from proxy.storage.pagecache import HotPages
from proxy.transport.bucket import Bucket
from proxy.transport.upstream import ByteStream, DownloadHTTPError
from proxy.util import timing
from proxy.util.logs import new_request_id, request_id
from proxy.util.metrics import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

PUBLISH_PREFIX = "/_tufproxy/publish/"
WHY_PREFIX = "/_tufproxy/why/"
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]{0,254}")
_VERSIONED_METADATA = re.compile(r"[0-9]+\.[^/]+\.json")
_VERSION = re.compile(r"[0-9]{1,19}")  # a version an edge's publish names (ASCII digits only)
_NO_CACHE = {"Cache-Control": "no-cache"}
MAX_TREE_OBJECT = 256 << 20  # a signed page or metadata file read from the bucket (the root list is the largest)
_IMMUTABLE = {"Cache-Control": "public, max-age=31536000, immutable"}


class GatewayApp:
    """aiohttp application over a :class:`Gateway` and its tree."""

    def __init__(self, gateway: Gateway, files: FileSource, public_dir: Path, started: float | None = None,
                 access: AccessMiddleware | None = None) -> None:
        self.gateway = gateway
        self.access = access
        self.files = files
        self.public_dir = public_dir
        self.metrics = gateway.metrics
        self.started = started or time.time()
        self.connections: Connections | None = None  # the listener's, once it listens
        self.forwarder: Forwarder | None = None  # a replica of a group (--leader-lease)
        # The start-up check's fix when the index links files where the gateway may not fetch them.
        self.files_origin_problem: str | None = None
        # The root page, rendered from the catalog (no root list is signed): ((timestamp version, name), bytes).
        self._root_list: tuple[tuple[int, str], bytes] | None = None
        # Project pages rendered as HTML from their JSON page, by that page's sha256 (a new page, a new key).
        self._html: HotPages[bytes] = HotPages(max_entries=256, max_bytes=HTML_PAGES_BYTES)

    def app(self) -> web.Application:
        middlewares = [self._middleware] if self.access is None else [self._middleware, self.access.middleware]
        app = web.Application(middlewares=middlewares)
        app.router.add_get("/healthz", self._healthz, name="healthz")
        app.router.add_get("/readyz", self._readyz, name="readyz")
        app.router.add_get("/metrics", self._metrics, name="metrics")
        app.router.add_post(PUBLISH_PREFIX + "{project}", self._publish, name="publish")
        app.router.add_get(WHY_PREFIX + "{project}", self._why, name="why")
        app.router.add_get("/metadata/{name}", self._metadata, name="metadata")
        app.router.add_get("/simple/", self._root_page, name="root-page")
        app.router.add_get("/simple/{name}", self._root_file, name="root-file")
        app.router.add_get("/simple/{project}/", self._project_page, name="project-page")
        app.router.add_get("/simple/{project}/{name}", self._page_file, name="page-file")
        app.router.add_get("/packages/{project}/{name}", self._package, name="packages")
        return app

    @web.middleware
    async def _middleware(self, request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        route = request.match_info.route.name or "other"
        # Set for each request (a keep-alive connection reuses its task): an edge's id, else ours.
        request_id.set(new_request_id(request.headers.get("X-Request-Id")))
        phases = timing.collect()
        try:
            response = await handler(request)
        except web.HTTPException as e:
            response = e
        except asyncio.CancelledError:
            raise
        except Exception as e:  # every refusal answers from the one table; an undeclared error is our bug
            r, reason = refusals.row(e), refusals.reason_of(e)
            if r is refusals.UNEXPECTED:
                log.error("%s %s -> 500: internal error", request.method, request.path, exc_info=e)
                detail = f"internal error ({type(e).__name__})"
            else:
                log.warning("%s %s -> %d %s: %s", request.method, request.path, r.status, reason, e)
                detail = str(e)[:500]
            response = web.json_response({"reason": reason, "fault": r.kind, "detail": detail}, status=r.status,
                                         headers={"X-Tufproxy-Reason": reason},
                                         reason=refusals.phrase(f"{reason}: {detail[:200]}"))
        # Where a publish this request made (or its leader's, relayed) spent its time; none when another
        # request's publish, or an earlier one, served it.
        if not response.prepared and (value := timing.header_for(response.status, phases)) is not None:
            response.headers["Server-Timing"] = value
        self.metrics.requests.labels(route, str(response.status)).inc()
        return response

    # -- the miss protocol -----------------------------------------------
    async def _publish(self, request: web.Request) -> web.Response:
        name = request.match_info["project"]
        if not is_valid_project_name(name):
            return web.json_response({"reason": "bad-project-name"}, status=400)
        if self.forwarder is not None:
            answer = await self.forwarder.publish(request.path_qs, request.headers.get("Authorization"))
            if answer is not None:
                timing.relay(answer[2], "")
                return web.Response(status=answer[0], body=answer[1], content_type="application/json")
        try:
            published = await self.gateway.ensure(name)
        except NotListed as e:
            return web.json_response({"project": canonicalize_name(name), "reason": "not-found", "detail": str(e)}, status=404)
        said: dict[str, object] = {"project": published.project, "timestamp_version": published.timestamp_version}
        foresight, have = published.foresight, _version_asked(request, "have")
        # Asked ahead of an edge's lookup (MissProtocol.ask_ahead) that will find the page in the timestamp it
        # trusts (have=T): it drops the answer, which names and carries nothing.
        known = have is not None and foresight is not None and foresight.version is not None \
            and have >= foresight.version
        if foresight is not None and not known:
            said["expect"] = {"roles": foresight.roles, "targets": foresight.targets}
            # The bodies, for an edge that reads this gateway first (it asks: given=1), from the tree this
            # replica serves: not a follower's, which serves the group's bucket (one that signed alone, its
            # leader away, has versions of its own the group may sign differently).
            if request.query.get("given") == "1" and self._following() is None:
                carried = await asyncio.to_thread(self.gateway.publisher.carried, foresight,
                                                  _version_asked(request, "root"))
                if carried.version is not None:  # the timestamp carried, and what it names
                    said["timestamp_version"] = max(carried.version, published.timestamp_version)
                    said["expect"] = {"roles": carried.roles, "targets": foresight.targets}
                said["given"] = {name: None if body is None else base64.b64encode(body).decode()
                                 for name, body in carried.bodies.items()}
        return web.json_response(said)

    async def _why(self, request: web.Request) -> web.Response:
        """What a publish would offer and what the policy hides, by rule (``tufproxy why``); signs nothing."""
        name = request.match_info["project"]
        if not is_valid_project_name(name):
            return web.json_response({"reason": "bad-project-name"}, status=400)
        return web.json_response(await self.gateway.why(name))

    # -- the tree ------------------------------------------------------
    def _path(self, *segments: str) -> Path:
        """The file of the tree a request names; 404 unless every segment is a plain name and it exists."""
        path = self.public_dir.joinpath(*_plain(segments))
        if not path.is_file():
            raise web.HTTPNotFound()
        return path

    def _file(self, *segments: str, headers: dict[str, str] | None = None) -> web.FileResponse:
        return web.FileResponse(self._path(*segments), headers=headers)

    def _following(self) -> Bucket | None:
        return self.forwarder.lease.following() if self.forwarder is not None else None

    async def _tree(self, request: web.Request, *segments: str,
                    headers: dict[str, str] | None = None) -> web.StreamResponse:
        """A file of the published tree: this replica's own, or the bucket's while it follows."""
        bucket = self._following()
        if bucket is None:
            return self._file(*segments, headers=headers)
        async with _bucket_object(bucket, segments) as body:
            response = web.StreamResponse(headers=headers)
            if "Content-Type" not in (headers or {}):
                response.content_type = mimetypes.guess_type(segments[-1])[0] or "application/octet-stream"
            response.content_length = body.content_length
            await response.prepare(request)
            async for chunk in body:
                await response.write(chunk)
            await response.write_eof()
            return response

    async def _metadata(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        headers = _NO_CACHE if name in ("timestamp.json", "root.json") else _IMMUTABLE
        if not _VERSIONED_METADATA.fullmatch(name) or self._following() is not None:
            return await self._tree(request, "metadata", name, headers=headers)
        # The snapshot is the one file every edge reads after every publish, and a bin-n the one every new
        # project costs it (27 KB at 100,000 projects and 4,096 bins): gzipped for those who accept it.
        response = web.Response(body=self._path("metadata", name).read_bytes(), content_type="application/json", headers=headers)
        response.enable_compression()
        return response

    async def _root_page(self, request: web.Request) -> web.StreamResponse:
        name, content_type = _negotiated_page(request)
        headers = {**_NO_CACHE, "Content-Type": content_type}
        publisher = self.gateway.publisher
        leader = self.forwarder.lease.leader_url if self._following() is not None and self.forwarder else None
        if leader:  # a follower's own directory is not what the group publishes
            raise web.HTTPTemporaryRedirect(leader.rstrip("/") + "/simple/")
        publisher.reload()
        key = (publisher.timestamp_version, name)
        if self._root_list is None or self._root_list[0] != key:
            plist = index.ProjectList(projects=tuple(publisher.catalog.public))
            render = index.render_project_list_json if name == "index.json" else index.render_project_list_html
            self._root_list = (key, await asyncio.to_thread(render, plist))
        return web.Response(body=self._root_list[1], headers=headers)

    async def _root_file(self, request: web.Request) -> web.StreamResponse:
        """The root list under a hash name: the signed target edges and mirror syncs fetch."""
        name = request.match_info["name"]
        return await self._tree(request, "simple", name,
                                headers=_NO_CACHE if name in ("index.html", "index.json") else _IMMUTABLE)

    async def _project_page(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["project"]
        if not is_valid_project_name(name):
            raise web.HTTPNotFound()
        project = canonicalize_name(name)
        if project != name:
            raise web.HTTPMovedPermanently(f"../{project}/")
        self.gateway.touch(project)
        bucket = self._following()
        if bucket is not None and self.forwarder is not None:
            if not await bucket.exists(f"simple/{project}/index.json"):
                # The leader publishes (and answers once the bucket has it); none answering, this replica does.
                await self.forwarder.publish(f"{PUBLISH_PREFIX}{project}", request.headers.get("Authorization"))
        elif not (self.public_dir / "simple" / project / "index.json").is_file():
            await self.gateway.ensure(project)
        return await self._plain_page(request, project, _negotiated_page(request))

    async def _page_file(self, request: web.Request) -> web.StreamResponse:
        project, name = request.match_info["project"], request.match_info["name"]
        self.gateway.touch(project)
        if name == "index.html":
            return await self._plain_page(request, project, HTML_PAGE)
        return await self._tree(request, "simple", project, name, headers=_NO_CACHE if name == "index.json" else _IMMUTABLE)

    async def _plain_page(self, request: web.Request, project: str, kind: tuple[str, str]) -> web.StreamResponse:
        """A project's plain page: the JSON one as signed, the HTML one rendered from it (only the JSON page is
        signed, :data:`~proxy.protocol.profiles.GATEWAY`)."""
        name, content_type = kind
        headers = {**_NO_CACHE, "Content-Type": content_type}
        if name == "index.json":
            return await self._tree(request, "simple", project, name, headers=headers)
        data = await self._tree_bytes("simple", project, "index.json")
        digest = hashlib.sha256(data).hexdigest()
        tag = f"{digest}.html"
        headers["ETag"] = f'"{tag}"'
        if any(given.value in (tag, "*") for given in request.if_none_match or ()):
            return web.Response(status=304, headers={k: v for k, v in headers.items() if k != "Content-Type"})
        body = self._html.get(digest)
        if body is None:  # a page may list thousands of files: parsed and rendered off the loop
            body = await asyncio.to_thread(_render_html, data, project)
            self._html.put(digest, body, len(body))
        return web.Response(body=body, headers=headers)

    async def _tree_bytes(self, *segments: str) -> bytes:
        """A small file of the published tree (this replica's own, or the bucket's while it follows), or 404."""
        bucket = self._following()
        if bucket is None:
            try:
                return self._path(*segments).read_bytes()
            except FileNotFoundError:  # gone since the check
                raise web.HTTPNotFound() from None
        async with _bucket_object(bucket, segments) as body:
            return b"".join([chunk async for chunk in body])

    async def _package(self, request: web.Request) -> web.StreamResponse:
        project, name = request.match_info["project"], request.match_info["name"]
        if not is_valid_project_name(project) or canonicalize_name(project) != project or not is_valid_filename(name):
            raise web.HTTPNotFound()
        if name.endswith(PROVENANCE_SUFFIX):  # a signed target, beside the page (PEP 740 provenance)
            return await self._tree(request, "simple", project, name, headers=_IMMUTABLE)
        core = name.endswith(".metadata")
        return await self.files.serve(request, project, name.removesuffix(".metadata") if core else name, core)

    # -- operations ----------------------------------------------------
    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        publisher = self.gateway.publisher
        publisher.reload()  # another worker may have re-signed
        problems = []
        left = publisher.timestamp_expires - time.time()
        if left <= 0:
            problems.append("published timestamp has expired")
        elif left < publisher.repo.settings.expiry.timestamp.total_seconds() / 4:
            # Re-signed at half its lifetime: this close to expiry, signing has been failing for a while.
            problems.append(f"published timestamp expires in {left:.0f} s")
        if not (self.public_dir / "metadata" / "timestamp.json").is_file():
            problems.append("no timestamp.json")
        accepting = self.connections.problem() if self.connections is not None else None
        if accepting is not None:
            problems.append(accepting)
        status = 503 if problems else 200
        # A key that cannot sign alone leaves the gateway ready: what it serves is still valid, and a
        # load balancer that dropped it would stop edges from reading that too.
        signing = None if publisher.signing_error is None else str(publisher.signing_error)
        # Not a readiness problem: pages on allowed origins are still served, and a load balancer
        # dropping the gateway would not help the others.
        return web.json_response({"ready": not problems, "problems": problems, "signing_error": signing,
                                  "files_origin_problem": self.files_origin_problem,
                                  "timestamp_version": publisher.timestamp_version}, status=status)

    async def _metrics(self, request: web.Request) -> web.Response:
        self.update_gauges()
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def update_gauges(self) -> None:
        """At each scrape, and periodically in workers (any worker's scrape reports every worker's gauges)."""
        publisher = self.gateway.publisher
        publisher.reload()
        self.metrics.timestamp_version.set(publisher.timestamp_version)
        self.metrics.timestamp_expiry.set(publisher.timestamp_expires - time.time())
        self.metrics.projects.set(len(publisher.published))
        for structure, size in self.gateway.usage_sizes().items():
            self.metrics.usage_entries.labels(structure).set(size)
        if self.connections is not None:
            self.connections.report()


def _version_asked(request: web.Request, name: str) -> int | None:
    """The version a publish's ``name`` parameter says (ASCII digits, bounded), or None."""
    value = request.query.get(name, "")
    return int(value) if _VERSION.fullmatch(value) else None


_OPEN = frozenset(("healthz", "readyz"))
_PROJECT_ROUTES = frozenset(("project-page", "page-file", "packages", "publish"))


def gateway_resource(private: Callable[[str], bool], any_private: bool) -> Callable[[web.Request], Resource | None]:
    """What each gateway request asks of access control: health is open; a project's page, files and publish
    name it; the rest (signed metadata, the root list, metrics) is the whole repository, which names private
    projects whenever there may be any, so it is never anonymous then."""
    def resource(request: web.Request) -> Resource | None:
        route = request.match_info.route.name
        if route in _OPEN:
            return None
        if route in _PROJECT_ROUTES:
            project = canonicalize_name(request.match_info["project"][:200])
            return Resource(project, publish=route == "publish", private=private(project))
        return Resource(None, private=any_private)
    return resource


def _plain(segments: tuple[str, ...]) -> tuple[str, ...]:
    """``segments`` of a path into the tree, or 404 unless each is a plain name."""
    if not all(_SEGMENT.fullmatch(s) and ".." not in s for s in segments):
        raise web.HTTPNotFound()
    return segments


@contextlib.asynccontextmanager
async def _bucket_object(bucket: Bucket, segments: tuple[str, ...]) -> AsyncIterator[ByteStream]:
    """The bucket's object at ``segments`` (plain names only), its absence a 404."""
    try:
        async with bucket.stream("/".join(_plain(segments)), MAX_TREE_OBJECT) as body:
            yield body
    except DownloadHTTPError as e:
        if e.status == 404:
            raise web.HTTPNotFound() from None
        raise


HTML_PAGE = ("index.html", "text/html; charset=utf-8")
HTML_PAGES_BYTES = 32 * 2**20  # rendered HTML project pages kept in memory, at most


def _render_html(data: bytes, project: str) -> bytes:
    """The PEP 503 page of the signed JSON page ``data``."""
    return index.render_project_html(index.parse_project_json(data, project))


def _negotiated_page(request: web.Request) -> tuple[str, str]:
    """The plain page a client asked for (PEP 691 negotiation), and its content type."""
    if index.negotiate(request.headers.get("Accept")) is index.MediaType.JSON_V1:
        return "index.json", index.MediaType.JSON_V1.value
    return HTML_PAGE
