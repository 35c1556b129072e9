"""Cold big-file latency: tufproxy streaming vs --verify-before-send vs the floor.

One upstream on 127.0.0.1 (the tests' asyncio file server, optionally
throttled) serving a signed repository with one large wheel.  The floor is
the same file fetched straight from that upstream and sha256-hashed as it
arrives.  For each mode a fresh proxy with an empty cache fetches it
cold; time to first byte and total time are taken from the client's side,
medians over ``--repeats``.  Prints a markdown table.

    python bench/stream.py --size 200M [--rate 12M] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from proxy.repository import Repository  # noqa: E402
from proxy.serving.config import parse_size  # noqa: E402
from tests.support.faults import FaultyUpstream, sized_wheel  # noqa: E402
from tests.support.proxyproc import ProxyProcess  # noqa: E402


async def timed_get(url: str) -> tuple[float, float, str]:
    """(seconds to the first body byte, seconds to the end, sha256) of one GET."""
    digest = hashlib.sha256()
    start = time.monotonic()
    first = None
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as r:
        r.raise_for_status()
        async for chunk in r.content.iter_chunked(2**20):
            if first is None:
                first = time.monotonic() - start
            digest.update(chunk)
    return first or 0.0, time.monotonic() - start, digest.hexdigest()


async def first_byte(url: str) -> float:
    """Seconds from the request to the first body byte of ``url``; the rest is not read."""
    start = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as r:
        r.raise_for_status()
        await r.content.readany()
        return time.monotonic() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="200M", type=parse_size)
    p.add_argument("--rate", default=None, type=parse_size, help="upstream bytes/s (default: unthrottled)")
    p.add_argument("--repeats", default=3, type=int)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repo = Repository.init(work / "repo", bins=16)
        wheel = sized_wheel(work / "dists", "big", "1.0", args.size)
        repo.add([wheel])
        expected = hashlib.sha256(wheel.read_bytes()).hexdigest()
        size = wheel.stat().st_size
        root = work / "root.json"
        root.write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
        path = f"packages/big/{wheel.name}"
        rows: dict[str, list[tuple[float, float]]] = {"floor": [], "tufproxy (streaming)": [],
                                                     "tufproxy --verify-before-send": []}
        with FaultyUpstream(repo.public_dir, rate=args.rate) as up:
            for i in range(args.repeats):
                first, total, sha = asyncio.run(timed_get(up.url + path))
                assert sha == expected
                rows["floor"].append((first, total))
                for mode, extra in (
                    ("tufproxy (streaming)", ()),
                    ("tufproxy --verify-before-send", ("--verify-before-send", "yes")),
                ):
                    with ProxyProcess(
                        work / f"cache-{i}-{len(extra)}", "--upstream", up.url, "--root", str(root), "--workers", "1", *extra
                    ) as proxy:
                        first, total, sha = asyncio.run(timed_get(proxy.base + path))
                    assert sha == expected
                    rows[mode].append((first, total))
    floor_total = statistics.median(t for _, t in rows["floor"])
    rate = f"{args.rate / 2**20:.0f} MiB/s" if args.rate else "unthrottled"
    print(f"Cold {size / 2**20:.0f} MiB wheel, upstream {rate}, medians of {args.repeats}:\n")
    print("| | first byte (s) | total (s) | × floor |")
    print("|---|---:|---:|---:|")
    for mode, samples in rows.items():
        first = statistics.median(f for f, _ in samples)
        total = statistics.median(t for _, t in samples)
        print(f"| {mode} | {first:.2f} | {total:.2f} | {total / floor_total:.2f} |")


if __name__ == "__main__":
    main()
