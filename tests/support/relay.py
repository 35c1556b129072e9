"""An HTTP relay on 127.0.0.1 between an edge and its upstream (a stale CDN or mirror copy, on demand).

Every request is forwarded to ``target`` (method, path, query, body, the
headers that matter) and the answer passed back, except the paths a test
overrides: :meth:`serve` answers a path matching a pattern with fixed bytes
(an older ``timestamp.json``, garbage, a bad signature), :meth:`rewrite`
passes its answer's body through an edit (a publish answer carrying forged
bodies), and :meth:`hold` keeps a request until another has come (an order
a test asserts, not a wait for time), until :meth:`clear`.
It runs in its own thread and event loop, independent of the code under test.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable

import aiohttp
from aiohttp import web

_PASSED = ("Accept", "Accept-Encoding", "Range", "If-None-Match", "Content-Type")


class Relay:
    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.overrides: list[tuple[re.Pattern[str], bytes]] = []
        self.rewrites: list[tuple[re.Pattern[str], Callable[[bytes], bytes]]] = []
        self.served: dict[str, int] = {}  # pattern -> times its override answered
        self.requests: list[str] = []  # every request's method and path, in order
        self.holds: list[tuple[re.Pattern[str], re.Pattern[str]]] = []
        self.released: list[tuple[str, bool]] = []  # (held request, whether the awaited one came)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def serve(self, pattern: str, body: bytes) -> None:
        """Answer paths matching ``pattern`` (a regex on the path) with ``body`` from now on."""
        self.overrides = [*self.overrides, (re.compile(pattern), body)]

    def rewrite(self, pattern: str, edit: Callable[[bytes], bytes]) -> None:
        """Pass the upstream's answer to paths matching ``pattern`` through ``edit`` from now on."""
        self.rewrites = [*self.rewrites, (re.compile(pattern), edit)]

    def hold(self, pattern: str, until: str) -> None:
        """Keep requests matching ``pattern`` (on "METHOD /path") until one matching ``until`` has come, at most
        10 s; :attr:`released` says which."""
        self.holds = [*self.holds, (re.compile(pattern), re.compile(until))]

    def clear(self) -> None:
        self.overrides, self.rewrites, self.holds = [], [], []

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        asked = f"{request.method} {request.path}"
        self.requests.append(asked)
        for pattern, until in self.holds:
            if pattern.fullmatch(asked):
                loop = asyncio.get_running_loop()
                end = loop.time() + 10
                while not (came := any(until.fullmatch(r) for r in self.requests)) and loop.time() < end:
                    await asyncio.sleep(0.01)  # polling the relay's own log, in its own thread
                self.released.append((asked, came))
        for pattern, body in self.overrides:
            if pattern.search(request.path):
                self.served[pattern.pattern] = self.served.get(pattern.pattern, 0) + 1
                return web.Response(body=body, content_type="application/json", headers={"Cache-Control": "no-cache"})
        edits = [edit for pattern, edit in self.rewrites if pattern.search(request.path)]
        # A body to edit must come as sent, not compressed.
        headers = {h: request.headers[h] for h in _PASSED if h in request.headers and not (edits and h == "Accept-Encoding")}
        async with self._session.request(request.method, self.target + request.path_qs, headers=headers,
                                         data=await request.read(), allow_redirects=False,
                                         auto_decompress=False) as upstream:
            body = await upstream.read()
            for edit in edits:
                body = edit(body)
            passed = {h: v for h, v in upstream.headers.items()
                      if h.lower() in ("content-type", "content-encoding", "cache-control", "etag", "location",
                                       "x-tufproxy-reason", "retry-after", "content-range")}
            return web.Response(status=upstream.status, body=body, headers=passed)

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    def __enter__(self) -> Relay:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
