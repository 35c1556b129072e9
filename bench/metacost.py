"""tufproxy's metadata cost: its trust core over HTTP against the bench upstream.

Refresh from nothing (timestamp, a 16384-bin snapshot, targets, bins), then
the first lookup of targets in bins no request touched yet (one bin-n fetch
and verify each), then a lookup in a loaded bin.  Run by ``bench/run.py`` as
a process of its own, with ``PYTHONPATH`` at the tufproxy source under test;
prints one JSON object (medians, ms).

Usage: ``python bench/metacost.py UPSTREAM_URL ROOT_JSON REPEATS TARGET_PATH...``
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from proxy.transport.upstream import AiohttpFetcher
from proxy.trust import Mirror, TrustConfig, TrustedClient

WARM_LOOKUPS = 100


async def _once(upstream: str, root: bytes, directory: Path, paths: list[str]) -> tuple[float, list[float], float]:
    TrustedClient.initialize(directory, root)
    fetcher = AiohttpFetcher(connect_timeout=10, read_timeout=30)
    client = TrustedClient(directory, [Mirror(f"{upstream}metadata/", upstream)], fetcher, TrustConfig(refresh_interval=3600))
    try:
        t0 = time.perf_counter()
        await client.refresh(force=True)
        refresh = time.perf_counter() - t0
        firsts = []
        for path in paths:
            t0 = time.perf_counter()
            await client.get_target(path)
            firsts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(WARM_LOOKUPS):
            await client.get_target(paths[0])
        warm = (time.perf_counter() - t0) / WARM_LOOKUPS
    finally:
        client.close()
        await fetcher.close()
    return refresh, firsts, warm


def main(argv: list[str]) -> dict[str, float]:
    upstream, root_file, repeats, paths = argv[0], Path(argv[1]), int(argv[2]), argv[3:]
    root = root_file.read_bytes()
    refreshes: list[float] = []
    firsts: list[float] = []
    warms: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-meta-") as tmp:
        for i in range(repeats):
            refresh, first, warm = asyncio.run(_once(upstream, root, Path(tmp) / str(i), paths))
            refreshes.append(refresh)
            firsts += first
            warms.append(warm)
    return {"refresh_ms": statistics.median(refreshes) * 1e3, "first_lookup_ms": statistics.median(firsts) * 1e3,
            "warm_lookup_ms": statistics.median(warms) * 1e3}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
