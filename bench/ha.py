"""Gateway replicas on one bucket (``--leader-lease``): failover time over kills, and what the lease costs a publish.

SeaweedFS (``weed`` from the test extra) and a test index on 127.0.0.1.

* Failover: two replicas (copies of one DIR) on one prefix; ``--kills``
  times the leader is killed with SIGKILL and the time until the other
  reports ``tufproxy_gateway_leader 1`` is measured (polled every 20 ms),
  then the killed one is started again as a follower.  Median and max,
  beside the goal (lease + 2 s).
* Publish: ``--publishes`` projects, each published once (POST to the
  miss protocol; the answer comes after the batch is signed and pushed) on
  a lone gateway pushing to a bucket without a lease, on the leader of a
  group of two, and through its follower (which forwards to the leader):
  medians, and what forwarding adds.

    python -m bench.ha [--kills 20] [--lease 5] [--publishes 15]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from proxy.repository.sample import build_wheel
from tests.support.gatewayproc import GatewayProcess, gateway_init, metric
from tests.support.seaweed import BUCKET, Seaweed
from tests.support.testindex import TestIndex


def leader(gw: GatewayProcess) -> bool:
    try:
        return metric(gw.base, "tufproxy_gateway_leader") == 1.0
    except OSError:
        return False


def until(condition, limit: float) -> float:  # type: ignore[no-untyped-def]
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > limit:
            raise RuntimeError("timed out")
        time.sleep(0.02)
    return time.monotonic() - began


def publish_times(gw: GatewayProcess, projects: list[str]) -> list[float]:
    times = []
    for project in projects:
        began = time.monotonic()
        status, answer = gw.publish(project)
        assert status == 200, (status, answer)
        times.append(time.monotonic() - began)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)  # the count
    ap.add_argument("--lease", type=float, default=5.0)
    ap.add_argument("--publishes", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        seaweed = Seaweed(tmp / "seaweed").start()
        index = TestIndex(separate_files_host=True)
        names = [f"proj{i}" for i in range(3 * args.publishes)]
        for name in names:
            index.add(build_wheel(tmp / "dists", name, "1.0"))
        gateway_init(tmp / "a")
        shutil.copytree(tmp / "a", tmp / "b")
        shutil.copytree(tmp / "a", tmp / "lone")
        try:
            with index:
                def gateway(name: str, prefix: str, *extra: str) -> GatewayProcess:
                    gw = GatewayProcess(tmp / name, "--index-url", index.url, "--files-origin", index.files_url,
                                        "--batch-window", "0.05", "--store", f"s3://{BUCKET}/{prefix}",
                                        "--s3-endpoint-url", seaweed.endpoint, *extra)
                    gw.env = seaweed.env()
                    return gw.start()

                lone = gateway("lone", "lone")
                alone = publish_times(lone, names[:args.publishes])
                lone.stop()
                group = [gateway(n, "group", "--leader-lease", str(args.lease)) for n in ("a", "b")]
                until(lambda: sum(map(leader, group)) == 1, 60)
                first = next(g for g in group if leader(g))
                leased = publish_times(first, names[args.publishes:2 * args.publishes])
                follower = next(g for g in group if g is not first)
                forwarded = publish_times(follower, names[2 * args.publishes:])
                failovers = []
                for _ in range(args.kills):
                    old = next(g for g in group if leader(g))
                    other = next(g for g in group if g is not old)
                    old.kill()
                    failovers.append(until(lambda: leader(other), 4 * args.lease))  # noqa: B023
                    old.start()
                for g in group:
                    g.stop()
        finally:
            seaweed.stop()
    a, b, c = statistics.median(alone), statistics.median(leased), statistics.median(forwarded)
    print(f"publish, lone gateway on a bucket, no lease: median {a * 1000:.0f} ms over {len(alone)}")
    print(f"publish, leader of two replicas, --leader-lease {args.lease:g}: median {b * 1000:.0f} ms over "
          f"{len(leased)} ({b / a:.2f}x the lone gateway, {1000 * (b - a):+.0f} ms)")
    print(f"publish through the follower (forwarded to the leader): median {c * 1000:.0f} ms over {len(forwarded)} "
          f"({c / b:.2f}x the leader, forwarding adds {1000 * (c - b):+.0f} ms; goal <= 20 ms)")
    print(f"failover after SIGKILL of the leader, {len(failovers)} kills, lease {args.lease:g} s: "
          f"median {statistics.median(failovers):.2f} s, max {max(failovers):.2f} s "
          f"(goal lease + 2 s = {args.lease + 2:g} s)")


if __name__ == "__main__":
    main()
