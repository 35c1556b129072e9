"""Hostile clients and hostile upstream pages: 4xx, nothing read outside the store, nothing unescaped.

Extends tests/test_proxy_http.py (a few traversal paths) with raw-socket
requests http.client would refuse to send, SSRF attempts, header and
Range abuse, all while ``strace`` watches every file the proxy opens; and
property-based fuzzing of the request router and of the page pipeline
(upstream HTML/JSON → parse → relink → render) the proxy runs on every
signed page.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import shutil
import signal
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Self

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.utils import canonicalize_name

from proxy.protocol import index
from proxy.protocol.layout import (
    BadRequestPath,
    PageFormat,
    TargetKind,
    parse_request_path,
)
from proxy.repository import Repository
from proxy.serving.resolver import _render
from tests.conftest import make_sample_dists
from tests.support.faults import FaultyUpstream, process_tree
from tests.support.proxyproc import ProxyProcess

HOT = "/packages/base/base-2.0-py3-none-any.whl"

TRAVERSAL = [
    "/files/../etc/passwd", "/files/%2e%2e/%2e%2e/etc/passwd", "/packages/base/..%2f..%2f..%2fetc%2fpasswd",
    "/packages/base/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd", "/packages/base/%252e%252e%252fetc%252fpasswd",
    "/packages/base/..%5c..%5cetc%5cpasswd", "/packages/base/%c0%ae%c0%ae%c0%afetc%c0%afpasswd",
    "/packages/..;/..;/etc/passwd", "/packages/base/..", "/simple/../../metadata/root.json",
    "/packages/../metadata/root.json", "/packages/base/.lock",
    # absolute paths, and the proxy's own files by name
    "//etc/passwd", "/packages//etc/passwd", "/packages/base//etc/passwd", "/%2Fetc%2Fpasswd",
    "/packages/%2Fetc/passwd", "/metadata/root.json", "/metadata/timestamp.json", "/blobs/", "/tmp/",
    "/index/cache.db",
    # NUL bytes
    "/packages/base/base-2.0-py3-none-any.whl%00.txt", "/simple/base%00/", "/packages/base/%00",
]
# SSRF: absolute-form targets name another host; the proxy only ever fetches from its upstreams.
SSRF = ["http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:22/", "https://evil.example/simple/base/",
        "http://[::1]:8080/packages/base/base-2.0-py3-none-any.whl"]
ODD_NAMES = [
    "/simple/ünïcödé/", "/simple/%C3%BCn%C3%AFc%C3%B6d%C3%A9/", "/simple/%F0%9F%90%8D/", "/simple/-base-/",
    "/simple/.base/", "/simple/base%2Fx/", "/simple/ba se/", "/simple/%20base/", "/simple/a\x01b/",
    "/simple/" + "a" * 10_000 + "/", "/simple/" + "b" * 201 + "/", "/packages/Base/base-2.0-py3-none-any.whl",
    "/packages/ba_se/base-2.0-py3-none-any.whl",
]
# Valid names in another spelling: redirected to the normalised page, on this host, never elsewhere.
SPELLINGS = {"/simple/BASE/": "../base/", "/simple/Future_Only/": "../future-only/", "/simple/future..only/": "../future-only/",
             "/simple/base": "base/"}
RANGES = ["bytes=" + ",".join(f"{i}-{i}" for i in range(1000)), "bytes=0-1,5-6", "bytes=10-5", "bytes=999999999-",
          "bytes=-0", "bytes=abc", "items=0-1", "bytes=0-99999999999999999999999999", "bytes=--1", "bytes=1-2-3",
          "bytes=" + "9" * 5000 + "-"]
ACCEPTS = ["", "garbage", "*/*;q=bogus", ";;;", "application/vnd.pypi.simple.v1+json;q=2", "text/html;q=-1",
           "application/vnd.pypi.simple.v2+json", ", ".join(["image/png"] * 400), "\x01\x02", "a" * 10_000]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("hostile")
    repo = Repository.init(tmp / "repo", bins=16)
    repo.add(make_sample_dists(tmp / "dists"))
    root = tmp / "root.json"
    root.write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
    with FaultyUpstream(repo.public_dir) as upstream, \
            ProxyProcess(tmp / "cache", "--upstream", upstream.url, "--root", str(root)) as proxy:
        yield repo, upstream, proxy


async def raw(port: int, target: str, headers: list[str] = (), method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """One request with exactly these bytes on the wire (http.client would refuse most of them)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + "".join(f"{h}\r\n" for h in headers)
    writer.write(head.encode("utf-8") + b"\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    status_line, _, rest = data.partition(b"\r\n")
    header_block, _, body = rest.partition(b"\r\n\r\n")
    fields = dict(line.decode("latin-1").split(": ", 1) for line in header_block.split(b"\r\n") if b": " in line)
    return int(status_line.split()[1]), {k.lower(): v for k, v in fields.items()}, body


class Strace:
    """Every path the process opens while the ``with`` block runs."""

    def __init__(self, pid: int, log: Path) -> None:
        self.pid, self.log = pid, log

    def __enter__(self) -> Self:
        pids = process_tree(self.pid)  # the supervisor and its workers
        self.proc = subprocess.Popen(["strace", "-f", "-e", "trace=open,openat,openat2,connect", "-o", str(self.log),
                                      *(a for p in pids for a in ("-p", str(p)))], stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        for _ in pids:  # "strace: Process N attached" for each: tracing from here on
            line = self.proc.stderr.readline()
            if "attached" not in line:
                self.proc.kill()
                pytest.skip(f"strace cannot attach here: {line.strip()}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=30)

    def opened(self) -> set[str]:
        return set(re.findall(r'open(?:at2?)?\((?:[^,]+, )?"([^"]*)"', self.log.read_text()))

    def connected(self) -> set[str]:
        """``host:port`` of every TCP connect."""
        return {f"{host}:{port}" for port, host in
                re.findall(r'connect\(\d+, \{sa_family=AF_INET6?, sin6?_port=htons\((\d+)\).*?inet_(?:addr|pton)\([^"]*"([^"]+)"',
                           self.log.read_text())}


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
async def test_hostile_requests_are_4xx_and_open_nothing_outside_the_store(served, tmp_path: Path) -> None:
    repo, upstream, proxy = served
    data = (repo.public_dir / HOT.lstrip("/")).read_bytes()
    assert (await raw(proxy.port, HOT))[2] == data  # cached: from here on it is served from the store
    before = len(upstream.requests)
    outcomes: list[tuple[str, int]] = []
    assert proxy.proc is not None
    with Strace(proxy.proc.pid, tmp_path / "strace.log") as trace:
        for path in TRAVERSAL + ODD_NAMES:
            status, _, body = await raw(proxy.port, path)
            outcomes.append((path, status))
            assert 400 <= status < 500 and b"root:" not in body and b'"signed"' not in body, (path, status)
        for target in SSRF:  # answered as if the path alone were asked for: at most a redirect to /simple/ here
            status, headers, body = await raw(proxy.port, target)
            assert 400 <= status < 500 or (status, headers.get("location")) in ((302, "simple/"), (200, None)), target
        for path, location in SPELLINGS.items():
            status, headers, _ = await raw(proxy.port, path)
            assert status == 301 and headers["location"] == location, path
        for method, target in [("CONNECT", "169.254.169.254:80"), ("POST", "/simple/"), ("TRACE", "/simple/"),
                               ("PUT", HOT), ("DELETE", HOT)]:
            status, _, _ = await raw(proxy.port, target, method=method)
            assert 400 <= status < 500, (method, status)
        for headers in (["X-Long: " + "a" * 100_000], [f"X-{i}: y" for i in range(5000)]):
            assert 400 <= (await raw(proxy.port, "/simple/", headers))[0] < 500
        assert 400 <= (await raw(proxy.port, "/simple/" + "a" * 100_000 + "/"))[0] < 500
        for accept in ACCEPTS:
            status, headers, body = await raw(proxy.port, "/simple/base/", [f"Accept: {accept}"])
            assert status in (200, 400, 406), (accept, status)
            if status == 200:
                assert headers["content-type"].split(";")[0] in ("text/html", "application/vnd.pypi.simple.v1+json",
                                                                  "application/vnd.pypi.simple.v1+html")
        for value in RANGES:
            status, headers, body = await raw(proxy.port, HOT, [f"Range: {value}"])
            if status == 206:  # only a satisfiable single range, and then the exact verified slice
                first, last = map(int, re.fullmatch(r"bytes (\d+)-(\d+)/\d+", headers["content-range"]).groups())
                assert body == data[first:last + 1], value
            else:
                assert status in (200, 416) and (status != 200 or body == data), (value, status)
    opened = trace.opened()
    python = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, *sys.path) if p}
    outside = {p for p in opened
               if not Path(p).resolve().is_relative_to(proxy.cache_dir.resolve())
               and not any(Path(p).resolve().is_relative_to(d) for d in python)
               and not p.startswith(("/dev/urandom", "/proc/self/", "/sys/devices/system/cpu/"))}
    print(f"\n[hostile] {len(outcomes) + len(SSRF) + len(SPELLINGS) + 8 + len(ACCEPTS) + len(RANGES)} hostile requests, "
          f"{len(opened)} distinct paths opened, all in the cache or the Python install, "
          f"connections only to the upstream {sorted(trace.connected())}: "
          f"{sorted({s for _, s in outcomes})} statuses for bad paths")
    assert any(p.startswith(str(proxy.cache_dir / "blobs")) for p in opened), "strace saw nothing"
    assert outside == set(), outside
    assert trace.connected() <= {f"127.0.0.1:{upstream.port}"}, trace.connected()
    assert not any("passwd" in p or (p.endswith("root.json") and "metadata" not in p) for p in opened)
    # Nothing about a hostile request reached the upstream: metadata, and the one page validly asked for.
    assert all(re.fullmatch(r"/metadata/[\w.-]+|/simple/base/[0-9a-f]{64}\.index\.(html|json)", p)
               for p in upstream.requests[before:]), upstream.requests[before:]


# ---------------------------------------------------------------- router fuzzing

segments = st.one_of(
    st.sampled_from(["", ".", "..", "%2e", "%2e%2e", "%2E%2e", "%2f", "%2F", "%5c", "%00", "%252e", "simple", "packages",
                     "index.html", "base", "Base", "a..b", "a-_.b", "x.whl", "x.whl.metadata", "%e2%98%83", "~", "a b"]),
    st.text(max_size=12),
    st.text(alphabet="%2eE/.\\\x00abc-_", max_size=12),
)
request_paths = st.lists(segments, max_size=6).map(lambda parts: "/" + "/".join(parts)) | st.text(max_size=60)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None)
@given(request_paths)
def test_router_accepts_only_safe_targets(path: str) -> None:
    try:
        req = parse_request_path(path)
    except BadRequestPath:
        return
    for fmt in PageFormat:
        target = req.target_path(fmt)
        parts = target.split("/")
        assert parts[0] in ("simple", "packages") and target.isascii(), target
        assert not any(p in ("", ".", "..") for p in parts[:-1]) and "\\" not in target and "\x00" not in target
        assert "%" not in target
        if req.project is not None:
            assert req.project == canonicalize_name(req.project) and parts[1] == req.project
    if req.redirect_to is not None:
        # Relative, to a normalised name on this host: never an open redirect.
        assert re.fullmatch(r"(\.\./)?[a-z0-9.-]+/", req.redirect_to), req.redirect_to
        assert "//" not in req.redirect_to and ":" not in req.redirect_to
    if req.kind in (TargetKind.FILE, TargetKind.CORE_METADATA):
        assert req.filename and ".." not in req.filename


# ---------------------------------------------------------------- upstream page fuzzing

HOSTILE = ['"><script>alert(1)</script>', "' onmouseover='x", "</a><a href=javascript:x>", "<!--", "<![CDATA[",
           "&amp;", "&#x3c;script&#x3e;", "\u2028", "a#b.whl", "a?b=c.whl", "%2e%2e", "..", "x\x00y"]
ours_tags = {"html", "head", "meta", "title", "body", "h1", "a", "br"}
ours_attrs = {"name", "content", "href", "data-requires-python", "data-yanked", "data-core-metadata",
              "data-dist-info-metadata"}
text = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=20))


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs.extend(attrs)


@st.composite
def upstream_html(draw: st.DrawFn) -> bytes:
    links = []
    for _ in range(draw(st.integers(0, 4))):
        attrs = "".join(f' {name}="{html.escape(draw(text))}"'
                        for name in draw(st.sets(st.sampled_from(["data-yanked", "data-requires-python",
                                                                  "data-core-metadata", "onclick", "style"]))))
        href = html.escape(draw(text)) + draw(st.sampled_from(["", "#sha256=" + "a" * 64, "#md5=00"]))
        links.append(f'<a href="{href}"{attrs}>{draw(text)}</a>')
    raw = draw(st.sampled_from(["", "<script>x</script>", "<base href='http://evil/'>", "<meta http-equiv=refresh>"]))
    return f"<html><body>{raw}{''.join(links)}</body></html>".encode("utf-8", "surrogatepass")


@st.composite
def upstream_json(draw: st.DrawFn) -> bytes:
    files = [{"filename": draw(text), "url": draw(text), "hashes": draw(st.sampled_from([{}, {"sha256": "ab" * 32}])),
              "requires-python": draw(st.none() | text), "yanked": draw(st.booleans() | text),
              "core-metadata": draw(st.booleans())} for _ in range(draw(st.integers(0, 4)))]
    page = {"meta": {"api-version": "1.1"}, "name": draw(text), "files": files, "versions": draw(st.lists(text, max_size=3))}
    return json.dumps(page).encode()


def check_rendered_html(body: bytes) -> None:
    collector = _Collector()
    collector.feed(body.decode())
    assert set(collector.tags) <= ours_tags
    assert collector.tags.count("a") == len(index.parse_project_html(body, "demo").files)
    assert {name for name, _ in collector.attrs} <= ours_attrs
    for name, value in collector.attrs:
        if name == "href":  # every link points into this proxy's /packages/ tree
            assert value is not None and value.startswith("../../packages/demo/"), value
    assert "<script" not in body.decode().lower()


@settings(max_examples=400, deadline=None)
@given(st.one_of(upstream_html(), upstream_json()), st.sampled_from(list(PageFormat)))
def test_signed_upstream_pages_render_safely(raw_page: bytes, fmt: PageFormat) -> None:
    """What the server does with a verified page: parse, point links at itself, render (in either format).
    Never a crash, never upstream markup, never a link off this proxy."""
    source = PageFormat.JSON if raw_page.startswith(b"{") else PageFormat.HTML
    try:
        body = _render(parse_request_path("/simple/demo/"), raw_page, source, fmt)
    except index.IndexParseError:
        return  # the server refuses it as a malformed page (502)
    if fmt is PageFormat.HTML:
        check_rendered_html(body)
    else:
        assert all(f.url.startswith("../../packages/demo/") for f in index.parse_project_json(body, "demo").files)
