"""A replica group's shared ledger at scale: what one batch costs the leader and a follower, by ledger size.

SeaweedFS (``weed`` from the test extra) on 127.0.0.1; two replicas'
:class:`~proxy.gateway.shared.SharedState` on one prefix, the leader
holding a lease.  For each size, the leader's ledger is filled with that
many synthetic projects (a project record, a pin and a first sight each,
about the lines a publish appends), shared once (the backlog goes up in
segments, the follower catches up: both timed), then ``--batches``
batches of one new project each are appended and synced, leader then
follower: the median wall time of each side's sync and the bytes each
moved, beside the bytes the whole-file layout of older versions moved
(the ledger file's size, uploaded by the leader and read by each follower
per batch).

    python -m bench.shared_ledger [--sizes 1000 100000] [--batches 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, cast

from prometheus_client import CollectorRegistry

from proxy.gateway.ledger import Ledger
from proxy.gateway.shared import SharedState
from proxy.repository import Repository
from proxy.storage.leader import LeaderLease
from proxy.transport.bucket import Bucket
from proxy.util.metrics import BucketMetrics
from tests.support.seaweed import BUCKET, Seaweed


def project(name: str) -> list[dict[str, Any]]:
    filename = f"{name}-1.0-py3-none-any.whl"
    return [{"kind": "project", "project": name, "index": "https://index.example/simple/"},
            {"kind": "pin", "project": name, "filename": filename, "hashes": {"sha256": os.urandom(32).hex()},
             "size": 12345, "index": "https://index.example/simple/",
             "url": f"https://files.example/packages/{name}/{filename}", "core_metadata": {"sha256": os.urandom(32).hex()}},
            {"kind": "seen", "project": name, "filename": filename, "counts_from": None}]


def moved(bucket: Bucket, op: str) -> float:
    return cast(float, bucket.metrics.bytes.labels(op)._value.get())  # type: ignore[attr-defined]


async def one_size(seaweed: Seaweed, root: Path, size: int, batches: int) -> dict[str, float]:
    replicas = []
    for name in ("leader", "follower"):
        bucket = Bucket(f"s3://{BUCKET}/size{size}", BucketMetrics(CollectorRegistry()), endpoint_url=seaweed.endpoint)
        lease = LeaderLease(bucket, 600.0, holder=name)
        ledger = Ledger(root / f"{size}-{name}")
        replicas.append(SharedState(bucket, lease, ledger, root / f"{size}-{name}" / "advisories.json",
                                    cast(Repository, None), name))
    leader, follower = replicas
    assert await leader.lease.step() and not await follower.lease.step()
    lines: list[dict[str, Any]] = []
    for i in range(size):
        lines += project(f"p{i}")
    await asyncio.to_thread(leader.ledger.append, lines)
    began = time.monotonic()
    await leader.sync()
    first_upload = time.monotonic() - began
    began = time.monotonic()
    await follower.sync()
    catch_up = time.monotonic() - began
    lead_times, follow_times, put, got = [], [], [], []
    for i in range(batches):
        await asyncio.to_thread(leader.ledger.append, project(f"new{i}"))
        before = moved(leader.bucket, "put")
        began = time.monotonic()
        await leader.sync()
        lead_times.append(time.monotonic() - began)
        put.append(moved(leader.bucket, "put") - before)
        before = moved(follower.bucket, "get")
        began = time.monotonic()
        await follower.sync()
        follow_times.append(time.monotonic() - began)
        got.append(moved(follower.bucket, "get") - before)
    assert follower.ledger.pins.get((f"new{batches - 1}", f"new{batches - 1}-1.0-py3-none-any.whl")) is not None
    return {"lead_ms": statistics.median(lead_times) * 1000, "follow_ms": statistics.median(follow_times) * 1000,
            "put": statistics.median(put), "get": statistics.median(got),
            "whole": float(leader.ledger.path.stat().st_size), "first_upload": first_upload, "catch_up": catch_up}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 100000])
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        seaweed = Seaweed(tmp / "seaweed").start()
        try:
            os.environ.update(seaweed.env())
            results = {size: asyncio.run(one_size(seaweed, tmp, size, args.batches)) for size in args.sizes}
        finally:
            seaweed.stop()
    base = results[args.sizes[0]]
    print(f"{'projects':>9} {'leader sync':>12} {'follower sync':>14} {'put/batch':>10} {'get/batch':>10} "
          f"{'whole file':>11} {'backlog up':>11} {'catch-up':>9}")
    for size, r in results.items():
        print(f"{size:>9,} {r['lead_ms']:>9.1f} ms {r['follow_ms']:>11.1f} ms {r['put']:>8,.0f} B {r['get']:>8,.0f} B "
              f"{r['whole'] / 1e6:>8.1f} MB {r['first_upload']:>9.1f} s {r['catch_up']:>7.1f} s")
    for size, r in list(results.items())[1:]:
        print(f"{size:,} vs {args.sizes[0]:,} projects: leader sync {r['lead_ms'] / base['lead_ms']:.2f}x, "
              f"follower sync {r['follow_ms'] / base['follow_ms']:.2f}x, bytes per batch "
              f"{(r['put'] + r['get']) / (base['put'] + base['get']):.2f}x (the whole-file layout: "
              f"{r['whole'] / base['whole']:.0f}x, {r['whole'] / 1e6:.1f} MB up and down per batch)")


if __name__ == "__main__":
    main()
