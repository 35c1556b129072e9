"""Fails loudly when the aiohttp internals that proxy.serving.hotpath uses change.

The hot path answers warm pages from ``RequestHandler.data_received`` and
must see exactly what aiohttp's own protocol sees; :func:`hotpath.install`
quietly leaves the hot path off when an internal is missing, so this test
is what notices.  It checks each private name exists and still means what
the hot path assumes, on a real server: the runner installs the hot path, a
ready page is answered by it, and anything else still goes to aiohttp.
"""

from __future__ import annotations

import asyncio
import inspect

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from proxy.protocol.requesthead import SimpleHead
from proxy.serving import hotpath
from proxy.serving.connections import ClientBounds


def test_aiohttp_is_the_tested_minor_version() -> None:
    assert aiohttp.__version__.startswith("3.14."), aiohttp.__version__


def test_every_private_name_the_hot_path_reads_exists() -> None:
    missing = [n for n in hotpath._NEEDED if not hasattr(RequestHandler, n)]
    assert not missing, f"RequestHandler lost {missing}: the hot path would be off"
    assert "__call__" in vars(web.Server) and "_make_server" in vars(web.AppRunner)
    assert inspect.iscoroutinefunction(web.AppRunner._make_server)
    # Server.__call__ builds a RequestHandler(self, loop=self._loop, **self._kwargs): the hot server does the same.
    source = inspect.getsource(web.Server.__call__)
    assert "self._loop" in source and "self._kwargs" in source, source
    # The keep-alive clock the hot path restarts after an answer is the one aiohttp's own answers restart.
    assert "_next_keepalive_close_time" in inspect.getsource(RequestHandler)
    assert "_process_keepalive" in inspect.getsource(RequestHandler)


async def test_the_runner_installs_the_hot_path_and_it_answers() -> None:
    answered: list[str] = []

    def ready(head: SimpleHead, protocol: RequestHandler) -> bytes | None:
        if head.path != "/hot":
            return None
        answered.append(head.path)
        return hotpath.response(200, {"Content-Type": "text/plain"}, b"hot", "rid", head_only=False)

    app = web.Application()

    async def cold(request: web.Request) -> web.Response:
        return web.Response(text="cold")

    app.router.add_get("/cold", cold)
    runner = hotpath.BoundedRunner(app, ClientBounds(16, 5.0), ready, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        assert runner.hot_path, "aiohttp's Server or RequestHandler changed: the hot path is off"
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/hot") as r:
                assert (r.status, await r.text(), r.headers["X-Request-Id"]) == (200, "hot", "rid")
            async with session.get(f"http://127.0.0.1:{port}/cold") as r:  # not ready: aiohttp answers
                assert (r.status, await r.text()) == (200, "cold")
            async with session.get(f"http://127.0.0.1:{port}/hot") as r:  # and the connection stays usable
                assert (r.status, await r.text()) == (200, "hot")
        assert answered == ["/hot", "/hot"], answered
    finally:
        await runner.cleanup()
        await asyncio.sleep(0)
