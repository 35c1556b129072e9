"""Tests for proxy.storage.store: the verified blob store and the index cache, on real files."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from proxy.protocol.errors import StoreError, StoreFull, StoreUnwritable
from proxy.protocol.hashing import UnsupportedHashes
from proxy.storage.pagecache import IndexCache
from proxy.storage.store import Blob, BlobStore


def hashes_of(data: bytes) -> dict[str, str]:
    return {
        "sha256": hashlib.sha256(data).hexdigest(),
        "sha512": hashlib.sha512(data).hexdigest(),
        "blake2b-256": hashlib.blake2b(data, digest_size=32).hexdigest(),
    }


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


async def put(store: BlobStore, data: bytes, chunk: int = 65536) -> Blob:
    async with store.writer(len(data)) as w:
        for i in range(0, len(data), chunk):
            await w.write(data[i : i + chunk])
        return await w.publish(hashlib.sha256(data).hexdigest())


async def test_commit_makes_blob_visible(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    data = os.urandom(300_000)
    blob = await put(store, data)
    sha = hashlib.sha256(data).hexdigest()
    assert blob == Blob(sha, tmp_path / "blobs" / sha[:2] / sha, len(data))
    assert blob.path.read_bytes() == data
    assert files_under(tmp_path / "tmp") == []
    assert store.usage() == len(data)
    assert store.get(sha, len(data)) == blob
    assert (store.hits, store.misses) == (1, 0)
    assert store.get("0" * 64) is None
    assert store.misses == 1


async def test_reopen_finds_committed_blobs(tmp_path: Path) -> None:
    data = b"kept across restarts"
    blob = await put(BlobStore(tmp_path), data)
    again = BlobStore(tmp_path)
    assert again.get(blob.sha256) == blob
    assert again.usage() == len(data)


async def test_too_many_bytes_fails_at_write(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    written = 0
    with pytest.raises(StoreError):
        async with store.writer(1000) as w:
            while written < 10_000:  # an endless upstream, bounded here
                await w.write(b"x" * 300)
                written += 300
    assert written == 900  # the fourth chunk was refused
    assert files_under(tmp_path) == []


async def test_unsigned_length_reserves_space_as_it_grows(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, max_bytes=20 * 2**20)
    chunk = b"j" * 2**20
    with pytest.raises(StoreFull):
        async with store.writer(2**40, exact=False) as w:
            for _ in range(100):  # junk without end from a host whose page gave no size
                await w.write(chunk)
                # tmp/ never holds more than the reservation, and the reservation fits the limit
                assert w.size <= store._reserved <= store.max_bytes
    assert files_under(tmp_path) == []
    assert store._reserved == 0


async def test_restart_drops_what_was_written(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    async with store.writer(10) as w:
        await w.write(b"wrongbytes")
        await w.restart()
        await w.write(b"rightbytes")
        blob = await w.publish(hashlib.sha256(b"rightbytes").hexdigest())
    assert blob.path.read_bytes() == b"rightbytes"


async def test_exception_in_body_removes_temp_file(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    data = b"z" * 100
    with pytest.raises(KeyError):
        async with store.writer(len(data)) as w:
            await w.write(data)
            assert len(files_under(tmp_path / "tmp")) == 1
            raise KeyError("upstream went away")
    assert files_under(tmp_path) == []


async def test_cancel_mid_write_leaves_no_file(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, max_bytes=50 * 2**20)
    data = os.urandom(2**20)
    started = asyncio.Event()

    async def download() -> None:
        async with store.writer(50 * len(data)) as w:
            for _ in range(50):
                await w.write(data)  # each write hops to a thread
                started.set()

    task = asyncio.create_task(download())
    await started.wait()
    assert len(files_under(tmp_path / "tmp")) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert files_under(tmp_path) == []
    # The reservation went with it: the whole limit can be reserved again.
    async with store.writer(50 * 2**20):
        pass


async def test_cancel_during_commit_still_records_the_blob(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    data = os.urandom(3 * 2**20)
    committing = asyncio.Event()

    async def download() -> None:
        async with store.writer(len(data)) as w:
            await w.write(data)
            committing.set()
            await w.publish(hashlib.sha256(data).hexdigest())  # suspended on the rename hop

    task = asyncio.create_task(download())
    await committing.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The rename had already been handed to a thread: it finished and was
    # recorded, so the file under blobs/ is never unaccounted for.
    sha = hashlib.sha256(data).hexdigest()
    assert files_under(tmp_path / "tmp") == []
    assert files_under(tmp_path / "blobs") == [tmp_path / "blobs" / sha[:2] / sha]
    assert store.get(sha) is not None
    assert store.usage() == len(data)


def test_crash_leftovers_removed_at_open(tmp_path: Path) -> None:
    (tmp_path / "tmp" / "half").mkdir(parents=True)
    (tmp_path / "tmp" / "abc.part").write_bytes(b"partial download")
    (tmp_path / "tmp" / "half" / "x").write_bytes(b"")
    stray = tmp_path / "blobs" / "ab" / "not-a-digest"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"never served")
    misplaced = tmp_path / "blobs" / "ab" / ("cd" + "0" * 62)
    misplaced.write_bytes(b"wrong directory")
    store = BlobStore(tmp_path)
    assert list((tmp_path / "tmp").iterdir()) == []
    assert files_under(tmp_path / "blobs") == []
    assert store.usage() == 0


async def test_lru_eviction_respects_limit_and_pins(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, max_bytes=3000)
    a = await put(store, b"a" * 1000)
    b = await put(store, b"b" * 1000)
    c = await put(store, b"c" * 1000)
    assert store.get(a.sha256) is not None  # a is now more recent than b and c
    with store.in_use(b.sha256):
        d = await put(store, b"d" * 1500)  # needs 1500: c goes, b is pinned, then a
        assert store.usage() <= 3000
        assert store.get(b.sha256) == b
        assert store.get(c.sha256) is None
        assert store.get(a.sha256) is None
        assert store.evictions == 2
        assert not c.path.exists() and not a.path.exists()
    assert store.get(d.sha256) == d


async def test_lru_order_survives_reopen(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    old = await put(store, b"o" * 100)
    new = await put(store, b"n" * 100)
    past = time.time_ns() - 10**12
    os.utime(old.path, ns=(past, past))
    os.utime(new.path, ns=(past - 10**9, past))  # new looks older on disk...
    store.get(new.sha256)  # ...until a hit records the access in its atime
    smaller = BlobStore(tmp_path, max_bytes=150)  # shrinking the limit evicts at open
    assert smaller.get(old.sha256) is None
    assert smaller.get(new.sha256) == new


async def test_get_keeps_mtime(tmp_path: Path) -> None:
    # aiohttp's ETag comes from mtime: a cache hit must not change it.
    store = BlobStore(tmp_path)
    blob = await put(store, b"etag")
    before = blob.path.stat().st_mtime_ns
    store.get(blob.sha256)
    assert blob.path.stat().st_mtime_ns == before


async def test_store_full_when_blob_cannot_fit(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, max_bytes=2000)
    kept = await put(store, b"k" * 1500)
    with pytest.raises(StoreFull):
        async with store.writer(2001):
            pass
    with store.in_use(kept.sha256), pytest.raises(StoreFull):
        async with store.writer(600):
            pass
    # Nothing was evicted for a blob that could not fit anyway.
    assert store.get(kept.sha256) == kept
    assert files_under(tmp_path / "tmp") == []


async def test_concurrent_downloads_share_the_limit(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, max_bytes=2000)
    async with store.writer(1200):
        with pytest.raises(StoreFull):
            async with store.writer(1200):
                pass


async def test_get_with_wrong_size_evicts(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    blob = await put(store, b"s" * 100)
    assert store.get(blob.sha256, expected_size=99) is None
    assert not blob.path.exists()
    assert store.usage() == 0
    assert store.get(blob.sha256) is None


async def test_get_notices_truncated_file(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    blob = await put(store, b"t" * 100)
    blob.path.write_bytes(b"t" * 50)
    assert store.get(blob.sha256) is None
    assert not blob.path.exists()


async def test_verify_catches_flipped_byte(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    data = os.urandom(200_000)
    blob = await put(store, data)
    assert await asyncio.to_thread(store.verify, blob, hashes_of(data)) is True
    rotten = bytearray(data)
    rotten[123_456] ^= 0x01
    blob.path.write_bytes(rotten)
    assert await asyncio.to_thread(store.verify, blob, hashes_of(data)) is False
    assert not blob.path.exists()
    assert store.get(blob.sha256) is None
    assert store.usage() == 0


async def test_verify_always_checks_the_blob_sha256(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    data = os.urandom(1000)
    blob = await put(store, data)
    rotten = bytes([data[0] ^ 0xFF]) + data[1:]
    blob.path.write_bytes(rotten)
    # Hashes that match the rotten bytes still fail: the name is the sha256.
    assert store.verify(blob, {"sha512": hashes_of(rotten)["sha512"]}) is False
    assert not blob.path.exists()


@pytest.mark.parametrize(
    "hostile",
    ["../x", "../../etc/passwd", "A" * 64, "g" * 64, "0" * 63, "0" * 65, "0" * 64 + "\n", "", "aa/" + "0" * 61],
)
def test_hostile_digest_rejected(tmp_path: Path, hostile: str) -> None:
    store = BlobStore(tmp_path / "store")
    outside = tmp_path / "x"
    outside.write_bytes(b"outside")
    for call in (store.get, store.evict, store.pin):
        with pytest.raises(UnsupportedHashes):
            call(hostile)
    with pytest.raises(UnsupportedHashes):
        store.verify(Blob(hostile, outside, 7), {"sha256": "0" * 64})
    assert outside.read_bytes() == b"outside"


def test_root_under_a_file_is_unwritable(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StoreUnwritable):
        BlobStore(tmp_path / "file" / "cache")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tmp").write_bytes(b"")  # tmp/ occupied by a file
    with pytest.raises(StoreUnwritable):
        BlobStore(tmp_path / "cache")


def in_private_tmpfs(tmp_path: Path, mount_options: str, body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` (Python, with ``root`` bound) on a tmpfs only it can see.

    Root ignores permission bits, so read-only and disk-full are made real
    with a mount in a private mount namespace, gone when the child exits.
    """
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare for a private tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = tmp_path / "body.py"
    script.write_text(f"import sys\nfrom pathlib import Path\nroot = Path(sys.argv[1])\n{textwrap.dedent(body)}")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace: {probe.stderr!r}")
    cmd = f'mount -t tmpfs -o {mount_options} tmpfs "$1" && exec "$2" "$3" "$1"'
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", cmd, "sh", str(mnt), sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_read_only_root_is_unwritable(tmp_path: Path) -> None:
    result = in_private_tmpfs(
        tmp_path,
        "ro,size=1m",
        """
        from proxy.storage.store import BlobStore
        from proxy.protocol.errors import StoreUnwritable
        try:
            BlobStore(root / "cache")
        except StoreUnwritable as e:
            print("unwritable:", e)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "unwritable:" in result.stdout and "Read-only" in result.stdout


def test_disk_full_is_store_full_and_cleans_up(tmp_path: Path) -> None:
    result = in_private_tmpfs(
        tmp_path,
        "size=512k",
        """
        import asyncio, hashlib
        from proxy.storage.store import BlobStore
        from proxy.protocol.errors import StoreFull
        async def main():
            store = BlobStore(root / "cache")  # no limit of its own: the disk is the limit
            data = b"f" * 2**20
            try:
                async with store.writer(4 * len(data)) as w:
                    for _ in range(4):
                        await w.write(data)
            except StoreFull as e:
                print("full:", e)
            print("left:", sorted(p.name for p in (root / "cache").rglob("*") if p.is_file()))
        asyncio.run(main())
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "full:" in result.stdout
    assert "left: []" in result.stdout


async def test_same_content_written_twice_concurrently(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    data = os.urandom(3 * 2**20 + 17)
    first, second = await asyncio.gather(put(store, data, chunk=2**19), put(store, data, chunk=2**19))
    assert first == second
    assert files_under(tmp_path / "blobs") == [first.path]
    assert files_under(tmp_path / "tmp") == []
    assert store.usage() == len(data)
    assert first.path.read_bytes() == data


async def test_large_write_is_quick_and_loop_stays_responsive(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    data = os.urandom(2**20)
    n = 50
    whole = hashlib.sha256()
    for _ in range(n):
        whole.update(data)
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    start = time.monotonic()
    async with store.writer(n * len(data)) as w:
        for _ in range(n):
            await w.write(data)  # the fetch hands over batches of received chunks
        blob = await w.publish(whole.hexdigest())
    elapsed = time.monotonic() - start
    done.set()
    await tick
    assert blob.size == n * len(data)
    assert elapsed < 10, f"50 MiB took {elapsed:.1f}s"
    assert max(gaps) < 0.5, f"event loop stalled {max(gaps):.2f}s"


def test_index_cache_round_trip_across_reopen(tmp_path: Path) -> None:
    cache = IndexCache(tmp_path)
    page = b"<html>verified page</html>" * 100
    cache.set("simple/demo/index.html#" + "0" * 64, page)
    assert cache.get("simple/demo/index.html#" + "0" * 64) == page
    assert cache.get("simple/other/index.html") is None
    with pytest.raises(TypeError):
        cache.set("k", "not bytes")  # type: ignore[arg-type]
    cache.close()
    reopened = IndexCache(tmp_path)
    assert reopened.get("simple/demo/index.html#" + "0" * 64) == page
    reopened.close()


@pytest.mark.parametrize("error,kind", [(sqlite3.OperationalError("database or disk is full"), StoreFull),
                                        (sqlite3.DatabaseError("database disk image is malformed"), StoreError)])
def test_index_cache_write_failures_are_store_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     error: sqlite3.Error, kind: type[StoreError]) -> None:
    """A page small enough to live inside the database fails there, as SQLite's error: ours, typed."""
    cache = IndexCache(tmp_path)

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(cache._cache, "set", fail)
    with pytest.raises(kind, match="index cache write"):
        cache.set("simple/demo/index.html#" + "0" * 64, b"page")
    cache.close()


def test_index_cache_is_bounded(tmp_path: Path) -> None:
    cache = IndexCache(tmp_path, size_limit=2**20)
    for i in range(40):
        cache.set(f"page{i}", bytes([i]) * 100_000)
    stored = sum(cache.get(f"page{i}") is not None for i in range(40))
    assert stored < 40
    assert cache.get("page39") == bytes([39]) * 100_000
    cache.close()
