"""Every listening socket's HTTP server, with the same limits; the one module that uses aiohttp's internals.

``serve`` and ``gateway serve`` build their listeners here (:class:`Listener`), so a
slow, idle or flooding client meets the same limits on an edge and on a gateway:

============================== ========= ====================================================
setting                        default   nginx's nearest, and its default
============================== ========= ====================================================
``--header-timeout``           10 s      ``client_header_timeout`` 60 s
``--idle-timeout``             15 s      ``keepalive_timeout`` 75 s
``--body-timeout``             30 s      ``client_body_timeout`` 60 s
``--max-connections``          1024      ``worker_connections`` 512 (per process, like ours)
``--max-connections-per-client`` 0 (off) ``limit_conn`` (off unless configured)
``--backlog``                  1024      ``listen ... backlog=`` 511
============================== ========= ====================================================

* A request head (the first on a connection counted from the accept, a later one
  from its first byte) must be complete within the header timeout: a connection
  that sent part of one then gets ``408`` and is closed, one that sent nothing is
  closed.  A connection between requests is closed after the idle timeout.  A
  request body that stays silent for the body timeout is cut.  Requests in
  progress, long downloads included, are never cut.
* At the connection cap a newcomer takes the place of a connection only
  holding a slot, as nginx reuses idle connections, longest-quiet first: one
  that has sent nothing or not finished its head for :data:`GRACE` (unless a
  whole request of its waits, unread or not started, on a loop too busy to
  get to it); for a
  newcomer whose request already waits in its socket (a peek; over TLS, the
  finished handshake), else one that has sent nothing at all, else a
  keep-alive connection, else any connection not in a request.  A newcomer
  that has sent nothing takes only a stale connection's place, so a client
  re-opening thousands of silent connections as fast as they are closed keeps
  out neither one that asks nor a pool's keep-alive connections.  With no
  stale place it is *held* (accepted, no slot, no protocol started) until
  its first bytes, then placed as one whose request waits; one still silent
  after :data:`GRACE` is refused, and at most :attr:`Connections.held_bound`
  are held (the oldest goes first).  On a real network the handshake's last
  packet arrives before the request, so a client is often accepted before
  it has said anything.  Like nginx's drain of its oldest connections still
  waiting for a request, this cannot tell a slow client from a silent flood
  on its address: one re-opening silent connections faster than
  ``held_bound`` in the time a request lags pushes that client out.  A newcomer
  is also refused when its address holds its
  ``--max-connections-per-client``.  A refused connection is closed before
  aiohttp's protocol starts on it: nothing to log, no task left behind.
* ``accept()`` failing for want of descriptors (EMFILE, ENFILE) is counted,
  logged once per interval and shown by :meth:`Connections.problem` (``/readyz``);
  asyncio itself stops accepting for a second after each failure.

The private names used are listed in :data:`HANDLER_NEEDED` and :data:`SERVER_NEEDED`
(plus ``AppRunner._make_server``); pyproject.toml pins aiohttp's minor version and
``tests/test_aiohttp_interface.py`` fails loudly when any of them is missing or
changes meaning.  An aiohttp without them still serves, with no limits but its
own and no hot path, which the start-up line and ``tufproxy_hot_path_installed`` report.

The hot path (warm pages answered from ``data_received``) runs here too: a
connection's handler answers one kind of request itself when the connection is
idle, the bytes are one complete plain head (:mod:`proxy.protocol.requesthead`),
everything written before has left, and the ``ready`` callback has the response
(:func:`proxy.serving.hotpath.response` makes its bytes).  Anything else, and any
connection that ever carried anything else, goes to aiohttp unchanged.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import socket
import ssl
import time
from collections import Counter as Tally
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CollectorRegistry, Counter, Gauge

from proxy.protocol.options import Option, non_negative_int, positive_float, positive_int
from proxy.protocol.requesthead import SimpleHead, recognise
from proxy.util.logs import flush_suppressed, suppressed_counts

log = logging.getLogger(__name__)

# The request's head and its connection: the response bytes, or None for aiohttp.
Answer = Callable[[SimpleHead, RequestHandler], "bytes | None"]
# RequestHandler internals read here; without them: no limits but aiohttp's, no hot path.
HANDLER_NEEDED = ("_waiter", "_messages", "_force_close", "_close", "_payload_parser", "_upgraded",
                  "_current_request", "_handle_request", "_keepalive_handle", "_next_keepalive_close_time",
                  "_keepalive_timeout", "_process_keepalive")
# web.Server internals read to build our handler as Server.__call__ builds aiohttp's.
SERVER_NEEDED = ("_loop", "_kwargs")
# A connection still sending its first head is not taken for an idle one before this many seconds.
GRACE = 1.0
_REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
# Descriptor exhaustion: what asyncio's accept loop reports (and then pauses accepting for a second).
_ACCEPT_TROUBLE = "socket.accept() out of system resource"
_ACCEPT_ERRNOS = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))
_ACCEPT_LOG_EVERY = 10.0
_ACCEPT_READY_WINDOW = 10.0

OPTIONS: tuple[Option, ...] = (
    Option("header_timeout", "seconds a client has to send a request head (a connection's first from the accept, "
           "later ones from their first byte); a part of a head then gets 408, and the connection is closed "
           "(nginx: client_header_timeout)", 10.0, positive_float, metavar="SECONDS"),
    Option("idle_timeout", "seconds a keep-alive connection may sit idle between requests (nginx: keepalive_timeout)",
           15.0, positive_float, metavar="SECONDS"),
    Option("body_timeout", "seconds a client may stay silent while sending a request body before the connection "
           "is cut, with 408 if none of the answer went out (nginx: client_body_timeout)", 30.0, positive_float,
           metavar="SECONDS"),
    Option("max_connections", "client connections per process; at the cap the longest-idle ones are closed "
           "to make room, a newcomer is refused only when all are busy (nginx: worker_connections)", 1024,
           positive_int, metavar="N"),
    Option("max_connections_per_client", "connections one client address may hold per process; 0: no cap "
           "(nginx: limit_conn)", 0, non_negative_int, metavar="N"),
    Option("backlog", "connections the kernel queues before they are accepted (nginx: listen backlog=)", 1024,
           positive_int, metavar="N"),
)


@dataclass(frozen=True)
class Limits:
    """What every listener enforces (see the module docstring); the defaults are :data:`OPTIONS`'."""

    header_timeout: float = 10.0
    idle_timeout: float = 15.0
    body_timeout: float = 30.0
    max_connections: int = 1024
    max_connections_per_client: int = 0
    backlog: int = 1024

    @classmethod
    def of(cls, values: Mapping[str, Any] | Any) -> Limits:
        """The limits among resolved settings (a mapping, or an object with these attributes)."""
        found: dict[str, Any] = {name: values[name] if isinstance(values, Mapping) else getattr(values, name)
                                 for name in cls.__dataclass_fields__}
        return cls(**found)

    @property
    def tick(self) -> float:
        """How often deadlines are checked: a quarter of the shortest, within [50 ms, 1 s]."""
        return min(1.0, max(0.05, min(self.header_timeout, self.idle_timeout, self.body_timeout) / 4))


class ListenerMetrics:
    """Connections open, closed by each limit, accept failures and log lines suppressed (one process's)."""

    def __init__(self, registry: CollectorRegistry, limits: Limits) -> None:
        r = registry
        self.open = Gauge("tufproxy_connections_open", "Client connections open (summed over processes)",
                          registry=r, multiprocess_mode="livesum")
        self.held = Gauge("tufproxy_connections_held", "Newcomers accepted at the cap and held, in no slot, until they "
                          "send something (summed over processes)", registry=r, multiprocess_mode="livesum")
        self.cap = Gauge("tufproxy_connections_max", "The connection cap (--max-connections, summed over processes)",
                         registry=r, multiprocess_mode="livesum")
        self.cap.set(limits.max_connections)
        self.closed = Counter("tufproxy_connections_closed_total", "Client connections closed by a limit, by reason: "
                              "header-timeout, idle-timeout, body-timeout, evicted (idle, to make room at the cap), "
                              "refused (at the cap, all busy, or held silent past the grace), per-client", ["reason"], registry=r)
        self.accept_errors = Counter("tufproxy_accept_errors_total", "accept() failures for want of descriptors or "
                                     "memory (EMFILE, ENFILE, ENOBUFS, ENOMEM)", registry=r)
        self.suppressed = Counter("tufproxy_log_lines_suppressed_total", "Log lines left out by the rate limit on "
                                  "repeated lines, by logger", ["logger"], registry=r)
        self._suppressed_seen: dict[str, int] = {}

    def sync_suppressed(self) -> None:
        for name, count in suppressed_counts().items():
            seen = self._suppressed_seen.get(name, 0)
            if count > seen:
                self.suppressed.labels(name).inc(count - seen)
                self._suppressed_seen[name] = count


class Connections:
    """One process's client connections: which are quiet since when, which busy; the limits applied."""

    def __init__(self, limits: Limits, metrics: ListenerMetrics | None = None) -> None:
        self.limits = limits
        self.metrics = metrics
        self.closed: Tally[str] = Tally()  # by reason, as the metric
        self.accept_errors = 0
        self._accept_failed_at: float | None = None
        self._accept_logged_at = -_ACCEPT_LOG_EVERY
        self._accept_unlogged = 0
        self._open: set[_Handler] = set()
        self._busy: set[_Handler] = set()
        # Quiet connections (no request in progress) in the order they became quiet: the front idled longest.
        self._quiet: OrderedDict[_Handler, None] = OrderedDict()
        self._per_client: Tally[str] = Tally()
        # Accepted at the cap before sending anything, with no stale place to take: oldest first.
        self._held: OrderedDict[_Handler, float] = OrderedDict()
        self.held_bound = max(16, limits.max_connections // 4)
        self._stopping = False
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def open(self) -> int:
        return len(self._open)

    @property
    def held(self) -> int:
        """Newcomers accepted at the cap and waiting for their first bytes, in no slot yet."""
        return len(self._held)

    # ------------------------------------------------------------ transitions, from the handlers

    def _admit(self, handler: _Handler, transport: asyncio.BaseTransport) -> bool:
        """Whether ``handler`` is accepted: given a slot, or held (``handler.held``) until it sends something."""
        if self._share_full(handler):
            self._count("per-client")
            return False
        now = time.monotonic()
        if len(self._open) >= self.limits.max_connections:
            self._expire_held(now)
            handler.eager = _bytes_waiting(transport)
        if not self._make_room(now, handler.eager):
            if handler.eager or self._stopping:
                self._count("refused")
                return False
            if len(self._held) >= self.held_bound:
                self._refuse_held(next(iter(self._held)))
            self._held[handler] = now
            handler.held = transport
            self._start_sweeper()
            return True
        self._place(handler)
        return True

    def _asked(self, handler: _Handler) -> bool:
        """A held ``handler`` sent its first bytes: whether it now has a slot (else it was refused and closed)."""
        if self._stopping or self._share_full(handler):
            # Its address filled its share while it was held (held ones hold none), or the listener is closing.
            self._refuse_held(handler, "refused" if self._stopping else "per-client")
            return False
        if not self._make_room(time.monotonic(), True):
            self._refuse_held(handler)
            return False
        del self._held[handler]
        handler.held = None
        handler.eager = True
        self._place(handler)
        return True

    def _share_full(self, handler: _Handler) -> bool:
        """Whether ``handler``'s address holds its --max-connections-per-client already."""
        per_client = self.limits.max_connections_per_client
        return bool(per_client) and self._per_client[handler.peer] >= per_client

    def _make_room(self, now: float, eager: bool) -> bool:
        """Whether a slot is free, or was freed by evicting the connection :meth:`_longest_idle` names for a
        newcomer (``eager``: its request already waits)."""
        if len(self._open) < self.limits.max_connections:
            return True
        victim = self._longest_idle(now, eager)
        if victim is None:
            return False
        self._close(victim, "evicted")
        return True

    def _refuse_held(self, handler: _Handler, reason: str = "refused") -> None:
        transport = handler.held
        del self._held[handler]
        handler.held = None
        self._count(reason)
        if transport is not None:
            transport.abort()  # type: ignore[attr-defined]

    def _expire_held(self, now: float) -> None:
        while self._held:
            oldest, since = next(iter(self._held.items()))
            if now - since <= GRACE:
                return
            self._refuse_held(oldest)

    def _place(self, handler: _Handler) -> None:
        self._open.add(handler)
        self._per_client[handler.peer] += 1
        self._quiet[handler] = None
        self._start_sweeper()

    def stop(self) -> None:
        """The listener is closing: held newcomers are refused (aiohttp's shutdown knows only the started ones,
        and a request starting now would find the app cleaned up), and none is held or placed from now on."""
        self._stopping = True
        for handler in list(self._held):
            self._refuse_held(handler)

    def _start_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def _lost(self, handler: _Handler) -> None:
        if handler.held is not None:
            del self._held[handler]
            handler.held = None
        elif handler in self._open:
            self._open.discard(handler)
            self._busy.discard(handler)
            self._quiet.pop(handler, None)
            left = self._per_client[handler.peer] - 1
            if left > 0:
                self._per_client[handler.peer] = left
            else:
                del self._per_client[handler.peer]

    def _begin(self, handler: _Handler) -> None:
        if handler in self._open:
            self._quiet.pop(handler, None)
            self._busy.add(handler)
            handler.head_since = None

    def _end(self, handler: _Handler) -> None:
        """A request on ``handler`` was answered: quiet from now, the newest of the quiet."""
        if handler in self._open:
            self._busy.discard(handler)
            handler.served += 1
            handler.quiet_since = time.monotonic()
            handler.head_since = None
            self._quiet[handler] = None
            self._quiet.move_to_end(handler)

    # ------------------------------------------------------------ limits

    def _longest_idle(self, now: float, eager: bool) -> _Handler | None:
        """The connection to close to make room for a newcomer, longest-quiet first: one that has not finished
        a head (or sent nothing) for over GRACE; for a newcomer whose request is already waiting, else one
        that has sent nothing at all, else a keep-alive one, else any quiet one; else None (refused).

        A newcomer that has sent nothing takes only a stale connection's place, so a flood of silent
        connections cannot push out a pool's keep-alive connections or a client that asked."""
        candidates = list(itertools.islice(self._quiet, 256))  # bounded work per accept; the front is the likeliest
        # Stale by the clock, unless its request has come and waits for a busy loop to read or start it.
        stale = next((h for h in candidates if not (h.served and h.head_since is None)
                      and now - h.head_started() > GRACE and not h.asked()), None)
        if stale is not None or not eager:
            return stale
        silent = next((h for h in candidates if not (h.served or h.eager or h.head_since is not None)), None)
        kept = next((h for h in candidates if h.served and h.head_since is None), None)
        return silent or kept or next(iter(candidates), None)

    def _close(self, handler: _Handler, reason: str) -> None:
        transport = handler.transport
        # A part of a head, or a body cut before any of its answer went out, is told why (as nginx does).
        timed_out = handler.head_since is not None or (reason == "body-timeout" and not handler.answer_started())
        if timed_out and transport is not None:
            transport.write(_REQUEST_TIMEOUT)
        self._lost(handler)
        self._count(reason)
        if transport is not None:
            transport.close()

    def _count(self, reason: str) -> None:
        self.closed[reason] += 1
        if self.metrics is not None:
            self.metrics.closed.labels(reason).inc()

    async def _sweep(self) -> None:
        limits = self.limits
        while self._open or self._held:
            await asyncio.sleep(limits.tick)
            now = time.monotonic()
            self._expire_held(now)
            for handler in list(self._quiet):
                if handler.served and handler.head_since is None:
                    if now - handler.quiet_since > limits.idle_timeout:
                        self._close(handler, "idle-timeout")
                elif now - handler.head_started() > limits.header_timeout:
                    self._close(handler, "header-timeout")
            for handler in list(self._busy):
                if handler.reading_body() and now - handler.last_read > limits.body_timeout:
                    self._close(handler, "body-timeout")
            self.report()

    def report(self) -> None:
        """Bring the gauges up to date (each tick, and at a scrape); tell what the log rate limit left out."""
        flush_suppressed()
        if self.metrics is not None:
            self.metrics.open.set(len(self._open))
            self.metrics.held.set(len(self._held))
            self.metrics.sync_suppressed()

    # ------------------------------------------------------------ accept failures

    def accept_failed(self, error: BaseException | None) -> None:
        """asyncio could not accept (descriptors or memory exhausted): counted, logged once per interval."""
        now = time.monotonic()
        self.accept_errors += 1
        self._accept_failed_at = now
        if self.metrics is not None:
            self.metrics.accept_errors.inc()
        self._accept_unlogged += 1
        if now - self._accept_logged_at >= _ACCEPT_LOG_EVERY:
            log.warning("cannot accept connections: %s (%d time(s) in the last %.0f s; %d connections open); "
                        "retrying each second", error, self._accept_unlogged, _ACCEPT_LOG_EVERY, len(self._open))
            self._accept_logged_at, self._accept_unlogged = now, 0

    def problem(self) -> str | None:
        """What /readyz reports: accept() failing lately."""
        at = self._accept_failed_at
        if at is not None and time.monotonic() - at < _ACCEPT_READY_WINDOW:
            return f"cannot accept connections (out of descriptors or memory) in the last {_ACCEPT_READY_WINDOW:.0f} s"
        return None

    def exception_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The event loop's: accept failures counted here, everything else as asyncio would."""
        error = context.get("exception")
        if context.get("message") == _ACCEPT_TROUBLE or (
                isinstance(error, OSError) and error.errno in _ACCEPT_ERRNOS and "socket" in context):
            self.accept_failed(error)
            return
        if isinstance(error, ValueError) and "_start_serving" in repr(context.get("handle")):
            # asyncio's accept retry firing after the listening socket closed (a stop after accept failed).
            log.debug("accept retry after the listener closed: %s", error)
            return
        loop.default_exception_handler(context)


def _bytes_waiting(transport: asyncio.BaseTransport) -> bool:
    """Whether a client's first bytes already wait in the socket (a peek: nothing is consumed)."""
    if transport.get_extra_info("sslcontext") is not None:
        return True  # over TLS the handshake, already done, is the effort a silent flood does not make
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    peek = socket.socket(fileno=sock.fileno())
    try:
        return bool(peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:
        return False
    finally:
        peek.detach()


class _Handler(RequestHandler):
    """aiohttp's connection protocol, reporting to :class:`Connections` and answering ready requests itself."""

    __slots__ = (
        "_answer",
        "_conns",
        "_parser_clean",
        "_started",
        "eager",
        "head_since",
        "held",
        "last_read",
        "peer",
        "quiet_since",
        "served",
    )

    def __init__(self, manager: web.Server, *, conns: Connections, answer: Answer | None, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._conns = conns
        self._answer = answer
        # No byte given to aiohttp's parser was ever anything but one whole plain head:
        # its parser then holds nothing, and ours may take the next request.
        self._parser_clean = answer is not None
        self._started = False  # aiohttp's protocol runs: not refused, not held
        self.peer = ""
        self.served = 0  # requests answered
        self.quiet_since = self.last_read = time.monotonic()
        self.head_since: float | None = None  # first byte of a head not yet complete
        self.eager = False  # accepted at the cap with its request already waiting
        self.held: asyncio.BaseTransport | None = None  # accepted at the cap, no slot until it sends something

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        # Refused or held: aiohttp's protocol is not started, so no request task, nothing to fail or log later.
        if not self._conns._admit(self, transport):
            transport.abort()  # type: ignore[attr-defined]
        elif self.held is None:
            self._start(transport)

    def _start(self, transport: asyncio.BaseTransport) -> None:
        self._started = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._conns._lost(self)
        if self._started:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        now = self.last_read = time.monotonic()
        if self.held is not None:
            transport = self.held
            if not self._conns._asked(self):
                return
            self.quiet_since = now
            self._start(transport)
        if self._parser_clean:
            head = recognise(data)
            if head is not None and self._idle():
                reply = self._answer(head, self)  # type: ignore[misc]
                if reply is not None:
                    self.transport.write(reply)  # type: ignore[union-attr]
                    self._conns._end(self)
                    self._kept_alive()
                    return
            self._parser_clean = head is not None
        super().data_received(data)
        if self.head_since is None and not self._messages and self._payload_parser is None and self._waiting():
            self.head_since = now

    async def _handle_request(self, request: Any, start_time: Any, request_handler: Any) -> Any:
        # aiohttp's per-request coroutine: the response is written (and a file sent) when it returns.
        self._conns._begin(self)
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            self._conns._end(self)

    def _kept_alive(self) -> None:
        """What aiohttp does after a keep-alive response: its (backstop) idle clock starts again."""
        loop = self._loop
        close_time = loop.time() + self._keepalive_timeout
        self._next_keepalive_close_time = close_time
        if self._keepalive_handle is None:
            self._keepalive_handle = loop.call_at(close_time, self._process_keepalive)

    def head_started(self) -> float:
        """When the head being awaited started: the accept for a connection's first, else its first byte."""
        return self.quiet_since if not self.served or self.head_since is None else self.head_since

    def reading_body(self) -> bool:
        """A request whose body has not all arrived is in progress."""
        request = self._current_request
        return request is not None and request.can_read_body and not request.content.is_eof()

    def answer_started(self) -> bool:
        """Some of the current request's answer is on the wire (aiohttp buffers the head until the body)."""
        writer = getattr(self._current_request, "_payload_writer", None)
        return writer is not None and writer.output_size > 0

    def asked(self) -> bool:
        """A request has come that is not handled yet: parsed and queued, or its bytes unread in the socket
        (a plain one; over TLS they cannot be told from the record layer's own)."""
        transport = self.transport
        return bool(self._messages) or (transport is not None and transport.get_extra_info("sslcontext") is None
                                        and _bytes_waiting(transport))

    def _waiting(self) -> bool:
        waiter = self._waiter
        return waiter is not None and not waiter.done()

    def _idle(self) -> bool:
        """No request queued or in flight, and everything sent: a client that does not read its
        answers gets aiohttp's path, which waits for the socket to drain before the next one."""
        transport = self.transport
        return (self._waiting() and not self._messages and not self._force_close and not self._close
                and self._payload_parser is None and not self._upgraded
                and transport is not None and not transport.get_write_buffer_size())


class _Server(web.Server):
    """aiohttp's ``Server``, making :class:`_Handler` connections."""

    _conns: Connections
    _answer: Answer | None

    def __call__(self) -> RequestHandler:
        return _Handler(self, loop=self._loop, conns=self._conns, answer=self._answer, **self._kwargs)


def internals_present() -> bool:
    """Whether this aiohttp has every private name the handler and server use."""
    return all(hasattr(RequestHandler, n) for n in HANDLER_NEEDED) and "_make_server" in vars(web.AppRunner)


class _Runner(web.AppRunner):
    def __init__(self, app: web.Application, conns: Connections, ready: Answer | None, **kwargs: Any) -> None:
        # aiohttp's own keep-alive clock is only a backstop: Connections keeps the real deadlines.
        limits = conns.limits
        super().__init__(app, keepalive_timeout=2 * max(limits.header_timeout, limits.idle_timeout) + 1, **kwargs)
        self._conns = conns
        self._ready = ready
        self.limited = False

    async def _make_server(self) -> Any:
        server = await super()._make_server()
        if type(server) is web.Server and internals_present() and all(hasattr(server, n) for n in SERVER_NEEDED):
            server.__class__ = _Server
            server._conns = self._conns  # type: ignore[attr-defined]
            server._answer = self._ready  # type: ignore[attr-defined]
            self.limited = True
        return server


class Listener:
    """One listening socket's HTTP server over ``app``, under ``limits``.

    ``ready`` (optional) answers warm requests on the hot path; ``middlewares`` are
    added to ``app`` after its own; ``registry`` gets :class:`ListenerMetrics`.
    """

    def __init__(self, app: web.Application, limits: Limits, *, registry: CollectorRegistry | None = None,
                 ready: Answer | None = None, middlewares: Iterable[Any] = (), shutdown_timeout: float = 60.0) -> None:
        app.middlewares.extend(middlewares)
        self.limits = limits
        self.connections = Connections(limits, ListenerMetrics(registry, limits) if registry is not None else None)
        self.runner = _Runner(app, self.connections, ready, access_log=None, handle_signals=False,
                              shutdown_timeout=shutdown_timeout)
        self._ready = ready

    @property
    def hot_path(self) -> bool:
        """Whether warm requests are answered below aiohttp's web layer."""
        return self.runner.limited and self._ready is not None

    async def start(self, *, sock: Any = None, host: str = "127.0.0.1", port: int = 0,
                    ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen on ``sock`` (bound already) or ``host:port``; the port listened on. OSError if it cannot."""
        await self.runner.setup()
        if not self.runner.limited:
            log.warning("this aiohttp lacks the internals the listener needs: connections are limited only by "
                        "aiohttp's own keep-alive timeout, and there is no hot path")
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self.connections.exception_handler)
        backlog = self.limits.backlog
        site = (web.SockSite(self.runner, sock, ssl_context=ssl_context, backlog=backlog) if sock is not None
                else web.TCPSite(self.runner, host, port, ssl_context=ssl_context, backlog=backlog))
        try:
            await site.start()
        except OSError:
            await self.runner.cleanup()
            raise
        return int(self.runner.addresses[0][1])

    def describe(self) -> str:
        limits = self.limits
        per_client = limits.max_connections_per_client or "no cap"
        return (f"connections: at most {limits.max_connections} ({per_client} per client), head within "
                f"{limits.header_timeout:g} s, idle {limits.idle_timeout:g} s, body silent {limits.body_timeout:g} s, "
                f"backlog {limits.backlog}")

    async def stop(self) -> None:
        self.connections.stop()
        await self.runner.cleanup()
