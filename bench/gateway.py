"""The gateway's figures: cold pages through edge -> gateway, publish latency, file MB/s.

One run on 127.0.0.1: the test index (tests/support/testindex.py) serving
real wheels, a gateway and an edge (``serve --profile gateway``) as
subprocesses.  Measured:

* cold project page: the first GET of a never-published project from the
  edge (its miss asks the gateway to publish, waits for the timestamp and
  refreshes), against a GET of the same page straight from the index; medians;
* publish latency under load: 50 never-seen projects published at once,
  p50 and p99 of the POSTs, and how many batches that cost;
* gateway file throughput: a cold FILE_MB file streamed through the gateway
  (hashed against its pin, written, sent), against the same file straight
  from the index.

Usage: ``python bench/gateway.py [--projects 20] [--file-mb 64]``; prints
JSON and writes ``bench/results/gateway.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.repository.sample import build_wheel  # noqa: E402
from tests.support.gatewayproc import GatewayProcess  # noqa: E402
from tests.support.proxyproc import ProxyProcess  # noqa: E402
from tests.support.testindex import TestIndex  # noqa: E402

JSON_ACCEPT = {"Accept": "application/vnd.pypi.simple.v1+json"}


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[float, int]:
    start = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=120) as r:
        n = 0
        while chunk := r.read(1 << 20):
            n += len(chunk)
    return time.perf_counter() - start, n


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--projects", type=int, default=20)
    ap.add_argument("--file-mb", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as t:
        tmp = Path(t)
        index = TestIndex()
        for i in range(args.projects + 50):
            index.add(build_wheel(tmp / "d", f"cold{i}", "1.0"))
        big = index.add(build_wheel(tmp / "d", "bigfile", "1.0", payload=random.Random(0).randbytes(args.file_mb << 18)))
        with index:
            subprocess.run([sys.executable, "-m", "proxy", "gateway", "init", str(tmp / "gw")], check=True, capture_output=True)
            with GatewayProcess(tmp / "gw", "--index-url", index.url) as gw, \
                    ProxyProcess(tmp / "edge", "--profile", "gateway", "--upstream", gw.base, "--root", str(gw.root),
                                 "--workers", "1", "--refresh-interval", "3600") as edge:
                cold, direct = [], []
                for i in range(args.projects):
                    start = time.perf_counter()
                    _get(f"{edge.url}cold{i}/", JSON_ACCEPT)  # the edge's miss asks the gateway to publish
                    cold.append(time.perf_counter() - start)
                    direct.append(_get(f"{index.url}cold{i}/", JSON_ACCEPT)[0])

                def timed_publish(name: str) -> float:
                    start = time.perf_counter()
                    assert gw.publish(name, timeout=120)[0] == 200
                    return time.perf_counter() - start

                text = urllib.request.urlopen(f"{gw.base}metrics").read().decode()
                before = float(re.search(r"^tufproxy_gateway_publishes_total (\S+)", text, re.M).group(1))
                with concurrent.futures.ThreadPoolExecutor(50) as pool:
                    latencies = list(pool.map(timed_publish, [f"cold{args.projects + i}" for i in range(50)]))
                text = urllib.request.urlopen(f"{gw.base}metrics").read().decode()
                batches = float(re.search(r"^tufproxy_gateway_publishes_total (\S+)", text, re.M).group(1)) - before

                assert gw.publish("bigfile")[0] == 200
                name = big.path.name
                through, size = _get(f"{gw.base}packages/bigfile/{name}")
                straight, _ = _get(f"{index.files_url}files/bigfile/{name}")
    result = {
        "cold_page_edge_via_gateway_ms": round(statistics.median(cold) * 1e3, 1),
        "page_direct_from_index_ms": round(statistics.median(direct) * 1e3, 1),
        "publish_50_concurrent_p50_ms": round(_pct(latencies, 0.5) * 1e3, 1),
        "publish_50_concurrent_p99_ms": round(_pct(latencies, 0.99) * 1e3, 1),
        "publish_50_concurrent_batches": batches,
        "file_mb": round(size / 2**20, 1),
        "gateway_cold_file_mb_s": round(size / 2**20 / through, 1),
        "index_direct_file_mb_s": round(size / 2**20 / straight, 1),
    }
    out = ROOT / "bench" / "results" / "gateway.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
