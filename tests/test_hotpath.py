"""Warm pages answered below aiohttp's web layer, over raw sockets against a real proxy process.

A connection that ever carried something other than one plain request at a
time is left to aiohttp for good, so the same request sent there gives
aiohttp's own answer: the hot answer must be the same bytes but for ``Date``
and ``X-Request-Id``.  ``tufproxy_hot_answers_total`` says which path
answered.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import time
from pathlib import Path

import pytest

from tests.conftest import SampleRepo
from tests.support.certs import CA
from tests.support.proxyproc import ProxyProcess
from tests.support.upstream import Upstream

JSON = "application/vnd.pypi.simple.v1+json"
PAGE = "/simple/lib/"
WHEEL = "/packages/base/base-2.0-py3-none-any.whl"
# Sent first on a connection to leave it to aiohttp for good (a query string is never simple).
COLD_OPENER = b"GET /healthz?cold HTTP/1.1\r\nHost: x\r\n\r\n"
Response = tuple[int, list[tuple[str, str]], bytes]


@pytest.fixture
def proxy(tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream):
    root = tmp_path / "root.json"
    root.write_bytes(sample_repo.root_bytes)
    with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", str(root), "--workers", "1") as p:
        yield p


def head(method: str = "GET", path: str = PAGE, **fields: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k.replace('_', '-')}: {v}" for k, v in fields.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Conn:
    """A raw client connection reading HTTP/1.1 responses (Content-Length framed) one by one."""

    def __init__(self, proxy: ProxyProcess, cold: bool = False, tls: ssl.SSLContext | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname="127.0.0.1")
        self.buf = b""
        if cold:
            assert self.ask(COLD_OPENER)[0] == 200

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the proxy")
        self.buf += chunk

    def response(self, method: str = "GET") -> Response:
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        raw, _, self.buf = self.buf.partition(b"\r\n\r\n")
        status_line, *lines = raw.decode("latin-1").split("\r\n")
        headers = [tuple(line.split(": ", 1)) for line in lines]
        length = 0 if method == "HEAD" else int(dict(headers).get("Content-Length", "0"))
        while len(self.buf) < length:
            self._fill()
        body, self.buf = self.buf[:length], self.buf[length:]
        return int(status_line.split()[1]), headers, body  # type: ignore[return-value]

    def ask(self, data: bytes) -> Response:
        self.send(data)
        return self.response(data.split(b" ", 1)[0].decode())

    def closed_by_peer(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionError:
            return True

    def close(self) -> None:
        self.sock.close()


def hot_answers(proxy: ProxyProcess, tls: ssl.SSLContext | None = None) -> float:
    conn = (http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10) if tls is None
            else http.client.HTTPSConnection("127.0.0.1", proxy.port, timeout=10, context=tls))
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return sum(float(v) for v in re.findall(r"^tufproxy_hot_answers_total\{[^}]*\} (\S+)$", text, re.M))


def comparable(response: Response) -> tuple[int, list[tuple[str, str]], bytes]:
    status, headers, body = response
    return status, sorted((k, "-" if k in ("Date", "X-Request-Id") else v) for k, v in headers), body


@pytest.mark.slow
def test_a_warm_page_is_answered_hot_with_the_bytes_aiohttp_sends(proxy: ProxyProcess) -> None:
    hot, cold = Conn(proxy), Conn(proxy, cold=True)
    first = cold.ask(head(Accept=JSON))  # renders the page and keeps it ready
    assert first[0] == 200 and json.loads(first[2])["name"] == "lib"
    etag = dict(first[1])["ETag"]
    before = hot_answers(proxy)
    asks = [head(Accept=JSON), head("HEAD", Accept=JSON), head(Accept=JSON, If_None_Match=etag),
            head(Accept=JSON, If_None_Match='"other"'), head(Accept=JSON, X_Request_Id="mine-1")]
    statuses = []
    for data in asks:
        want, got = cold.ask(data), hot.ask(data)
        assert comparable(got) == comparable(want), data
        statuses.append(got[0])
    assert statuses == [200, 200, 304, 200, 200]
    assert dict(hot.ask(head(Accept=JSON, X_Request_Id="mine-2"))[1])["X-Request-Id"] == "mine-2"
    assert hot_answers(proxy) - before == len(asks) + 1
    # Another media type is rendered (by aiohttp's path) the first time, then kept ready too.
    html = hot.ask(head(Accept="text/html"))
    assert html[0] == 200 and dict(html[1])["Content-Type"].startswith("text/html") and b"lib-1.1" in html[2]
    # That first answer waited for the HTML page's bytes and says so (Server-Timing); the hot one is the rest of it.
    assert dict(html[1])["Server-Timing"].startswith("page;dur=")
    waited = (html[0], [(k, v) for k, v in html[1] if k != "Server-Timing"], html[2])
    assert comparable(hot.ask(head(Accept="text/html"))) == comparable(waited)
    assert hot_answers(proxy) - before == len(asks) + 2
    # The request metrics count hot answers under the same labels.
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    count = re.search(r'^tufproxy_requests_total\{route="project_index",status="304"\} (\S+)$', text, re.M)
    assert count is not None and float(count[1]) == 2  # one cold, one hot


@pytest.mark.slow
def test_keep_alive_files_and_connection_close(proxy: ProxyProcess, sample_repo: SampleRepo) -> None:
    conn = Conn(proxy)
    assert conn.ask(head(Accept=JSON))[0] == 200
    before = hot_answers(proxy)
    for _ in range(50):
        assert conn.ask(head(Accept=JSON))[0] == 200
    wheel = (sample_repo.repo.public_dir / WHEEL.lstrip("/")).read_bytes()
    assert conn.ask(head(path=WHEEL))[2] == wheel  # a file: aiohttp's FileResponse, on the same connection
    assert conn.ask(head(Accept=JSON))[0] == 200  # and the next page is hot again
    assert hot_answers(proxy) - before == 51
    status, headers, _ = conn.ask(head(Accept=JSON, Connection="close"))
    assert status == 200 and ("Connection", "close") in headers
    assert conn.closed_by_peer()
    assert hot_answers(proxy) - before == 51


@pytest.mark.slow
def test_a_small_warm_file_is_answered_hot_with_the_bytes_aiohttp_sends(
        proxy: ProxyProcess, sample_repo: SampleRepo) -> None:
    """Served once from the store, a file is kept in memory; its conditions and parts are still FileResponse's."""
    wheel = (sample_repo.repo.public_dir / WHEEL.lstrip("/")).read_bytes()
    hot, cold = Conn(proxy), Conn(proxy, cold=True)
    assert cold.ask(head(path=WHEEL))[2] == wheel  # cold: fetched, verified, stored
    first = cold.ask(head(path=WHEEL))  # from the store: kept in memory as it goes
    assert first[0] == 200 and first[2] == wheel
    etag = dict(first[1])["Etag"]
    before = hot_answers(proxy)
    for data in (head(path=WHEEL), head("HEAD", path=WHEEL), head(path=WHEEL, X_Request_Id="mine-1")):
        want, got = cold.ask(data), hot.ask(data)
        assert got[0] == 200 and comparable(got) == comparable(want), data
    assert hot_answers(proxy) - before == 3
    # A part, or a condition: aiohttp's FileResponse answers, on the same connection, which stays hot.
    for data, status, body in ((head(path=WHEEL, Range="bytes=0-9"), 206, wheel[:10]),
                               (head(path=WHEEL, If_None_Match=etag), 304, b""),
                               (head(path=WHEEL, If_Modified_Since=dict(first[1])["Last-Modified"]), 304, b""),
                               (head(path=WHEEL, If_Match='"other"'), 412, None)):
        got = hot.ask(data)
        assert got[0] == status and (body is None or got[2] == body), data
    assert hot_answers(proxy) - before == 3
    assert hot.ask(head(path=WHEEL))[2] == wheel
    assert hot_answers(proxy) - before == 4


@pytest.mark.slow
def test_over_tls_a_file_from_the_store_and_from_memory_are_the_same_answer(
        tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream) -> None:
    """Over TLS the full path sends a stored file by its own loop (not FileResponse): the same headers,
    validators and request id as the hot answer that follows it."""
    ca = CA(tmp_path / "pki")
    ca.issue(tmp_path / "pki" / "edge.pem", tmp_path / "pki" / "edge.key")
    tls = ssl.create_default_context(cafile=str(ca.path))
    root = tmp_path / "root.json"
    root.write_bytes(sample_repo.root_bytes)
    wheel = (sample_repo.repo.public_dir / WHEEL.lstrip("/")).read_bytes()
    with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", str(root), "--workers", "1",
                      "--tls-cert", str(tmp_path / "pki" / "edge.pem"), "--tls-key", str(tmp_path / "pki" / "edge.key")) as p:
        conn = Conn(p, tls=tls)
        cold = conn.ask(head(path=WHEEL, X_Request_Id="cold-1"))  # streamed as it is fetched
        assert cold[2] == wheel and ("X-Request-Id", "cold-1") in cold[1]
        stored = conn.ask(head(path=WHEEL, X_Request_Id="stored-1"))  # from the store, kept in memory
        assert stored[2] == wheel and ("X-Request-Id", "stored-1") in stored[1]
        before = hot_answers(p, tls)
        kept = conn.ask(head(path=WHEEL))
        assert hot_answers(p, tls) - before == 1
        assert comparable(kept) == comparable(stored)
        assert {"Etag", "Last-Modified", "Accept-Ranges"} <= dict(stored[1]).keys()


@pytest.mark.slow
def test_pipelined_and_split_requests_are_answered_in_order(proxy: ProxyProcess) -> None:
    Conn(proxy).ask(head(Accept=JSON))
    Conn(proxy).ask(head(Accept="text/html"))
    before = hot_answers(proxy)
    conn = Conn(proxy)
    conn.send(head(Accept=JSON) + head("HEAD", Accept="text/html") + head(path="/simple/base/", Accept=JSON))
    first, second, third = conn.response(), conn.response("HEAD"), conn.response()
    assert json.loads(first[2])["name"] == "lib"
    assert dict(second[1])["Content-Type"].startswith("text/html") and second[2] == b""
    assert json.loads(third[2])["name"] == "base"
    assert json.loads(conn.ask(head(Accept=JSON))[2])["name"] == "lib"
    # Pipelined bytes are aiohttp's, and so is everything after them on that connection.
    assert hot_answers(proxy) == before
    # A head in two parts: aiohttp's if they arrive apart, one plain request if together; right either way.
    split = head(Accept=JSON)
    for cut in (5, len(split) - 2, len(split) - 1):
        conn = Conn(proxy)
        conn.send(split[:cut])
        conn.send(split[cut:])
        assert json.loads(conn.response()[2])["name"] == "lib"
        assert json.loads(conn.ask(split)[2])["name"] == "lib"


@pytest.mark.parametrize("data,status", [
    (b"GET /simple/lib/ HTTP/1.0\r\nHost: x\r\nAccept: " + JSON.encode() + b"\r\n\r\n", 200),
    (b"GET /simple/lib/ HTTP/1.1\r\nAccept: " + JSON.encode() + b"\r\n\r\n", 400),  # no Host
    (b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400),
    (b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nUser-Agent: a\r\nUser-Agent: b\r\n\r\n", 400),
    (b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 200),
    (b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 200),
    (b"GET /simple/lib/?x=1 HTTP/1.1\r\nHost: x\r\n\r\n", 200),
    (b"GET /simple/%6cib/ HTTP/1.1\r\nHost: x\r\n\r\n", 200),
    (b"GET /simple/x/../lib/ HTTP/1.1\r\nHost: x\r\n\r\n", 404),
    (b"DELETE /simple/lib/ HTTP/1.1\r\nHost: x\r\n\r\n", 405),
    (b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nAccept: image/png\r\n\r\n", 406),
    (b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", 200),
], ids=lambda v: v if isinstance(v, int) else repr(v[:60]))
@pytest.mark.slow
def test_odd_requests_get_aiohttps_answer(proxy: ProxyProcess, data: bytes, status: int) -> None:
    Conn(proxy).ask(head(Accept="text/html"))
    Conn(proxy).ask(head())
    before = hot_answers(proxy)
    conn = Conn(proxy)
    conn.send(data)
    assert conn.response()[0] == status
    assert hot_answers(proxy) == before


@pytest.mark.slow
def test_expect_continue_gets_aiohttps_interim_answer(proxy: ProxyProcess) -> None:
    Conn(proxy).ask(head())
    before = hot_answers(proxy)
    conn = Conn(proxy)
    conn.send(head(Expect="100-continue"))
    assert conn.response()[0] == 100
    assert conn.response()[0] == 200
    assert hot_answers(proxy) == before


@pytest.mark.slow
def test_hot_answers_keep_a_connection_alive_and_idle_ones_still_close(
        tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream) -> None:
    """Each hot answer restarts the idle clocks (aiohttp's keep-alive, the idle sweeper), as aiohttp's answers do."""
    root = tmp_path / "root.json"
    root.write_bytes(sample_repo.root_bytes)
    with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", str(root), "--workers", "1",
                      "--idle-timeout", "1", "--header-timeout", "1") as p:
        conn = Conn(p)
        assert conn.ask(head(Accept=JSON))[0] == 200
        before = hot_answers(p)
        end = time.monotonic() + 3  # three idle timeouts, one request every 0.2 s
        asked = 0
        while time.monotonic() < end:
            assert conn.ask(head(Accept=JSON))[0] == 200
            asked += 1
            time.sleep(0.2)  # pacing, not synchronisation: each gap is well inside the timeout
        assert hot_answers(p) - before == asked
        conn.sock.settimeout(10)
        started = time.monotonic()
        assert conn.closed_by_peer()  # blocks until the proxy closes the idle connection
        assert time.monotonic() - started < 5
