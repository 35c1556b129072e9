"""The proxy's HTTP surface, request by request: negotiation, redirects, files, hostile paths."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
from datetime import UTC, datetime, timezone
from pathlib import Path

import pytest

from proxy.repository.sample import build_wheel
from tests.conftest import SampleRepo
from tests.support.proxyproc import ProxyProcess
from tests.support.upstream import Upstream

WHEEL = "/packages/base/base-2.0-py3-none-any.whl"


@pytest.fixture
def proxy(tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream):
    root = tmp_path / "root.json"
    root.write_bytes(sample_repo.root_bytes)
    with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", str(root)) as p:
        yield p


def request(proxy: ProxyProcess, path: str, method: str = "GET", **headers: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k.replace("_", "-"), v)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("accept,ctype", [
    ("application/vnd.pypi.simple.v1+json", "application/vnd.pypi.simple.v1+json"),
    ("application/vnd.pypi.simple.v1+html", "application/vnd.pypi.simple.v1+html"),
    ("text/html", "text/html"),
    ("application/vnd.pypi.simple.v1+json;q=0.2, text/html;q=0.9", "text/html"),
    ("*/*", "text/html"),
])
@pytest.mark.slow
def test_content_negotiation(proxy: ProxyProcess, accept: str, ctype: str) -> None:
    status, headers, body = request(proxy, "/simple/lib/", Accept=accept)
    assert status == 200 and headers["content-type"].startswith(ctype)
    assert "accept" in headers["vary"].lower()
    if "json" in ctype:
        page = json.loads(body)
        assert page["meta"]["api-version"] and page["versions"] == ["1.0", "1.1"]
        assert all(f["url"].startswith("../../packages/lib/") for f in page["files"])
    else:
        assert b'href="../../packages/lib/lib-1.1-py3-none-any.whl#sha256=' in body


@pytest.mark.slow
def test_a_page_revalidates_with_its_etag_on_either_event_loop(
        tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream) -> None:
    """ETag and If-None-Match over HTTP, on uvloop when installed (``--uvloop yes``; the other tests run the default)."""
    root = tmp_path / "root.json"
    root.write_bytes(sample_repo.root_bytes)
    with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", str(root), "--uvloop", "yes") as p:
        status, headers, body = request(p, "/simple/lib/", Accept="text/html")
        assert status == 200 and headers["etag"].startswith('"') and b"lib-1.1" in body
        status, again, body = request(p, "/simple/lib/", Accept="text/html", If_None_Match=headers["etag"])
        assert (status, again["etag"], body) == (304, headers["etag"], b"")
        assert "accept" in again["vary"].lower()
        status, json_headers, _ = request(p, "/simple/lib/", Accept="application/vnd.pypi.simple.v1+json",
                                          If_None_Match=headers["etag"])
        assert status == 200 and json_headers["etag"] != headers["etag"]


@pytest.mark.slow
def test_nothing_acceptable_is_406(proxy: ProxyProcess) -> None:
    assert request(proxy, "/simple/lib/", Accept="application/json")[0] == 406


@pytest.mark.slow
def test_root_list_in_both_formats(proxy: ProxyProcess) -> None:
    status, _, body = request(proxy, "/simple/", Accept="application/vnd.pypi.simple.v1+json")
    assert status == 200 and [p["name"] for p in json.loads(body)["projects"]] == ["app", "base", "future-only", "lib"]
    status, _, body = request(proxy, "/simple/", Accept="text/html")
    assert (status == 200 and b'href="lib/"' in body) or b"lib" in body


@pytest.mark.slow
@pytest.mark.parametrize("path,location", [("/simple/Future_Only/", "../future-only/"), ("/simple/lib", "lib/")])
def test_non_normalised_names_redirect(proxy: ProxyProcess, path: str, location: str) -> None:
    status, headers, _ = request(proxy, path)
    assert status == 301 and headers["location"] == location


@pytest.mark.slow
def test_unknown_project_is_404_with_a_reason(proxy: ProxyProcess) -> None:
    status, _, body = request(proxy, "/simple/no-such-project/")
    assert status == 404 and b"no trusted metadata lists" in body


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["yes", "no"])
def test_a_warm_file_larger_than_the_socket_buffers_arrives_whole_on_either_loop(
        tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream, loop: str) -> None:
    """Whole or a Range of it, through a small receive window (uvloop has no native sendfile: aiohttp
    copies through the loop there), and marked busy while it is sent, so the idle sweeper leaves it be
    (with an 8 KiB window the same transfers take ~110 s here and still arrive whole)."""
    big = build_wheel(tmp_path / "big", "big", "1.0", payload=os.urandom(6 * 2**20))
    sample_repo.repo.add([big])
    data = big.read_bytes()
    root = tmp_path / "root.json"
    root.write_bytes(sample_repo.root_bytes)
    path = f"/packages/big/{big.name}"
    with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", str(root), "--uvloop", loop,
                      "--idle-timeout", "1", "--header-timeout", "1") as p:
        assert request(p, path)[2] == data  # cold: fetched and verified
        for headers, want in (({}, data), ({"Range": f"bytes=1000-{len(data) - 2}"}, data[1000:-1])):
            conn = http.client.HTTPConnection("127.0.0.1", p.port, timeout=30)
            conn.connect()
            assert conn.sock is not None
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            try:
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
                got = b"".join(iter(lambda resp=resp: resp.read(1024), b""))
            finally:
                conn.close()
            assert resp.status in (200, 206) and resp.getheader("ETag") and got == want


@pytest.mark.slow
def test_file_head_range_and_conditional_requests(proxy: ProxyProcess, sample_repo: SampleRepo) -> None:
    data = (sample_repo.repo.public_dir / WHEEL.lstrip("/")).read_bytes()
    status, headers, body = request(proxy, WHEEL)
    assert status == 200 and body == data and hashlib.sha256(body).hexdigest()
    assert "etag" not in headers  # streamed as it arrived: no file to name yet
    status, headers, body = request(proxy, WHEEL)
    assert status == 200 and body == data
    etag = headers["etag"]
    status, headers, body = request(proxy, WHEEL, "HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) == len(data)
    status, _, body = request(proxy, WHEEL, Range="bytes=10-19")
    assert status == 206 and body == data[10:20]
    status, _, body = request(proxy, WHEEL, Range="bytes=-5")
    assert status == 206 and body == data[-5:]
    assert request(proxy, WHEEL, Range=f"bytes={len(data) + 10}-")[0] == 416
    assert request(proxy, WHEEL, If_None_Match=etag)[0] == 304


@pytest.mark.parametrize("path", [
    "/packages/../../etc/passwd",
    "/packages/base/..%2f..%2fetc%2fpasswd",
    "/packages/base/%2e%2e",
    "/packages/base/x%00.whl",
    "/simple/" + "a" * 10_000 + "/",
    "/simple/%E2%98%83/",
    "//etc/passwd",
    "/packages/BASE/base-2.0-py3-none-any.whl",
])
@pytest.mark.slow
def test_hostile_paths_are_4xx_and_touch_nothing_outside(proxy: ProxyProcess, upstream: Upstream, path: str) -> None:
    before = len(upstream.requests)
    status, _, body = request(proxy, path)
    assert 400 <= status < 500, (status, body[:200])
    assert b"root:" not in body
    # Nothing about a hostile path reached the upstream (metadata refreshes aside).
    assert all("/metadata/" in p for p in upstream.requests[before:])


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["warehouse"], indirect=True)
def test_warehouse_profile_serves_json_rendered_from_the_signed_html_and_lists_its_bins(
    tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream
) -> None:
    root = tmp_path / "root.json"
    root.write_bytes(sample_repo.root_bytes)
    with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", str(root), "--profile", "warehouse") as p:
        status, headers, body = request(p, "/simple/lib/", Accept="application/vnd.pypi.simple.v1+json")
        assert status == 200 and headers["content-type"].startswith("application/vnd.pypi.simple.v1+json")
        page = json.loads(body)
        assert page["versions"] == ["1.0", "1.1"]  # derived from file names: the HTML page has none
        assert {f["filename"] for f in page["files"]} == {"lib-1.0-py3-none-any.whl", "lib-1.1-py3-none-any.whl"}
        # No root list is signed in this layout: the proxy lists the page targets its verified bins hold.
        status, _, body = request(p, "/simple/", Accept="application/vnd.pypi.simple.v1+json")
        assert status == 200 and [q["name"] for q in json.loads(body)["projects"]] == ["app", "base", "future-only", "lib"]
    # Only the signed HTML page was fetched, never an unsigned JSON rendering.
    assert upstream.count(r"/simple/lib/[0-9a-f]{64}\.lib\.html") == 1
    assert upstream.count(r"/simple/.*json") == 0


@pytest.mark.slow
def test_malformed_requests_are_refused_without_flooding_the_log(proxy: ProxyProcess) -> None:
    for garbage in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
            s.sendall(garbage)
            assert s.recv(100).split(b" ", 2)[1] == b"400"
    assert request(proxy, "/healthz")[0] == 200
    log = proxy.log()
    assert "bad request from a client" in log and "Traceback" not in log


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["warehouse"], indirect=True)
def test_a_signed_page_linking_files_to_a_foreign_host_is_refused_not_followed(
    tmp_path: Path, sample_repo: SampleRepo, upstream: Upstream
) -> None:
    from proxy.protocol import index
    from proxy.repository.signer import _Change

    repo = sample_repo.repo
    # The repository's own keys sign a page whose link points off the configured upstream.
    page = index.parse_project_html((repo.public_dir / "simple/base/index.html").read_bytes(), "base")
    foreign = index.with_urls(page, lambda f: f"http://127.0.0.2:9/{f.filename}")
    with repo._locked():
        change = _Change(repo, datetime.now(UTC))
        repo._write_page(change, foreign)
        change.commit()
    root = tmp_path / "root.json"
    root.write_bytes(sample_repo.root_bytes)
    with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", str(root), "--profile", "warehouse") as p:
        status, headers, body = request(p, "/packages/base/base-2.0-py3-none-any.whl")
    assert status == 502 and headers["x-tufproxy-reason"] == "foreign-link" and b"--files-url" in body
