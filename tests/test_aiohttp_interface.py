"""Fails loudly when the aiohttp internals that proxy.serving.listener (and proxy.transport.receive) use change.

The listener's connections report each request to the connection limits and
answer warm pages from ``RequestHandler.data_received``; they must see exactly
what aiohttp's own protocol sees.  An aiohttp without a name quietly runs with
no limits but its own and no hot path, so this test is what notices.  It
checks each private name exists and still means what the listener assumes,
then on a real server: the hot path answers a ready page, anything else goes
to aiohttp, and a request in progress is reported busy, then quiet.
"""

from __future__ import annotations

import asyncio
import inspect

import aiohttp
from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import BaseConnector
from aiohttp.http_writer import StreamWriter
from aiohttp.web_protocol import RequestHandler

from proxy.protocol.requesthead import SimpleHead
from proxy.serving import hotpath, listener


def test_aiohttp_is_the_tested_minor_version() -> None:
    assert aiohttp.__version__.startswith("3.14."), aiohttp.__version__


def test_every_private_name_the_listener_uses_exists() -> None:
    missing = [n for n in listener.HANDLER_NEEDED if not hasattr(RequestHandler, n)]
    assert not missing, f"RequestHandler lost {missing}: no limits but aiohttp's, no hot path"
    assert listener.internals_present()
    assert "__call__" in vars(web.Server) and "_make_server" in vars(web.AppRunner)
    assert inspect.iscoroutinefunction(web.AppRunner._make_server)
    # Server.__call__ builds a RequestHandler(self, loop=self._loop, **self._kwargs): ours does the same.
    source = inspect.getsource(web.Server.__call__)
    assert "self._loop" in source and "self._kwargs" in source, source


def test_what_the_receiver_takes_over_still_behaves_as_it_assumes() -> None:
    # The receiver (proxy.transport.receive; its live tests: tests/test_receive.py) pauses aiohttp's
    # protocol, which must also stop sock_read's timer: the receiver's reads are timed by their caller.
    assert "self._drop_timeout()" in inspect.getsource(ResponseHandler.pause_reading)
    # Its connection is forced closed, and a connection released is closed (never pooled) when its
    # protocol says so: the parser still expects the body the receiver took.
    assert "self._should_close = True" in inspect.getsource(ResponseHandler.force_close)
    assert "self._should_close" in inspect.getsource(ResponseHandler.should_close.fget)  # type: ignore[attr-defined]
    assert "should_close or protocol.should_close" in inspect.getsource(BaseConnector._release)
    # What the parser received of the body before the takeover is all in the payload's buffer.
    assert "def read_nowait(self, n: int = -1)" in inspect.getsource(aiohttp.StreamReader)


def test_the_private_names_still_mean_what_the_listener_assumes() -> None:
    start = inspect.getsource(RequestHandler.start)
    # Between requests start() awaits a fresh _waiter, and pops _messages: "idle" is that wait.
    assert "self._waiter = loop.create_future()" in start and "self._messages.popleft()" in start
    # Each request is one _handle_request task, awaited before the next: busy from its start to its end.
    assert "self._handle_request(request, start, request_handler)" in start
    handle = inspect.getsource(RequestHandler._handle_request)
    assert "self._current_request = request" in handle and "finish_response" in handle
    # A request's writer counts what went on the wire (the body timeout's 408 only before any of it).
    assert "self._payload_writer = payload_writer" in inspect.getsource(web.BaseRequest.__init__)
    assert "self.output_size += size" in inspect.getsource(StreamWriter._write)
    # connection_made starts the request task (it asserts _manager); connection_lost tolerates no manager.
    assert "self._manager.connection_made(self" in inspect.getsource(RequestHandler.connection_made)
    assert "if self._manager is None:" in inspect.getsource(RequestHandler.connection_lost)
    # data_received feeds the head parser only without a payload parser or upgrade.
    received = inspect.getsource(RequestHandler.data_received)
    assert "self._payload_parser is None and not self._upgraded" in received
    # The keep-alive clock the hot path restarts after an answer is the one aiohttp's answers restart.
    assert "_next_keepalive_close_time" in inspect.getsource(RequestHandler._process_keepalive)
    assert "self._waiter" in inspect.getsource(RequestHandler._process_keepalive)


async def test_the_listener_installs_its_handler_and_the_hot_path_answers() -> None:
    answered: list[str] = []

    def ready(head: SimpleHead, protocol: RequestHandler) -> bytes | None:
        if head.path != "/hot":
            return None
        answered.append(head.path)
        return hotpath.response(200, {"Content-Type": "text/plain"}, b"hot", "rid", head_only=False)

    app = web.Application()
    seen: list[tuple[int, int]] = []
    served: listener.Listener

    async def cold(request: web.Request) -> web.Response:
        conns = served.connections
        seen.append((len(conns._busy), len(conns._quiet)))  # this request's connection: busy, not quiet
        return web.Response(text="cold")

    app.router.add_get("/cold", cold)
    served = listener.Listener(app, listener.Limits(max_connections=16), ready=ready)
    port = await served.start()
    try:
        assert served.hot_path and served.runner.limited, "aiohttp's Server or RequestHandler changed"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/hot") as r:
                assert (r.status, await r.text(), r.headers["X-Request-Id"]) == (200, "hot", "rid")
            async with session.get(f"http://127.0.0.1:{port}/cold") as r:  # not ready: aiohttp answers
                assert (r.status, await r.text()) == (200, "cold")
            async with session.get(f"http://127.0.0.1:{port}/hot") as r:  # and the connection stays usable
                assert (r.status, await r.text()) == (200, "hot")
            conns = served.connections
            assert (conns.open, len(conns._busy), len(conns._quiet)) == (1, 0, 1)
        assert answered == ["/hot", "/hot"], answered
        assert seen == [(1, 0)], seen
    finally:
        await served.stop()
        await asyncio.sleep(0)
