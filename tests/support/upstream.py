"""A real HTTP upstream on 127.0.0.1 that serves a directory, and can lie.

Tests put a signed repository tree behind it and then make it tamper,
roll back, freeze or withhold by registering overrides for paths.  It runs
in its own thread so it is independent of any event loop under test, and
it logs every request path so tests can count upstream fetches.
"""

from __future__ import annotations

import http.server
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Reply:
    """What the upstream answers for one request."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] | None = None


# An override sees the bytes the tree holds for the path (None if absent).
Override = Callable[[bytes | None], Reply]


class _QuietServer(http.server.ThreadingHTTPServer):
    """A client hanging up early (the proxy refusing endless data) is normal here, not a traceback."""

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


class Upstream:
    """Static file server for ``root`` with per-path overrides."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.requests: list[str] = []
        self._overrides: list[tuple[re.Pattern[str], Override]] = []
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/"

    def override(self, pattern: str, handler: Override) -> None:
        """Answer paths matching the regex ``pattern`` (full match) with ``handler``."""
        with self._lock:
            self._overrides.insert(0, (re.compile(pattern), handler))

    def replace(self, pattern: str, body: bytes) -> None:
        """Serve ``body`` instead of the file for matching paths."""
        self.override(pattern, lambda _orig: Reply(200, body))

    def status(self, pattern: str, code: int) -> None:
        """Answer matching paths with a bare status code."""
        self.override(pattern, lambda _orig: Reply(code, b""))

    def clear(self) -> None:
        """Drop every override: serve the tree as it is."""
        with self._lock:
            self._overrides.clear()

    def count(self, pattern: str) -> int:
        """How many requests so far had a path matching ``pattern``."""
        rx = re.compile(pattern)
        with self._lock:
            return sum(1 for p in self.requests if rx.fullmatch(p))

    def _answer(self, path: str) -> Reply:
        with self._lock:
            self.requests.append(path)
            overrides = list(self._overrides)
        local = (self.root / path.lstrip("/")).resolve()
        data: bytes | None = None
        if local.is_relative_to(self.root.resolve()):
            if local.is_dir():
                local = local / "index.html"
            if local.is_file():
                data = local.read_bytes()
        for rx, handler in overrides:
            if rx.fullmatch(path):
                return handler(data)
        if data is None:
            return Reply(404, b"not found")
        return Reply(200, data)

    def start(self) -> Upstream:
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                reply = upstream._answer(unquote(urlsplit(self.path).path))
                self.send_response(reply.status)
                headers = {"Content-Length": str(len(reply.body)), **(reply.headers or {})}
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Upstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
