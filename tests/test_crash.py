"""Process death and disk faults: kill -9 mid-work, full disks, read-only and rotten caches.

The crash loop kills ``tufproxy serve`` with SIGKILL at random points, while
cold downloads stream in (a throttled upstream, a cache small enough to
keep evicting) and while metadata is being updated (the repository
re-signs its online roles without pause and the proxy refreshes every
0.2 s, at start-up and in the background).  After every kill the disk is
audited: every blob is a signed target's exact bytes, every trusted
metadata file is whole and signed by the trusted root, no role's version
ever goes back, and the next start needs no repair.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from tuf.api.metadata import Metadata

from proxy.repository import Repository
from tests.conftest import make_sample_dists
from tests.support.faults import FaultyUpstream, get, process_tree, sized_wheel
from tests.support.net import free_port
from tests.support.proxyproc import ProxyProcess
from tests.support.tree import all_targets, assert_cache_clean

KILLS = 24
WHEELS = 12
WHEEL_SIZE = 2**20
TOP_LEVEL = ("root", "timestamp", "snapshot", "targets")
# Deadline for anything that is quick on an idle machine (a start, a first answer): load only delays it.
LOADED = 120.0


@dataclass
class World:
    repo: Repository
    root: Path
    upstream: FaultyUpstream
    wheels: list[Path]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("crash")
    repo = Repository.init(tmp / "repo", bins=16)
    wheels = [sized_wheel(tmp / "dists", f"heavy{i}", "1.0", WHEEL_SIZE) for i in range(WHEELS)]
    repo.add([*make_sample_dists(tmp / "dists"), *wheels])
    root = tmp / "root.json"
    root.write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
    # 4 MiB/s per response: a cold 1 MiB download is in flight for a quarter of a second.
    with FaultyUpstream(repo.public_dir, rate=4 * 2**20) as upstream:
        yield World(repo, root, upstream, wheels)


def file_path(wheel: Path) -> str:
    return f"/packages/{wheel.name.split('-')[0]}/{wheel.name}"


def metadata_slots(cache_dir: Path) -> list[Path]:
    """Every trusted-metadata directory: one per process that shared the cache (serve.py's slots)."""
    base = cache_dir / "metadata"
    return [base, *sorted(base.glob("worker-*"))] if base.exists() else []


def audit_disk(cache_dir: Path, repo: Repository, last: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """What a kill may leave: temp files.  What it must not: anything unverified, half-written or older.

    Returns the trusted version of each role in each metadata slot.
    """
    signed = {info["hashes"]["sha256"] for info in all_targets(repo).values()}
    for blob in (cache_dir / "blobs").rglob("*"):
        if blob.is_file():
            assert blob.name in signed and hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name, blob
    seen = {}
    for slot in metadata_slots(cache_dir):
        roles = {r: Metadata.from_bytes((slot / f"{r}.json").read_bytes()) for r in TOP_LEVEL if (slot / f"{r}.json").exists()}
        versions = {r: md.signed.version for r, md in roles.items()}
        for role, md in roles.items():
            if role != "root":
                roles["root"].verify_delegate(role, md)
            before = last.get(slot.name, {}).get(role, 0)
            assert versions[role] >= before, f"{slot.name}/{role} went back from {before} to {versions[role]}"
        if "snapshot" in roles:
            # Written after the timestamp: never newer than it, at most one update behind.
            assert versions["snapshot"] <= roles["timestamp"].signed.snapshot_meta.version
        seen[slot.name] = versions
    return seen


def kill_9(proxy: ProxyProcess) -> None:
    """SIGKILL the supervisor, then each worker: the whole proxy dies at once, as in an OOM kill."""
    assert proxy.proc is not None
    for pid in process_tree(proxy.proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def republish_until(repo: Repository, stop: threading.Event) -> None:
    """Re-sign timestamp, snapshot and bins without pause: the proxy always has an update to fetch."""
    while not stop.is_set():
        repo.refresh(force=True)


async def chaos(proxy: ProxyProcess, world: World, rng: random.Random) -> tuple[int, int]:
    """Cold downloads and page reads until SIGKILL at a random moment; every 200 must carry the right bytes."""
    base = f"http://127.0.0.1:{proxy.port}"
    picks = rng.sample(world.wheels, 4)
    expected = {file_path(w): w.read_bytes() for w in picks}
    served = cut = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=LOADED)) as s:
        tasks = [asyncio.create_task(get(s, base + p)) for p in [*expected, "/simple/heavy0/", "/simple/"]]
        await asyncio.sleep(rng.uniform(0.0, 0.6))  # the random kill point, not a synchronisation
        # On a loaded machine nothing may have come back yet: the kill waits for a first answer
        # (bounded), so every round still checks served bytes, with the wheels still in flight.
        await asyncio.wait(tasks, timeout=LOADED, return_when=asyncio.FIRST_COMPLETED)
        kill_9(proxy)
        for path, task in zip([*expected, "/simple/heavy0/", "/simple/"], tasks, strict=True):
            try:
                got = await task
            except aiohttp.ClientError:
                cut += 1
                continue
            if got.status == 200:
                served += 1
                assert path not in expected or got.body == expected[path], f"wrong bytes for {path}"
    return served, cut


def start_or_kill(proxy: ProxyProcess, rng: random.Random) -> bool:
    """Start the proxy; on odd luck kill it during start-up (its first metadata update). True if it is up."""
    if rng.random() < 0.5:
        proxy.start(timeout=LOADED)
        return True
    starter = threading.Thread(target=lambda: _start_quietly(proxy))
    starter.start()
    time.sleep(rng.uniform(0.3, 1.2))  # the random kill point: imports, refresh, persisting
    if proxy.proc is not None:
        kill_9(proxy)
    starter.join()
    return False


def _start_quietly(proxy: ProxyProcess) -> None:
    try:
        proxy.start(timeout=LOADED)
    except RuntimeError:
        pass  # killed before it listened: that is the point


@pytest.mark.slow
async def test_kill_9_loop_leaves_a_verified_reusable_cache(world: World, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # The upstream never stalls here, so its timeouts only have to outlast a loaded machine
    # (a 2 s read timeout once turned a busy CPU into a 502 in the final check).
    args = ("--upstream", world.upstream.url, "--root", str(world.root), "--refresh-interval", "0.2",
            "--cache-size", f"{4 * WHEEL_SIZE}", "--connect-timeout", "30", "--read-timeout", "60")
    rng = random.Random(458)
    versions: dict[str, dict[str, int]] = {}
    stop = threading.Event()
    publisher = threading.Thread(target=republish_until, args=(world.repo, stop))
    publisher.start()
    served = cut = startup_kills = leftovers = 0
    start = time.monotonic()
    try:
        for _ in range(KILLS):
            proxy = ProxyProcess(cache, *args)
            if await asyncio.to_thread(start_or_kill, proxy, rng):
                ok, lost = await chaos(proxy, world, rng)
                served, cut = served + ok, cut + lost
            else:
                startup_kills += 1
            proxy.stop()
            leftovers += sum(1 for _ in (cache / "tmp").iterdir()) if (cache / "tmp").exists() else 0
            versions = audit_disk(cache, world.repo, versions)
    finally:
        stop.set()
        publisher.join()
    loop_seconds = time.monotonic() - start
    with ProxyProcess(cache, *args).start(timeout=LOADED) as proxy:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=LOADED)) as s:
            for wheel in world.wheels:
                got = await get(s, f"http://127.0.0.1:{proxy.port}{file_path(wheel)}")
                assert got.status == 200 and got.body == wheel.read_bytes()
    assert_cache_clean(cache, world.repo)
    half_written = sum(len(list(slot.glob(".*.tmp"))) for slot in metadata_slots(cache))
    print(f"\n[crash] {KILLS} kill -9 in {loop_seconds:.0f}s ({startup_kills} during start-up and its metadata "
          f"update, {KILLS - startup_kills} during downloads): {served} responses served whole and verified, "
          f"{cut} cut off, {leftovers} partial blobs left by kills and removed at the next start, "
          f"{half_written} metadata writes cut mid-way (temp files, never read); "
          f"trusted timestamp versions reached {({k: v.get('timestamp') for k, v in versions.items()})} "
          f"in {len(versions)} metadata slots; 0 unverified blobs, 0 rollbacks")
    assert startup_kills and KILLS - startup_kills and served


# ---------------------------------------------------------------- disk faults


@pytest.fixture
def small_repo(tmp_path: Path):
    repo = Repository.init(tmp_path / "repo", bins=16)
    big = sized_wheel(tmp_path / "dists", "huge", "1.0", 6 * 2**20)
    repo.add([*make_sample_dists(tmp_path / "dists"), big])
    root = tmp_path / "root.json"
    root.write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
    with FaultyUpstream(repo.public_dir) as upstream:
        yield repo, root, upstream, big


HOT = "/packages/base/base-2.0-py3-none-any.whl"
COLD = "/packages/lib/lib-1.1-py3-none-any.whl"


async def full_cache_behaviour(port: int, repo: Repository, big: Path) -> None:
    """Cached file served; a cold file that does not fit refused 503 with a reason; a small cold one still fits."""
    base = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as s:
        assert (await get(s, base + HOT)).status == 200
        refused = await get(s, f"{base}/packages/huge/{big.name}")
        hot = await get(s, base + HOT)
        small = await get(s, base + COLD)
    print(f"\n[cache full] cold {big.stat().st_size >> 20} MiB file: {refused.status} {refused.body.decode().strip()!r}")
    assert refused.status == 503 and refused.headers["x-tufproxy-reason"] == "cache-full"
    assert b"cache full" in refused.body
    assert hot.status == 200 and hot.body == (repo.public_dir / HOT.lstrip("/")).read_bytes()
    assert small.status == 200 and small.body == (repo.public_dir / COLD.lstrip("/")).read_bytes()


async def test_cache_size_limit_refuses_new_cold_files_with_503(small_repo, tmp_path: Path) -> None:
    repo, root, upstream, big = small_repo
    with ProxyProcess(tmp_path / "cache", "--upstream", upstream.url, "--root", str(root), "--cache-size", "2M") as p:
        await full_cache_behaviour(p.port, repo, big)
    assert_cache_clean(tmp_path / "cache", repo)


def unshare_or_skip() -> None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare for a private mount")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace: {probe.stderr!r}")


def in_namespace(mount: str, mnt: Path) -> list[str]:
    """A command prefix: what follows runs in a private mount namespace where ``mount`` (a shell command on $1) ran."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", f'{mount} && shift && exec "$@"', "sh", str(mnt)]


def serve_in_namespace(mount: str, mnt: Path, *serve_args: str, **popen) -> subprocess.Popen:
    """``tufproxy serve`` in a private mount namespace, for a server that must fail to start."""
    return subprocess.Popen([*in_namespace(mount, mnt), sys.executable, "-m", "proxy", "serve", *serve_args], **popen)


async def test_disk_full_refuses_new_cold_files_with_503(small_repo, tmp_path: Path) -> None:
    unshare_or_skip()
    repo, root, upstream, big = small_repo
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with ProxyProcess(mnt / "cache", "--upstream", upstream.url, "--root", str(root),
                      prefix=in_namespace('mount -t tmpfs -o size=4m tmpfs "$1"', mnt)) as p:
        await full_cache_behaviour(p.port, repo, big)
    assert "Traceback" not in p.log(), p.log()[-2000:]


@pytest.mark.parametrize("mount", [
    pytest.param('mount -t tmpfs -o ro,size=1m tmpfs "$1"', id="read-only-empty"),
    pytest.param('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"', id="read-only-populated"),
])
def test_read_only_cache_dir_is_a_clear_error_at_startup(small_repo, tmp_path: Path, mount: str) -> None:
    unshare_or_skip()
    _, root, upstream, _ = small_repo
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with ProxyProcess(mnt / "cache", "--upstream", upstream.url, "--root", str(root)):
        pass  # a cache that worked yesterday, for the populated case
    proc = serve_in_namespace(mount, mnt, "--cache-dir", str(mnt / "cache"), "--upstream", upstream.url,
                              "--root", str(root), "--listen", f"127.0.0.1:{free_port()}",
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=60)
    print(f"\n[read-only cache] exit {proc.returncode}: {err.strip().splitlines()[-1]}")
    assert proc.returncode != 0
    assert "cache dir" in err and "Read-only" in err and "Traceback" not in err


@pytest.mark.slow
async def test_corrupted_blobs_are_evicted_and_refetched_never_served(small_repo, tmp_path: Path) -> None:
    repo, root, upstream, _ = small_repo
    cache = tmp_path / "cache"
    args = ("--upstream", upstream.url, "--root", str(root))
    paths = {"flipped": HOT, "truncated": COLD}
    expected = {k: (repo.public_dir / p.lstrip("/")).read_bytes() for k, p in paths.items()}
    with ProxyProcess(cache, *args) as p:
        async with aiohttp.ClientSession() as s:
            for path in paths.values():
                assert (await get(s, f"http://127.0.0.1:{p.port}{path}")).status == 200
    blobs = {k: cache / "blobs" / sha[:2] / sha for k, sha in ((k, hashlib.sha256(v).hexdigest()) for k, v in expected.items())}
    rotten = bytearray(blobs["flipped"].read_bytes())
    rotten[len(rotten) // 2] ^= 0x01
    blobs["flipped"].write_bytes(bytes(rotten))
    os.truncate(blobs["truncated"], 100)
    fetched = {k: upstream.count(rf"/packages/[^/]+/[0-9a-f]+\.{Path(p).name}") for k, p in paths.items()}
    with ProxyProcess(cache, *args) as p:
        async with aiohttp.ClientSession() as s:
            got = {k: await get(s, f"http://127.0.0.1:{p.port}{path}") for k, path in paths.items()}
            again = {k: await get(s, f"http://127.0.0.1:{p.port}{path}") for k, path in paths.items()}
    for k, path in paths.items():
        assert got[k].status == 200 and got[k].body == expected[k], k
        assert again[k].body == expected[k]
        assert upstream.count(rf"/packages/[^/]+/[0-9a-f]+\.{Path(path).name}") == fetched[k] + 1, k
        assert blobs[k].read_bytes() == expected[k]
    assert "failed its re-check" in p.log()
    assert_cache_clean(cache, repo)
