"""Answering ready pages below aiohttp's web layer: the warm path's connection protocol.

A warm index page costs aiohttp's whole request pipeline (request and
response objects, the handler task, middleware, header serialisation) for
a few hundred bytes already rendered.  :func:`install` makes an aiohttp
``Server`` build :class:`HotHandler` connections, which answer one kind of
request straight from ``data_received``: the connection is idle (no request
queued or in flight, aiohttp's parser holding no partial request), the bytes
are one complete plain request (:mod:`proxy.protocol.requesthead`), everything
written before has left for the socket (so a client that does not read
cannot make answers pile up in memory), and ``answer``
has a response ready for it now (:meth:`proxy.serving.resolver.Resolver.ready`:
the same trusted-state and expiry checks as every request).  Everything
else, and any connection that ever carried anything else, goes to aiohttp
unchanged.

The response bytes are aiohttp's own for the same ``web.Response``
(status line, the given headers, ``Content-Length``, ``Date``, ``Server``),
with the head of each distinct answer serialised once.

This module is the one place that uses aiohttp's internals (the private
attributes in :data:`_NEEDED` and :data:`_SERVER_NEEDED`, ``Server``'s
class, ``AppRunner._make_server``); pyproject.toml pins aiohttp's minor
version and ``tests/test_aiohttp_interface.py`` fails loudly when any of
them is missing or changes meaning.  An aiohttp without them runs with no
hot path, which :class:`BoundedRunner` reports (log line and metric).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.web_protocol import RequestHandler

from proxy.protocol.requesthead import SimpleHead, recognise

# The request's head, and its connection (to report activity): the response bytes, or None for aiohttp.
Answer = Callable[[SimpleHead, RequestHandler], "bytes | None"]
# RequestHandler internals read here; an aiohttp without them gets no hot path (see install()).
_NEEDED = ("_waiter", "_messages", "_force_close", "_close", "_payload_parser", "_upgraded",
           "_keepalive_handle", "_next_keepalive_close_time", "_keepalive_timeout", "_process_keepalive")
# web.Server internals read to build a HotHandler as Server.__call__ builds a RequestHandler.
_SERVER_NEEDED = ("_loop", "_kwargs")
_REASONS = {200: "OK", 304: "Not Modified"}


class HotHandler(RequestHandler):
    """aiohttp's connection protocol, answering ready requests itself (see the module docstring)."""

    __slots__ = ("_answer", "_parser_clean")

    def __init__(self, manager: web.Server, *, answer: Answer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._answer = answer
        # No byte given to aiohttp's parser was ever anything but one whole plain head:
        # its parser then holds nothing, and ours may take the next request.
        self._parser_clean = True

    def data_received(self, data: bytes) -> None:
        head = recognise(data) if self._parser_clean else None
        if head is not None and self._idle():
            reply = self._answer(head, self)
            if reply is not None:
                self.transport.write(reply)  # type: ignore[union-attr]
                self._kept_alive()
                return
        self._parser_clean = head is not None
        super().data_received(data)

    def _idle(self) -> bool:
        """No request queued or in flight, and everything sent: a client that does not read its
        answers gets aiohttp's path, which waits for the socket to drain before the next one."""
        waiter, transport = self._waiter, self.transport
        return (waiter is not None and not waiter.done() and not self._messages and not self._force_close
                and not self._close and self._payload_parser is None and not self._upgraded
                and transport is not None and not transport.get_write_buffer_size())

    def _kept_alive(self) -> None:
        """What aiohttp does after a keep-alive response: the idle clock starts again."""
        loop = self._loop
        close_time = loop.time() + self._keepalive_timeout
        self._next_keepalive_close_time = close_time
        if self._keepalive_handle is None:
            self._keepalive_handle = loop.call_at(close_time, self._process_keepalive)


class _HotServer(web.Server):
    """aiohttp's ``Server``, making :class:`HotHandler` connections."""

    _answer: Answer

    def __call__(self) -> RequestHandler:
        return HotHandler(self, loop=self._loop, answer=self._answer, **self._kwargs)


def install(server: web.Server, answer: Answer) -> web.Server:
    """Have ``server`` answer ready requests through ``answer``; unchanged if this aiohttp lacks
    what :class:`HotHandler` reads (every request then takes aiohttp's own path)."""
    if (type(server) is web.Server and all(hasattr(RequestHandler, name) for name in _NEEDED)
            and all(hasattr(server, name) for name in _SERVER_NEEDED)):
        server.__class__ = _HotServer
        server._answer = answer  # type: ignore[attr-defined]
    return server


def installed(server: web.Server) -> bool:
    """Whether ``server`` answers ready requests below aiohttp's web layer."""
    return isinstance(server, _HotServer)


class BoundedRunner(web.AppRunner):
    """An AppRunner whose connections obey ``bounds`` (:class:`proxy.serving.connections.ClientBounds`)
    and answer ready requests through ``ready``; ``hot_path`` says whether that could be installed."""

    def __init__(self, app: web.Application, bounds: Any, ready: Answer, **kwargs: Any) -> None:
        super().__init__(app, keepalive_timeout=bounds.idle_timeout, **kwargs)
        self._bounds = bounds
        self._ready = ready
        self.hot_path = False

    async def _make_server(self) -> Any:
        server = install(self._bounds.watch(await super()._make_server()), self._ready)
        self.hot_path = installed(server)
        return server


def response(status: int, headers: Mapping[str, str], body: bytes, request_id: str, head_only: bool) -> bytes:
    """The bytes aiohttp sends for ``web.Response(status, headers, body)`` with ``X-Request-Id``;
    no body for ``HEAD`` or a 304 (whose head has no ``Content-Length``, as aiohttp sends it)."""
    lead = _lead(status, tuple(headers.items()), len(body))
    tail = rfc822_formatted_time()
    parts = (lead, request_id.encode("ascii"), b"\r\nDate: ", tail.encode("ascii"), _SERVER_AND_END)
    if head_only or status == 304:
        return b"".join(parts)
    return b"".join((*parts, body))


_SERVER_AND_END = f"\r\nServer: {SERVER_SOFTWARE}\r\n\r\n".encode("ascii")


@functools.lru_cache(maxsize=4096)
def _lead(status: int, headers: tuple[tuple[str, str], ...], length: int) -> bytes:
    """A response's head up to the request id's value (serialised once per distinct answer)."""
    lines = [f"HTTP/1.1 {status} {_REASONS[status]}", *(f"{k}: {v}" for k, v in headers)]
    if status != 304:
        lines.append(f"Content-Length: {length}")
    lines.append("X-Request-Id: ")
    return "\r\n".join(lines).encode("latin-1")
