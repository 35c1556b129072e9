"""Cold files streamed with a held-back tail, through real pip and uv and a real proxy process.

The proxy sends a cold file's bytes as they arrive and keeps its final byte
until every signed hash matched.  These tests check what that promises:
a tampered file never installs and never enters the cache; a mirror dying
mid-file is continued by the next one, unseen; clients joining one fetch
get identical bytes, also when they reach different worker processes
(each hashes what it sends itself); pip with a short ``--timeout`` gets a file that takes
longer than the timeout to arrive (and with ``--verify-before-send`` does
not: that is the strict mode's cost).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from proxy.protocol import refusals
from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from proxy.serving.streaming import send_download
from proxy.storage.downloads import Download
from proxy.storage.store import Blob, BlobStore
from proxy.trust.fetch import Want
from tests.support.clients import install, pip, uv_path
from tests.support.faults import Fault, FaultyUpstream, get, process_tree, sized_wheel
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.tree import assert_cache_clean

CLIENTS = ["pip", "uv"] if uv_path() else ["pip"]


@dataclass
class Signed:
    repo: Repository
    root: Path  # the pinned root file
    wheel: Path  # the big wheel, as signed
    url_path: str  # its path on the proxy


def _signed(tmp_path: Path, size: int) -> Signed:
    repo = Repository.init(tmp_path / "repo", bins=16)
    wheel = sized_wheel(tmp_path / "dists", "big", "1.0", size)
    repo.add([wheel, build_wheel(tmp_path / "dists", "small", "1.0")])
    root = tmp_path / "root.json"
    root.write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
    return Signed(repo, root, wheel, f"/packages/big/{wheel.name}")


def _tampered_copy(signed: Signed, dest: Path) -> Path:
    """The public tree with every served copy of the big wheel changed in one byte (same length)."""
    shutil.copytree(signed.repo.public_dir, dest)
    for p in dest.rglob(f"*{signed.wheel.name}"):
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.unlink()
        p.write_bytes(bytes(data))
    return dest


def _proxy(tmp_path: Path, signed: Signed, *upstreams: FaultyUpstream, extra: tuple[str, ...] = (),
           workers: int = 1) -> ProxyProcess:
    args = [a for u in upstreams for a in ("--upstream", u.url)]
    return ProxyProcess(tmp_path / "cache", *args, "--root", str(signed.root), "--workers", str(workers),
                        "--audit-log", str(tmp_path / "audit.log"), *extra).start()


def _refusals(tmp_path: Path) -> list[dict]:
    path = tmp_path / "audit.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, lines) if r.get("event") == "refused"]


@pytest.fixture
def big(tmp_path: Path) -> Signed:
    return _signed(tmp_path, 50 * 2**20)


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_a_same_length_tampered_50mb_wheel_never_installs(tmp_path: Path, big: Signed, client: str) -> None:
    # Throttled, so the proxy is well into streaming when the hash fails.
    with FaultyUpstream(_tampered_copy(big, tmp_path / "tampered"), rate=40 * 2**20) as liar, \
            _proxy(tmp_path, big, liar) as p:
        # pip with one retry per 502 instead of five: the resumes still come (six), its backoff (40 s) is not the test.
        r = install(client, p.url, tmp_path / "t", "big", pip_args=("--retries", "1"))
        # Counted when the fetch reaches the mismatch, which may come after the client has exited.
        counted = 'tufproxy_verification_failures_total{reason="hash-mismatch"}'
        wait_for(lambda: counted in asyncio.run(_text(p.base + "metrics")), "the hash-mismatch metric", timeout=30)
        if client == "pip":  # uv retries with whole new requests, and those fetch again
            # pip resumes the cut download (Range) and retries each 502: those continue the lie, not fetched again.
            assert liar.count(r"/packages/big/.*\.whl") == 1
    assert r.returncode != 0, r.stdout
    assert not (tmp_path / "t").exists() or not list((tmp_path / "t").glob("big*"))
    assert_cache_clean(tmp_path / "cache", big.repo)
    assert not list((tmp_path / "cache" / "blobs").rglob(hashlib.sha256(big.wheel.read_bytes()).hexdigest()))
    assert any(r["reason"] == "hash-mismatch" and r["upstream_url"].endswith(big.wheel.name) for r in _refusals(tmp_path))


@pytest.mark.slow
def test_a_resume_of_a_file_that_lied_is_refused_from_memory_and_a_new_request_fetches_again(tmp_path: Path) -> None:
    """pip resumes a cut download with Range: that continues the lie, so it is not fetched whole again."""
    signed = _signed(tmp_path, 256 * 1024)
    wheel = r"/packages/big/.*\.whl"
    with FaultyUpstream(_tampered_copy(signed, tmp_path / "tampered")) as liar, _proxy(tmp_path, signed, liar) as p:
        url = p.base + signed.url_path.lstrip("/")
        # Every byte arrived before the verdict: a clear 502, not a connection cut after the headers.
        assert asyncio.run(_get(url))[0] == 502 and liar.count(wheel) == 1
        resumes = [asyncio.run(_get(url, {"Range": f"bytes={n}-"})) for n in (1000, 2000, 3000)]
        assert [status for status, _ in resumes] == [502] * 3 and liar.count(wheel) == 1
        # A new request is not a continuation: the upstream is asked again (it may serve the right bytes now).
        assert asyncio.run(_get(url))[0] == 502 and liar.count(wheel) == 2
    assert [r["reason"] for r in _refusals(tmp_path)] == ["hash-mismatch"] * 5  # each refused request is on record


@pytest.mark.slow
def test_a_mirror_killed_mid_file_is_continued_by_the_next(tmp_path: Path) -> None:
    signed = _signed(tmp_path, 6 * 2**20)
    with FaultyUpstream(signed.repo.public_dir) as dying, FaultyUpstream(signed.repo.public_dir) as good:
        dying.inject(r"/packages/big/.*\.whl", Fault.RESET)
        with _proxy(tmp_path, signed, dying, good) as p:
            r = install("pip", p.url, tmp_path / "t", "big")
    assert r.returncode == 0, r.stdout + r.stderr
    assert list((tmp_path / "t").glob("big-1.0.dist-info"))
    assert dying.count(r"/packages/big/.*\.whl") == 1 and good.count(r"/packages/big/.*\.whl") == 1
    assert_cache_clean(tmp_path / "cache", signed.repo)


def test_a_tampered_second_mirror_after_a_failover_is_refused(tmp_path: Path) -> None:
    signed = _signed(tmp_path, 6 * 2**20)
    with FaultyUpstream(signed.repo.public_dir) as dying, \
            FaultyUpstream(_tampered_copy(signed, tmp_path / "tampered")) as liar:
        dying.inject(r"/packages/big/.*\.whl", Fault.RESET)
        with _proxy(tmp_path, signed, dying, liar) as p:
            got = asyncio.run(_get(p.base + signed.url_path.lstrip("/")))
    status, body = got
    assert body != signed.wheel.read_bytes()
    assert status == 502 or len(body) < signed.wheel.stat().st_size  # refused, or cut before the end
    assert [r["reason"] for r in _refusals(tmp_path)][:1] == ["hash-mismatch"]
    assert_cache_clean(tmp_path / "cache", signed.repo)


@pytest.mark.slow
def test_clients_joining_one_cold_fetch_get_identical_verified_bytes(tmp_path: Path) -> None:
    signed = _signed(tmp_path, 8 * 2**20)
    with FaultyUpstream(signed.repo.public_dir, rate=8 * 2**20) as slow, _proxy(tmp_path, signed, slow) as p:
        bodies = asyncio.run(_many(p.base + signed.url_path.lstrip("/"), 6))
        fetched = slow.count(r"/packages/big/.*\.whl")
    expected = signed.wheel.read_bytes()
    assert [(s, b == expected) for s, b in bodies] == [(200, True)] * 6
    assert fetched == 1


WAIT = 60.0


@dataclass
class _RawClient:
    """A GET on a connection of its own, read in a thread; notes what the upstream had finished
    when the first body byte arrived."""

    sock: socket.socket
    upstream: FaultyUpstream
    head: bytes = b""
    body: bytearray = field(default_factory=bytearray)
    upstream_done_at_first_byte: int | None = None
    first_byte: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    reset: bool = False

    def get(self, path: str) -> None:
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        received = b""
        try:
            while chunk := self.sock.recv(2**20):
                if not self.head:
                    received += chunk
                    if b"\r\n\r\n" in received:
                        self.head, _, chunk = received.partition(b"\r\n\r\n")
                    else:
                        continue
                if chunk and not self.first_byte.is_set():
                    self.upstream_done_at_first_byte = self.upstream.done(r"/packages/.*")
                    self.first_byte.set()
                self.body += chunk
        except ConnectionResetError:
            self.reset = True
        finally:
            self.sock.close()
            self.ended.set()


def _worker_of(sock: socket.socket, proxy_port: int, workers: set[int]) -> int | None:
    """The worker process holding the server side of ``sock`` (Linux /proc), once it accepted it."""
    port = sock.getsockname()[1]
    inodes = {f[9] for f in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
              if int(f[1].split(":")[1], 16) == proxy_port and int(f[2].split(":")[1], 16) == port}
    for pid in workers:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in {f"socket:[{i}]" for i in inodes}:
                    return pid
            except FileNotFoundError:
                pass
    return None


def _one_client_per_worker(proxy: ProxyProcess, upstream: FaultyUpstream) -> list[_RawClient]:
    """Two connections the kernel gave to different workers (new connections until it did)."""
    assert proxy.proc is not None
    workers = set(wait_for(lambda: set(process_tree(proxy.proc.pid)) - {proxy.proc.pid} if "(2 workers," in proxy.log()
                           else None, "2 workers to be ready", timeout=WAIT))
    by_worker: dict[int, socket.socket] = {}
    for _ in range(64):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT)
        pid = wait_for(lambda sock=sock: _worker_of(sock, proxy.port, workers), "a worker to accept the connection",
                       timeout=WAIT)
        if pid in by_worker:
            sock.close()
        else:
            by_worker[pid] = sock
        if len(by_worker) == 2:
            return [_RawClient(s, upstream) for s in by_worker.values()]
    raise AssertionError("64 connections all went to one worker")


def _both_get(first: _RawClient, second: _RawClient, upstream: FaultyUpstream, path: str) -> int:
    """``first`` asks, ``second`` joins once the upstream was asked; both read to the end.
    How many times the upstream was asked for the file."""
    first.get(path)
    wait_for(lambda: upstream.count(r"/packages/big/.*\.whl"), "the upstream to be asked for the file", timeout=WAIT)
    second.get(path)
    for client in (first, second):
        assert client.first_byte.wait(WAIT) and client.ended.wait(WAIT)
    return upstream.count(r"/packages/big/.*\.whl")


@pytest.mark.slow
def test_clients_on_two_workers_both_stream_before_the_upstream_finished(tmp_path: Path) -> None:
    signed = _signed(tmp_path, 6 * 2**20)
    expected = signed.wheel.read_bytes()
    with FaultyUpstream(signed.repo.public_dir, rate=1 * 2**20) as slow, \
            _proxy(tmp_path, signed, slow, workers=2) as p:
        first, second = _one_client_per_worker(p, slow)
        fetched = _both_get(first, second, slow, signed.url_path)
    # Both had bytes while the upstream was still sending (6 s at 1 MiB/s), from one fetch.
    assert [c.upstream_done_at_first_byte for c in (first, second)] == [0, 0]
    assert [(c.head.split(b" ")[1], c.reset, bytes(c.body) == expected) for c in (first, second)] == \
        [(b"200", False, True)] * 2
    assert fetched == 1
    assert_cache_clean(tmp_path / "cache", signed.repo)


@pytest.mark.slow
def test_a_tampered_file_resets_clients_on_both_workers_and_is_never_published(tmp_path: Path) -> None:
    signed = _signed(tmp_path, 6 * 2**20)
    size = signed.wheel.stat().st_size
    public = _tampered_copy(signed, tmp_path / "tampered")
    with FaultyUpstream(public, rate=1 * 2**20) as liar, _proxy(tmp_path, signed, liar, workers=2) as p:
        first, second = _one_client_per_worker(p, liar)
        fetched = _both_get(first, second, liar, signed.url_path)
    # Each streamed, and each was cut before its last byte (the follower saw the lie itself).
    assert [(c.head.split(b" ")[1], c.reset, 0 < len(c.body) < size) for c in (first, second)] == \
        [(b"200", True, True)] * 2
    assert fetched == 1
    assert not [b for b in (tmp_path / "cache/blobs").rglob("*") if b.is_file() and b.stat().st_size == size]
    assert_cache_clean(tmp_path / "cache", signed.repo)
    assert {r["reason"] for r in _refusals(tmp_path)} == {"hash-mismatch"}


@pytest.mark.slow
@pytest.mark.parametrize("strict", [False, True], ids=["streaming", "verify-before-send"])
def test_pip_with_a_short_timeout_gets_a_file_slower_than_it(tmp_path: Path, strict: bool) -> None:
    # 6 MiB at 2 MiB/s: 3 s to arrive, pip allows 2 s of silence.
    signed = _signed(tmp_path, 6 * 2**20)
    extra = ("--verify-before-send", "yes") if strict else ()
    with FaultyUpstream(signed.repo.public_dir) as meta_fast, \
            FaultyUpstream(signed.repo.public_dir, rate=2 * 2**20) as slow:
        meta_fast.inject(r"/packages/.*", Fault.STATUS, status=503)  # files only from the slow one
        with _proxy(tmp_path, signed, meta_fast, slow, extra=extra) as p:
            r = pip("install", "--timeout", "2", "--retries", "0", "--index-url", p.url,
                    "--target", str(tmp_path / "t"), "big")
    if strict:
        # pip 23.2: "Read timed out"; 26.3: "error: connection-timeout".
        assert r.returncode != 0 and re.search(r"timed out|timeout", (r.stdout + r.stderr).lower())
    else:
        assert r.returncode == 0, r.stdout + r.stderr


async def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s:
        try:
            async with s.get(url, headers=headers) as r:
                return r.status, await r.read()
        except aiohttp.ClientPayloadError:
            return 200, b""


async def _many(url: str, n: int) -> list[tuple[int, bytes]]:
    async with aiohttp.ClientSession() as s:
        async def one() -> tuple[int, bytes]:
            async with s.get(url) as r:
                return r.status, await r.read()
        return await asyncio.gather(*(one() for _ in range(n)))


async def _text(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.text()


async def _send_one(download: Download) -> tuple[int, bytes]:
    """GET, from a real server on 127.0.0.1, of ``download`` through send_download (a refusal before any
    byte: the status the one error table gives it, and its text)."""
    async def handler(request: web.Request) -> web.StreamResponse:
        sent = await send_download(request, download, {}, download.want.length)
        if isinstance(sent, BaseException):
            return web.Response(status=refusals.row(sent).status, text=str(sent))
        return sent[0]

    app = web.Application()
    app.router.add_get("/f", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        return await _get(f"http://127.0.0.1:{runner.addresses[0][1]}/f")
    finally:
        await runner.cleanup()


async def _finished_download(store: BlobStore, data: bytes, source: bool = True) -> tuple[Download, Blob]:
    """A download of ``data`` fetched, verified and published into ``store`` as a fetch does it."""
    sha = hashlib.sha256(data).hexdigest()
    download = Download("files/x.whl", Want("files/x.whl", {"sha256": sha}, len(data)))

    async def fetch() -> Blob:
        async with store.writer(len(data)) as w:
            if source:
                assert w.path is not None
                download.writing(w.path)
            await w.write(data)
            download.available = len(data)
            return await w.publish(sha)

    task = asyncio.get_running_loop().create_task(fetch())
    await asyncio.wait([task])
    download.finish(task)
    return download, task.result()


async def test_a_blob_evicted_right_after_its_publish_is_still_sent_whole(tmp_path: Path) -> None:
    """Another process on the same cache may evict a blob the moment it is published, before a request that
    waited for the verdict opened it: the download's own file (the blob's inode) still has the verified bytes.
    Found by test_two_proxies_on_one_cache_dir_never_corrupt_it: 'received 0 of 886 bytes' after a 200."""
    data = os.urandom(886)
    download, blob = await _finished_download(BlobStore(tmp_path), data)
    blob.path.unlink()  # the other process's eviction
    assert await _send_one(download) == (200, data)


async def test_a_blob_gone_before_any_byte_went_out_is_a_503_not_a_reset(tmp_path: Path) -> None:
    download, blob = await _finished_download(BlobStore(tmp_path), b"x" * 100, source=False)
    blob.path.unlink()
    status, body = await _send_one(download)
    assert status == 503 and b"evicted before it could be sent" in body  # retryable, from the one table


async def test_a_download_cancelled_before_any_byte_went_out_is_a_503(tmp_path: Path) -> None:
    download = Download("files/x.whl", Want("files/x.whl", {"sha256": "0" * 64}, 10))
    task = asyncio.get_running_loop().create_task(asyncio.sleep(60))
    task.cancel()
    await asyncio.wait([task])
    download.finish(task)  # type: ignore[arg-type]
    status, body = await _send_one(download)
    assert status == 503 and b"cancelled before any byte went out" in body
