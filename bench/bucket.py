"""The bucket tier: warm MB/s from the local tier and from the bucket; a cold fleet on a bucket vs separate disks.

SeaweedFS (``weed`` from the test extra) and one upstream (the tests'
asyncio file server) on 127.0.0.1, serving a signed repository of
``--files`` wheels of ``--size`` each.

* Cold fleet: 3 replicas, every replica asks for every file at the same
  time (one client per replica and file).  Run once with ``--store`` on one
  bucket prefix and once with 3 separate cache directories; the upstream
  counts the file requests it answered and the bytes of those files.
* Warm: one file read through a replica whose local tier holds it
  (sendfile), and through fresh replicas whose local tier is empty while
  the bucket holds it (read from the bucket, verified, streamed; the
  replica's metadata warmed by another file first): medians of ``--repeats``.

    python -m bench.bucket [--files 6] [--size 16M] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import re
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from proxy.repository import Repository
from proxy.serving.config import parse_size
from tests.support.faults import FaultyUpstream, sized_wheel
from tests.support.proxyproc import ProxyProcess
from tests.support.seaweed import BUCKET, Seaweed


async def timed_get(url: str) -> tuple[float, str]:
    """(seconds, sha256) of one GET."""
    digest = hashlib.sha256()
    start = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s, s.get(url) as r:
        r.raise_for_status()
        async for chunk in r.content.iter_chunked(2**20):
            digest.update(chunk)
    return time.monotonic() - start, digest.hexdigest()


def replica(tmp: Path, upstream: FaultyUpstream, root: Path, weed: Seaweed, prefix: str | None) -> ProxyProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    store = ["--store", f"s3://{BUCKET}/{prefix}", "--s3-endpoint-url", weed.endpoint] if prefix else []
    return ProxyProcess(tmp / "cache", "--upstream", upstream.url, "--root", str(root), "--workers", "1",
                        "--log-level", "warning", *store, env=weed.env()).start(60)


def proxy_path(wheel: Path) -> str:
    return f"packages/{wheel.name.split('-')[0]}/{wheel.name}"


async def cold_fleet(replicas: list[ProxyProcess], wheels: list[Path], upstream: FaultyUpstream) -> tuple[int, int, float]:
    """(upstream file fetches, their bytes, seconds) for every replica asking for every file at once."""
    before = {w.name: upstream.count(rf"/packages/[^/]+/[0-9a-f]+\.{re.escape(w.name)}") for w in wheels}
    start = time.monotonic()
    results = await asyncio.gather(*(timed_get(r.base + proxy_path(w)) for r in replicas for w in wheels))
    seconds = time.monotonic() - start
    expected = {hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels}
    assert {digest for _, digest in results} == expected, "a replica served wrong bytes"
    fetches = {w.name: upstream.count(rf"/packages/[^/]+/[0-9a-f]+\.{re.escape(w.name)}") - before[w.name]
               for w in wheels}
    return sum(fetches.values()), sum(n * w.stat().st_size for w in wheels for n in [fetches[w.name]]), seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=6)
    p.add_argument("--size", default="16M", type=parse_size)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repo = Repository.init(work / "repo", bins=16)
        wheels = [sized_wheel(work / "dists", f"heavy{i}", "1.0", args.size) for i in range(args.files)]
        repo.add(wheels)
        root = work / "root.json"
        root.write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
        weed = Seaweed(work / "weed").start()
        started: list[ProxyProcess] = []
        try:
            with FaultyUpstream(repo.public_dir) as upstream:
                rows = []
                for label, prefix in (("3 replicas, one bucket", "fleet"), ("3 replicas, separate disks", None)):
                    fleet = [replica(work / f"{prefix or 'disk'}{i}", upstream, root, weed, prefix) for i in range(3)]
                    started += fleet
                    fetches, nbytes, seconds = asyncio.run(cold_fleet(fleet, wheels, upstream))
                    rows.append(f"| {label} | {3 * len(wheels)} | {fetches} | {nbytes / 2**20:.0f} MiB | {seconds:.1f} s |")
                mib = args.size / 2**20
                target = started[0].base + proxy_path(wheels[0])
                local = [asyncio.run(timed_get(target))[0] for _ in range(args.repeats)]
                from_bucket = []
                for i in range(args.repeats):
                    fresh = replica(work / f"fresh{i}", upstream, root, weed, "fleet")
                    started.append(fresh)
                    # Its trusted metadata warm first (through another file), so only the read is timed.
                    asyncio.run(timed_get(fresh.base + proxy_path(wheels[1 + i % (len(wheels) - 1)])))
                    from_bucket.append(asyncio.run(timed_get(fresh.base + proxy_path(wheels[0])))[0])
                    fresh.stop()
        finally:
            for r in started:
                r.stop()
            weed.stop()
    print(f"{args.files} wheels of {mib:.0f} MiB; every replica asks for every file at once\n")
    print("| fleet | client requests | upstream file fetches | upstream bytes | wall time |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\n| warm read of one {mib:.0f} MiB file (median of {args.repeats}) | MB/s |")
    print("|---|---|")
    print(f"| local tier (sendfile) | {mib / statistics.median(local):.0f} |")
    print(f"| bucket, empty local tier (read, verified, streamed, local tier filled) | "
          f"{mib / statistics.median(from_bucket):.0f} |")


if __name__ == "__main__":
    main()
