"""A plain PEP 503/691 index on 127.0.0.1 (aiohttp, in a thread), as the gateway sees PyPI.

It serves real wheels and sdists built by the test, with sha256, PEP 658
core metadata, PEP 700 size and upload-time, and yanks; JSON or HTML by
the request's ``Accept`` (or ``mode="html"`` to force HTML).  Tests change
it while it runs: add a release, yank one, swap a file's bytes, answer a
page with raw bytes of their own (``raw_types`` names a content type other
than HTML), redirect a page (``redirects``), stall a page until an event is
set (``stall``), hold a file's (or a ``.metadata``'s) second half back until
an event is set (``hold``, by the name asked for), or serve a file at a set rate (``IndexFile.rate``).  Files can be served from a second
port (``files_port``) to play the index's separate file host; with ``files_via_index`` the pages link
files on the index's own origin, which redirects them there.  It can serve HTTPS (``ssl_context``) and
ask for basic auth on the index's origin (``basic_auth``); ``authorization`` records, for every request,
which origin it reached (``index`` or ``files``), its path and Authorization header.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from packaging.utils import canonicalize_name

from proxy.protocol import index


@dataclass
class IndexFile:
    path: Path
    yanked: bool | str = False
    upload_time: str = "2024-01-01T00:00:00.000000Z"
    requires_python: str | None = None
    core: bytes | None = None
    data: bytes = field(default=b"", repr=False)  # what the index serves (a swap changes it)
    rate: float | None = None  # bytes per second the file is served at (None: at once)


class TestIndex:
    """See the module docstring.  ``url`` is the ``--index-url`` to give the gateway."""

    __test__ = False

    def __init__(self, mode: str = "negotiate", separate_files_host: bool = False, *,
                 ssl_context: ssl.SSLContext | None = None, basic_auth: str | None = None,
                 files_via_index: bool = False, root_page: bool = False) -> None:
        self.mode = mode
        self.root_page = root_page  # serve /simple/ (the project list): off, so no start-up check reads pages
        self.ssl_context = ssl_context
        self.basic_auth = basic_auth  # the whole Authorization header value the index's origin requires
        self.files_via_index = files_via_index
        self.authorization: list[tuple[str, str, str | None]] = []
        self.projects: dict[str, list[IndexFile]] = {}
        self.raw_pages: dict[str, bytes] = {}
        self.status: dict[str, tuple[str, str | None]] = {}  # project -> PEP 792 status and reason its page carries
        self.raw_types: dict[str, str] = {}  # project -> Content-Type of its raw page (default HTML)
        self.redirects: dict[str, str] = {}  # project -> Location its page redirects to
        self.stall: dict[str, threading.Event] = {}  # project -> event: its page's body waits for it
        # filename -> event: the file's first half is sent, the rest only once the event is set.
        self.hold: dict[str, threading.Event] = {}
        self.requests: list[str] = []
        self._separate = separate_files_host
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = self.files_port = 0

    # -- content --------------------------------------------------------
    def add(self, path: Path, **kw: object) -> IndexFile:
        import zipfile

        core = None
        if path.name.endswith(".whl"):
            with zipfile.ZipFile(path) as zf:
                core = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")))
        entry = IndexFile(path, core=core, data=path.read_bytes(), **kw)  # type: ignore[arg-type]
        project = canonicalize_name(path.name.split("-")[0])
        self.projects.setdefault(project, []).append(entry)
        return entry

    def file(self, filename: str) -> IndexFile:
        return next(f for files in self.projects.values() for f in files if f.path.name == filename)

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/simple/"

    @property
    def files_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.files_port}/"

    def page(self, project: str) -> index.ProjectPage:
        files = []
        for f in self.projects.get(project, []):
            files.append(index.DistFile(
                filename=f.path.name, url=f"{self.url.removesuffix('simple/') if self.files_via_index else self.files_url}"
                f"files/{project}/{f.path.name}",
                hashes={"sha256": hashlib.sha256(f.data).hexdigest()}, requires_python=f.requires_python,
                yanked=f.yanked, core_metadata={"sha256": hashlib.sha256(f.core).hexdigest()} if f.core else False,
                size=len(f.data), upload_time=f.upload_time))
        versions = tuple(dict.fromkeys(f.path.name.split("-")[1].removesuffix(".tar.gz") for f in self.projects.get(project, [])))
        return index.ProjectPage(name=project, files=tuple(files), versions=versions).with_status(*self.status.get(project, (None, None)))

    # -- HTTP -----------------------------------------------------------
    async def _page(self, request: web.Request) -> web.Response:
        self.requests.append(request.path)
        project = canonicalize_name(request.match_info["project"])
        if project in self.redirects:
            raise web.HTTPFound(self.redirects[project])
        if project in self.stall:
            response = web.StreamResponse(headers={"Content-Type": "text/html"})
            await response.prepare(request)
            await response.write(b"<html>")
            await asyncio.get_running_loop().run_in_executor(None, self.stall[project].wait, 30)
            await response.write_eof()
            return response
        if project in self.raw_pages:
            content_type = self.raw_types.get(project, "text/html")
            return web.Response(body=self.raw_pages[project], headers={"Content-Type": content_type})
        if project not in self.projects:
            raise web.HTTPNotFound()
        page = self.page(project)
        media = index.negotiate(request.headers.get("Accept")) if self.mode == "negotiate" else index.MediaType.HTML
        if media is index.MediaType.JSON_V1:
            return web.Response(body=index.render_project_json(page), headers={"Content-Type": media.value})
        return web.Response(body=index.render_project_html(page), headers={"Content-Type": "text/html"})

    async def _root(self, request: web.Request) -> web.Response:
        listed = index.ProjectList(tuple(sorted(self.projects)))
        return web.Response(body=index.render_project_list_html(listed), headers={"Content-Type": "text/html"})

    async def _file(self, request: web.Request) -> web.Response:
        self.requests.append(request.path)
        name = request.match_info["name"]
        core = name.endswith(".metadata")
        try:
            f = self.file(name.removesuffix(".metadata"))
        except StopIteration:
            raise web.HTTPNotFound() from None
        body = f.core if core else f.data
        if body is None:
            raise web.HTTPNotFound()
        gate = self.hold.get(name)  # a file's or a .metadata's own name
        if f.rate is not None and not core:
            return await self._paced(request, body, f.rate)
        if gate is None:
            return web.Response(body=body, content_type="application/octet-stream")
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, 30)
        await response.write(body[len(body) // 2:])
        await response.write_eof()
        return response

    @staticmethod
    async def _paced(request: web.Request, body: bytes, rate: float) -> web.StreamResponse:
        """``body`` in pieces, a twentieth of ``rate`` every twentieth of a second: a slow index, not a stalled one."""
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = len(body)
        await response.prepare(request)
        step = max(1, int(rate / 20))
        for offset in range(0, len(body), step):
            await response.write(body[offset: offset + step])
            await asyncio.sleep(step / rate)
        await response.write_eof()
        return response

    async def _to_files_host(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(f"{self.files_url}{request.path.lstrip('/')}")

    def _app(self, pages: bool, files: bool) -> web.Application:
        @web.middleware
        async def guard(request: web.Request, handler):  # type: ignore[no-untyped-def]
            header = request.headers.get("Authorization")
            self.authorization.append(("index" if pages else "files", request.path, header))
            if pages and self.basic_auth is not None and header != self.basic_auth:
                raise web.HTTPUnauthorized(headers={"WWW-Authenticate": 'Basic realm="index"'})
            return await handler(request)

        app = web.Application(middlewares=[guard])
        if pages:
            app.router.add_get("/simple/{project}/", self._page)
            if self.root_page:
                app.router.add_get("/simple/", self._root)
            if self.files_via_index and not files:
                app.router.add_get("/files/{project}/{name}", self._to_files_host)
        if files:
            app.router.add_get("/files/{project}/{name}", self._file)
        return app

    async def _start(self) -> None:
        self._runners = []
        for pages, files in ([(True, False), (False, True)] if self._separate else [(True, True)]):
            runner = web.AppRunner(self._app(pages, files), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
            await site.start()
            self._runners.append(runner)
        self.port = self._runners[0].addresses[0][1]
        self.files_port = self._runners[-1].addresses[0][1]

    def __enter__(self) -> TestIndex:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._thread.is_alive():
            return  # stopped already (a test took the index down on purpose)

        async def stop() -> None:
            for r in self._runners:
                await r.cleanup()
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
