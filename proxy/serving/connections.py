"""Bounds on client connections: a cap on how many, and how long one may sit idle.

aiohttp bounds a request head's size but not how long it may take to
arrive, so a client sending a header byte a second, or thousands of
connections that never send anything, would each hold a slot for ever.
:class:`ClientBounds` closes a connection that is not inside a request
(between accepting it and a complete request head, or between requests
on a keep-alive connection) for longer than ``idle_timeout``, and closes
at once any connection beyond ``max_connections``.  Requests in progress,
including long downloads, are never cut.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp.web_protocol import RequestHandler


class ClientBounds:
    """The bookkeeping: which connections are idle since when; the handlers report requests."""

    def __init__(self, max_connections: int, idle_timeout: float) -> None:
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.refused = 0  # connections closed at once for being over the cap
        self.expired = 0  # connections closed for idling
        self._idle_since: dict[RequestHandler, float] = {}
        self._busy: dict[RequestHandler, int] = {}
        self._transports: dict[RequestHandler, asyncio.BaseTransport] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def begin(self, protocol: Any) -> None:
        """A request head arrived on ``protocol``: it is busy, not idle."""
        self._busy[protocol] = self._busy.get(protocol, 0) + 1
        self._idle_since.pop(protocol, None)

    def end(self, protocol: Any) -> None:
        count = self._busy.get(protocol, 0) - 1
        if count > 0:
            self._busy[protocol] = count
            return
        self._busy.pop(protocol, None)
        if protocol in self._transports:
            self._idle_since[protocol] = time.monotonic()

    def touch(self, protocol: Any) -> None:
        """A request on ``protocol`` was answered at once: idle from now."""
        if protocol in self._idle_since:
            self._idle_since[protocol] = time.monotonic()

    def _made(self, handler: RequestHandler, transport: asyncio.BaseTransport) -> None:
        if len(self._transports) >= self.max_connections:
            self.refused += 1
            transport.close()
            return
        self._transports[handler] = transport
        self._idle_since[handler] = time.monotonic()
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def _lost(self, handler: RequestHandler) -> None:
        self._transports.pop(handler, None)
        self._idle_since.pop(handler, None)
        self._busy.pop(handler, None)

    async def _sweep(self) -> None:
        while self._transports:
            await asyncio.sleep(self.idle_timeout / 4)
            cutoff = time.monotonic() - self.idle_timeout
            for handler, since in list(self._idle_since.items()):
                if since < cutoff:
                    transport = self._transports.get(handler)
                    self._lost(handler)
                    if transport is not None:
                        self.expired += 1
                        transport.close()

    def watch(self, server: Any) -> Any:
        """Have aiohttp's ``Server`` report each connection made and lost to these bounds."""
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self._made(handler, transport)

        def connection_lost(handler: RequestHandler, exc: BaseException | None) -> None:
            self._lost(handler)
            lost(handler, exc)

        server.connection_made = connection_made
        server.connection_lost = connection_lost
        return server
