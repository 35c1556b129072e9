"""``tufproxy serve --workers N`` and a cache directory shared by processes.

The proxy runs as users run it (a supervisor and its forked workers, real
pip); the shared-store rules are also checked directly with two
``BlobStore`` objects on one root, since ``flock`` locks of two open
files conflict just as two processes' do.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import aiohttp
import pytest

from proxy.storage.pagecache import IndexCache
from proxy.storage.store import BlobStore
from proxy.util.locks import FetchLocks
from tests.conftest import SampleRepo
from tests.support.clients import pip
from tests.support.faults import process_tree
from tests.support.poll import wait_for
from tests.support.proxyproc import ProxyProcess
from tests.support.tree import assert_cache_clean
from tests.support.upstream import Reply, Upstream

WAIT = 20.0


def children(pid: int) -> set[int]:
    """The supervisor's workers (they start no processes of their own)."""
    return set(process_tree(pid)) - {pid}


def ready_pids(proxy: ProxyProcess) -> set[int]:
    return {int(p) for p in re.findall(r"worker \d+ ready \(pid (\d+)\)", proxy.log())}


def serving(proxy: ProxyProcess, n: int) -> ProxyProcess:
    wait_for(lambda: f"({n} workers," in proxy.log(), f"{n} workers to be ready")
    return proxy


def proxy_args(sample_repo: SampleRepo, upstream: Upstream, workers: int, *more: str) -> tuple[str, ...]:
    return ("--upstream", upstream.url, "--root", str(sample_repo.repo.metadata_dir / "1.root.json"),
            "--workers", str(workers), *more)


def wheel(sample_repo: SampleRepo, name: str) -> Path:
    return next(d for d in sample_repo.dists if d.name.startswith(f"{name}-") and d.name.endswith(".whl"))


def file_url(proxy: ProxyProcess, dist: Path) -> str:
    return f"{proxy.base}packages/{dist.name.split('-')[0]}/{dist.name}"


def file_pattern(dist: Path) -> str:
    return rf"/packages/[^/]+/[0-9a-f]+\.{re.escape(dist.name)}"


class Gate:
    """Holds upstream answers for one path until opened; records that one arrived."""

    def __init__(self, upstream: Upstream, pattern: str) -> None:
        self.arrived = threading.Event()
        self.open = threading.Event()

        def held(original: bytes | None) -> Reply:
            self.arrived.set()
            self.open.wait(WAIT)
            return Reply(200, original or b"")

        upstream.override(pattern, held)


async def fetch(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as r:
        return r.status, hashlib.sha256(await r.read()).hexdigest()


def raw_get(port: int, path: str) -> bytes:
    """Every byte a plain HTTP/1.1 GET gets back before the connection ends (no client retries)."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as conn:
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        try:
            while chunk := conn.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    return received


def verify_cache_command(cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", "cache", "verify", str(cache)],
                          check=False, capture_output=True, text=True, timeout=WAIT)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def part_holder(cache_dir: Path, pids: set[int]) -> int:
    """The worker with a temp file of the store open: the one downloading."""
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with_path = os.readlink(f"/proc/{pid}/fd/{fd}") if os.path.islink(f"/proc/{pid}/fd/{fd}") else ""
            if with_path.startswith(str(cache_dir / "tmp")) and with_path.endswith(".part"):
                return pid
    return 0


# -- many workers, one port ------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 4])
def test_pip_installs_a_dependency_chain_through_n_workers(
        workers: int, sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    with ProxyProcess(tmp_path / "cache", *proxy_args(sample_repo, upstream, workers)) as proxy:
        serving(proxy, workers)
        assert proxy.proc is not None and len(children(proxy.proc.pid)) == workers
        done = pip("install", "--index-url", proxy.url, "--target", str(tmp_path / "site"), "app")
        assert done.returncode == 0, done.stderr
        # each worker holds trusted metadata of its own
        assert sum(1 for p in (tmp_path / "cache/metadata").glob("worker-*/root.json")) == workers - 1
    installed = {p.name.split("-")[0] for p in (tmp_path / "site").glob("*.dist-info")}
    assert installed == {"app", "lib", "base"}
    assert_cache_clean(tmp_path / "cache", sample_repo.repo)


@pytest.mark.slow
async def test_a_herd_on_one_cold_file_across_4_workers_is_one_upstream_fetch(
        sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    dist = wheel(sample_repo, "base")
    gate = Gate(upstream, file_pattern(dist))
    with ProxyProcess(tmp_path / "cache", *proxy_args(sample_repo, upstream, 4)) as proxy:
        serving(proxy, 4)
        # A connection each: the kernel spreads them over the four workers.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                         timeout=aiohttp.ClientTimeout(total=WAIT)) as s:
            herd = asyncio.gather(*(fetch(s, file_url(proxy, dist)) for _ in range(100)))
            await asyncio.to_thread(gate.arrived.wait, WAIT)
            gate.open.set()
            results = await herd
    assert results == [(200, sha256(dist))] * 100
    assert upstream.count(file_pattern(dist)) == 1


@pytest.mark.slow
async def test_a_killed_worker_is_restarted_and_the_retry_succeeds(
        sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    dist = wheel(sample_repo, "lib")
    gate = Gate(upstream, file_pattern(dist))
    cache = tmp_path / "cache"
    with ProxyProcess(cache, *proxy_args(sample_repo, upstream, 2)) as proxy:
        serving(proxy, 2)
        assert proxy.proc is not None
        before = children(proxy.proc.pid)
        path = file_url(proxy, dist).removeprefix(proxy.base[:-1])
        first = asyncio.ensure_future(asyncio.to_thread(raw_get, proxy.port, path))
        await asyncio.to_thread(gate.arrived.wait, WAIT)
        victim = wait_for(lambda: part_holder(cache, before), "the downloading worker")
        os.kill(victim, signal.SIGKILL)
        assert await first == b""  # cut off before a status line: nothing partial to take for the file
        gate.open.set()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as s:
            wait_for(lambda: len(ready_pids(proxy) - before) == 1, "a restarted worker")
            after = children(proxy.proc.pid)
            assert victim not in after and len(after) == 2
            assert await fetch(s, file_url(proxy, dist)) == (200, sha256(dist))
        assert "exited with signal SIGKILL: restarting it" in proxy.log()
    assert_cache_clean(cache, sample_repo.repo)  # the dead worker's temp file was swept


@pytest.mark.slow
def test_workers_still_starting_die_with_a_killed_supervisor(
        sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    """kill -9 of the supervisor while its workers refresh their metadata at start-up (the upstream holds the
    timestamp): no orphan lives on to write a cache nobody supervises."""
    gate = Gate(upstream, r".*/timestamp\.json")
    proxy = ProxyProcess(tmp_path / "cache", *proxy_args(sample_repo, upstream, 2))
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen(proxy.argv(), stdout=log, stderr=subprocess.STDOUT)
        try:
            assert gate.arrived.wait(WAIT), "a worker asked for the timestamp"
            workers = wait_for(lambda: children(proc.pid) if len(children(proc.pid)) == 2 else None, "two workers")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(WAIT)
            wait_for(lambda: not any(os.path.exists(f"/proc/{w}") and _alive(w) for w in workers),
                     "the orphaned workers gone", timeout=10)
        finally:
            gate.open.set()
            for pid in (proc.pid, *children(proc.pid)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for init to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@pytest.mark.slow
async def test_sigterm_drains_in_flight_downloads_and_takes_no_new_ones(
        sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    dist = wheel(sample_repo, "app")
    gate = Gate(upstream, file_pattern(dist))
    proxy = serving(ProxyProcess(tmp_path / "cache", *proxy_args(sample_repo, upstream, 2)).start(), 2)
    assert proxy.proc is not None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as s:
            in_flight = asyncio.ensure_future(fetch(s, file_url(proxy, dist)))
            await asyncio.to_thread(gate.arrived.wait, WAIT)
            proxy.proc.send_signal(signal.SIGTERM)

            def refused() -> bool:
                try:
                    socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()
                except ConnectionRefusedError:
                    return True
                return False

            wait_for(refused, "the port to stop accepting")
            assert not in_flight.done()
            gate.open.set()
            assert await in_flight == (200, sha256(dist))
        assert proxy.proc.wait(WAIT) == 0
    finally:
        proxy.stop()


@pytest.mark.slow
def test_workers_that_keep_dying_stop_the_supervisor_with_status_1(
        sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    proxy = serving(ProxyProcess(tmp_path / "cache", *proxy_args(sample_repo, upstream, 2)).start(), 2)
    assert proxy.proc is not None
    try:
        def killed_until_exit() -> bool:
            assert proxy.proc is not None
            for pid in children(proxy.proc.pid):
                os.kill(pid, signal.SIGKILL)
            return proxy.proc.poll() is not None

        wait_for(killed_until_exit, "the supervisor to give up")
        assert proxy.proc.returncode == 1
        assert "workers keep dying" in proxy.log()
    finally:
        proxy.stop()


def test_a_worker_that_cannot_start_fails_the_command(sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    bad_root = tmp_path / "root.json"
    bad_root.write_text("{}")
    done = subprocess.run([sys.executable, "-m", "proxy", "serve", "--upstream", upstream.url, "--root", str(bad_root),
                           "--cache-dir", str(tmp_path / "cache"), "--listen", "127.0.0.1:0", "--workers", "2"],
                          check=False, capture_output=True, text=True, timeout=WAIT)
    # The reason, said once (not once per worker), as the command's one error line.
    assert done.returncode == 2
    assert done.stderr.count("is not a valid self-signed root") == 1
    assert done.stderr.splitlines()[-1].startswith("tufproxy serve: error: ")


@pytest.mark.slow
async def test_metrics_count_every_request_once_across_workers(
        sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    def page_requests(text: str) -> float:
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith('tufproxy_requests_total{route="project_index",status="200"}'))

    with ProxyProcess(tmp_path / "cache", *proxy_args(sample_repo, upstream, 2)) as proxy:
        serving(proxy, 2)
        assert proxy.proc is not None
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            statuses = await asyncio.gather(*(fetch(s, f"{proxy.url}base/") for _ in range(40)))
            assert {status for status, _ in statuses} == {200}
            async with s.get(f"{proxy.base}metrics") as r:
                assert page_requests(await r.text()) == 40
            before = children(proxy.proc.pid)
            os.kill(next(iter(before)), signal.SIGKILL)
            wait_for(lambda: len(ready_pids(proxy) - before) == 1, "a restarted worker")
            async with s.get(f"{proxy.base}metrics") as r:
                # the dead worker's counts are still there, and nothing counted twice
                assert page_requests(await r.text()) == 40


# -- one cache directory, many processes ---------------------------------------


@pytest.mark.slow
async def test_two_proxies_on_one_cache_dir_never_corrupt_it(
        sample_repo: SampleRepo, upstream: Upstream, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    sizes = sorted(d.stat().st_size for d in sample_repo.dists)
    # Room for three files at most: eviction runs all the time, beside the other proxy's sends.
    args = proxy_args(sample_repo, upstream, 2, "--cache-size", str(sum(sizes[-3:])))
    files = [d for d in sample_repo.dists if not d.name.startswith("future")]
    with ProxyProcess(cache, *args) as one, ProxyProcess(cache, *args) as two:
        serving(one, 2)
        serving(two, 2)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            plan = [(p, d) for _ in range(6) for p in (one, two) for d in files]
            got = await asyncio.gather(*(fetch(s, file_url(p, d)) for p, d in plan),
                                       *(fetch(s, f"{p.url}{n}/") for p in (one, two) for n in ("app", "lib", "base")))
        # Each file is its exact bytes, or refused as "cache full" while all room is in use: never wrong.
        for (_, d), (status, digest) in zip(plan, got[:len(plan)], strict=True):
            assert (status, digest) == (200, sha256(d)) or status == 503
        assert sum(status == 200 for status, _ in got[:len(plan)]) > len(plan) // 2
        assert {status for status, _ in got[len(plan):]} == {200}
        # four processes, four trusted-metadata directories
        assert len(list((cache / "metadata").glob("worker-*/root.json"))) == 3
    done = await asyncio.to_thread(verify_cache_command, cache)
    assert done.returncode == 0, done.stdout
    assert re.search(r"^[1-9]\d* blob\(s\) sound .* [1-9]\d* page\(s\) sound, 0 unsound, 0 index warning",
                     done.stdout, re.MULTILINE)
    assert_cache_clean(cache, sample_repo.repo)

    blob = next(p for p in (cache / "blobs").rglob("*") if p.is_file())
    blob.write_bytes(b"rot" + blob.read_bytes()[3:])
    done = await asyncio.to_thread(verify_cache_command, cache)
    assert done.returncode == 1 and f"UNSOUND blobs/{blob.parent.name}/{blob.name}" in done.stdout

    # A page someone rewrote in the shared cache volume is caught too.
    pages = IndexCache(cache)
    key = next(k for k in pages.keys() if k.startswith("simple/base/"))  # noqa: SIM118 - IndexCache has keys(), no __iter__
    pages.set(key, b"<html>no base here</html>")
    pages.close()
    done = await asyncio.to_thread(verify_cache_command, cache)
    assert done.returncode == 1 and "UNSOUND index/simple/base/" in done.stdout and "hash-mismatch" in done.stdout


# -- the shared-store rules, directly --------------------------------------------


async def put(store: BlobStore, data: bytes):
    async with store.writer(len(data)) as w:
        await w.write(data)
        return await w.publish(hashlib.sha256(data).hexdigest())


async def test_opening_a_shared_root_keeps_a_live_writers_temp_file(tmp_path: Path) -> None:
    writing = BlobStore(tmp_path)
    async with writing.writer(4) as w:
        await w.write(b"li")
        BlobStore(tmp_path)  # another process starting: its sweep must leave the live download alone
        await w.write(b"ve")
        blob = await w.publish(hashlib.sha256(b"live").hexdigest())
    assert blob.path.read_bytes() == b"live"


async def test_eviction_skips_a_blob_another_process_is_sending(tmp_path: Path) -> None:
    sender = BlobStore(tmp_path)
    sent = await put(sender, b"s" * 1000)
    evicting = BlobStore(tmp_path, max_bytes=1500)
    with sender.in_use(sent.sha256):
        with pytest.raises(Exception, match="do not fit"):
            await put(evicting, b"e" * 1000)
        assert sent.path.read_bytes() == b"s" * 1000
    await put(evicting, b"e" * 1000)  # released: now it may go
    assert not sent.path.exists()


async def test_a_blob_committed_by_another_process_is_found(tmp_path: Path) -> None:
    reader = BlobStore(tmp_path)
    blob = await put(BlobStore(tmp_path), b"theirs")
    assert reader.get(blob.sha256, 6) == blob
    assert reader.usage() == 6


@pytest.mark.slow
async def test_fetch_lock_is_one_holder_across_processes(tmp_path: Path) -> None:
    one, two = FetchLocks(tmp_path / "locks"), FetchLocks(tmp_path / "locks")
    async with one.hold("packages/x.whl@abc") as held:
        assert held is True
        async with two.hold("packages/x.whl@abc", wait=0.05) as waited:
            assert waited is False  # gave up waiting: the caller fetches too, harmlessly
        async with two.hold("packages/other.whl@abc", wait=0.05) as other:
            assert other is True
    async with two.hold("packages/x.whl@abc", wait=0.05) as after:
        assert after is True
    assert list((tmp_path / "locks").iterdir()) == []
