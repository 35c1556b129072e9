"""The simple-request recogniser, with plain bytes: what it takes, and everything it leaves to aiohttp."""

from __future__ import annotations

import pytest

from proxy.protocol.requesthead import MAX_HEAD, SimpleHead, recognise

PIP_HEAD = (b"GET /simple/lib/ HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: pip/24.0 {\"ci\":null}\r\n"
            b"Accept-Encoding: gzip, deflate\r\n"
            b"Accept: application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01\r\n"
            b"Connection: keep-alive\r\nCache-Control: max-age=0\r\n\r\n")


def test_a_pip_request_is_recognised_with_what_a_page_answer_needs() -> None:
    assert recognise(PIP_HEAD) == SimpleHead(
        "GET", "/simple/lib/",
        accept="application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01")


def test_head_conditional_and_request_id_are_read() -> None:
    head = recognise(b'HEAD /simple/ HTTP/1.1\r\nhost: x\r\nIF-NONE-MATCH:  W/"a-json" ,"b" \r\nX-Request-Id: r-1\r\n\r\n')
    assert head == SimpleHead("HEAD", "/simple/", None, 'W/"a-json" ,"b"', "r-1")


@pytest.mark.parametrize("field", [b"Range: bytes=0-9", b"If-Range: \"e\"", b"if-modified-since: Sun, 06 Dec 2026 17:00:00 GMT",
                                   b"If-Match: *", b"If-Unmodified-Since: Sun, 06 Dec 2026 17:00:00 GMT"])
def test_a_field_that_changes_a_files_answer_is_noted(field: bytes) -> None:
    """A page ignores these, so the head stays simple; a file's hot answer must not (it would send the whole file)."""
    head = recognise(b"GET /packages/lib/lib-1.0.tar.gz HTTP/1.1\r\nHost: x\r\n" + field + b"\r\n\r\n")
    assert head == SimpleHead("GET", "/packages/lib/lib-1.0.tar.gz", conditional=True)
    assert recognise(PIP_HEAD).conditional is False  # type: ignore[union-attr]


def test_an_empty_accept_is_kept_empty() -> None:
    assert recognise(b"GET / HTTP/1.1\r\nHost: x\r\nAccept:\r\n\r\n") == SimpleHead("GET", "/", accept="")


@pytest.mark.parametrize("data", [
    # not a whole head, or more than one thing
    b"",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\n\r",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\n\r\nGET /simple/lib/ HTTP/1.1\r\nHost: x\r\n\r\n",  # pipelined
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\n\r\nG",
    b"GET /simple/lib/ HTTP/1.1\nHost: x\n\n",  # bare LF
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\nX: y\r\n\r\n",
    # methods, versions, targets
    b"POST /simple/lib/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"get /simple/lib/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.0\r\nHost: x\r\n\r\n",
    b"GET /simple/lib/ HTTP/2.0\r\nHost: x\r\n\r\n",
    b"GET  /simple/lib/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET http://x/simple/lib/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /simple/lib/?q=1 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /simple/lib/#f HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /simple/%6cib/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /simple/../simple/lib/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /simple/./lib/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /simple/lib/.. HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET //simple/lib/ HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /simple/l\xc3\xafb/ HTTP/1.1\r\nHost: x\r\n\r\n",
    # Host: missing, repeated, odd
    b"GET /simple/lib/ HTTP/1.1\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost:\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: a b\r\n\r\n",
    # bodies, expectations, upgrades, connection management
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, TE\r\nTE: trailers\r\n\r\n",
    # repeats of what is read or what aiohttp allows once
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nAccept: text/html\r\naccept: application/json\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"a\"\r\nIf-None-Match: \"b\"\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nUser-Agent: a\r\nUser-Agent: b\r\n\r\n",
    # malformed fields
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nX-Space : a\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nNo colon\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\n: empty name\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nX-Nul: a\x00b\r\n\r\n",
    b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\nX-Latin: caf\xe9\r\n\r\n",
], ids=repr)
def test_anything_else_is_not_mine(data: bytes) -> None:
    assert recognise(data) is None


def test_huge_heads_and_too_many_fields_are_not_mine() -> None:
    line = b"GET /simple/lib/ HTTP/1.1\r\nHost: x\r\n"
    assert recognise(line + b"X-Pad: " + b"a" * (MAX_HEAD - len(line) - 11) + b"\r\n\r\n") is not None
    assert recognise(line + b"X-Pad: " + b"a" * (MAX_HEAD - len(line) - 10) + b"\r\n\r\n") is None
    assert recognise(line + b"".join(b"X-%d: y\r\n" % i for i in range(63)) + b"\r\n") is not None
    assert recognise(line + b"".join(b"X-%d: y\r\n" % i for i in range(64)) + b"\r\n") is None
