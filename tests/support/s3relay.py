"""A TCP relay in front of an S3 endpoint that stalls the body of one PUT, for crash tests.

Requests pass through unchanged, read as HTTP/1.1 (request line, headers,
a ``Content-Length`` body) so the relay knows where each one starts.  The
first PUT whose path contains ``watch`` is forwarded with its headers and
the first ``hold_after`` bytes of its body; then :attr:`put_began` is set
and that connection stalls (nothing more reaches the store, the client's
writes back up) until :meth:`close`, which cuts every connection: the store
sees a body that ended early.
"""

from __future__ import annotations

import socket
import threading

_MAX_HEAD = 64 * 1024


class S3Relay:
    def __init__(self, target_port: int, watch: str, hold_after: int = 256 * 1024) -> None:
        self.target_port = target_port
        self.watch = watch.encode()
        self.hold_after = hold_after
        self.put_began = threading.Event()
        self.body_forwarded = 0  # bytes of the watched PUT's body the store received
        self.head = b""  # the watched PUT's request head
        self.error: str | None = None  # a request the relay could not follow
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> S3Relay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            for s in [self._server, *self._sockets]:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._server.accept()
                store = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
                store.settimeout(None)
            except OSError:
                return
            with self._lock:
                self._sockets += [client, store]
            threading.Thread(target=self._copy, args=(store, client), daemon=True).start()
            threading.Thread(target=self._requests, args=(client, store), daemon=True).start()

    def _copy(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass

    def _requests(self, client: socket.socket, store: socket.socket) -> None:
        """Forward requests one by one; stall inside the watched PUT's body."""
        buffered = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffered:
                    data = client.recv(65536)
                    if not data or len(buffered) > _MAX_HEAD:
                        return
                    buffered += data
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                head += b"\r\n\r\n"
                length = _content_length(head)
                if length is None:
                    self.error = f"the relay follows Content-Length bodies only: {head[:200]!r}"
                    return
                watched = head.startswith(b"PUT ") and self.watch in head.split(b"\r\n", 1)[0] \
                    and not self.put_began.is_set()
                store.sendall(head)
                sent = 0
                while sent < length:
                    if not buffered:
                        buffered = client.recv(65536)
                        if not buffered:
                            return
                    take = buffered[:length - sent]
                    if watched and sent + len(take) >= self.hold_after:
                        take = take[:max(0, self.hold_after - sent)]
                        store.sendall(take)
                        self.body_forwarded = sent + len(take)
                        self.head = head
                        self.put_began.set()
                        self._closing.wait()  # stalled until the test cuts everything
                        return
                    store.sendall(take)
                    sent += len(take)
                    buffered = buffered[len(take):]
        except OSError:
            return


def _content_length(head: bytes) -> int | None:
    """The body's length; None for a chunked body."""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"transfer-encoding":
            return None
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return length
