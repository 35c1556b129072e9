"""Connection floods against a server on 127.0.0.1, as an attacker on the same network would send them.

:class:`Flood` holds ``count`` connections (optionally each sending a first
request, or part of one) and, with ``reopen``, opens a new one for each the
server closes, in a thread of its own until :meth:`Flood.stop`.  Plain
sockets: the point is what the server does with them, not a client library's
politeness.  Bounded: never more than ``count`` sockets at once.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time


def connect(port: int) -> socket.socket | None:
    """A connection to 127.0.0.1:``port``, or None if it was refused or reset at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(5)
    try:
        sock.connect(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    sock.setblocking(False)
    return sock


def drained(sock: socket.socket) -> tuple[bool, bytes]:
    """(closed by the peer, every byte it sent that was waiting), without blocking."""
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
        return True, got
    except BlockingIOError:
        return False, got
    except OSError as e:
        return e.errno in (errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN), got


class Flood:
    """``count`` connections to ``port``, each sending ``first`` (may be b""); re-opened when closed if ``reopen``."""

    def __init__(self, port: int, count: int, first: bytes = b"", reopen: bool = False) -> None:
        self.port, self.count, self.first, self.reopen = port, count, first, reopen
        self.opened = 0  # connections made, re-opened ones included
        self.closed = 0  # closed by the server
        self.answers: list[bytes] = []  # what the server sent each before closing it (first 64 bytes)
        self._socks: dict[socket.socket, bytes] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Flood:
        for _ in range(self.count):
            self._open()
        if self.reopen:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def held(self) -> int:
        return len(self._socks)

    def _open(self) -> None:
        sock = connect(self.port)
        if sock is None:
            self.closed += 1
            return
        self.opened += 1
        if self.first:
            with contextlib.suppress(OSError):
                sock.send(self.first)
        self._socks[sock] = b""

    def send_all(self, data: bytes) -> None:
        """A few more bytes on every held connection (a slowloris's drip)."""
        for sock in list(self._socks):
            with contextlib.suppress(OSError):
                sock.send(data)

    def collect(self) -> int:
        """Take in what the server closed (and what it said first); how many are still open."""
        for sock in list(self._socks):
            closed, got = drained(sock)
            self._socks[sock] += got
            if closed:
                self.answers.append(self._socks.pop(sock)[:64])
                self.closed += 1
                sock.close()
        return len(self._socks)

    def _run(self) -> None:
        while not self._stop.is_set():
            selector = selectors.DefaultSelector()
            for sock in self._socks:
                selector.register(sock, selectors.EVENT_READ)
            selector.select(0.05)
            selector.close()
            self.collect()
            while len(self._socks) < self.count and not self._stop.is_set():
                self._open()
            if not self._socks:
                time.sleep(0.01)  # a refused connect is immediate: do not spin on them

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for sock in self._socks:
            sock.close()
        self._socks.clear()
