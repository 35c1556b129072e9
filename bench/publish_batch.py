"""One gateway publish batch, tree against tree: ``Repository.publish_pages`` of 1 and of 10 new project pages.

What a gateway's publisher runs per batch (render, sign every bin-n it
changed, the snapshot and the timestamp, write and flush, timestamp last),
back to back into one repository of ``--bins`` bins, in a process per tree
(the tree first on ``PYTHONPATH``), trees alternating round by round.
Prints the median milliseconds per batch and the ratio to the first tree.

    python bench/publish_batch.py NAME=DIR [NAME=DIR ...] [--bins 1024] [--rounds 5] [--batches 20]

``DIR``: a tufproxy tree (``git archive <commit> proxy | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

# Run in each tree's process: median ms of `batches` publishes of k pages, for k = 1 and 10, one repository.
_MEASURE = """
import statistics, sys, tempfile, time
from pathlib import Path
from proxy.protocol import index
from proxy.repository import Repository
bins, batches = int(sys.argv[1]), int(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp:
    repo = Repository.init(Path(tmp) / "g", bins=bins, layout="gateway", clock_versions=True)
    n = 0
    def page(name):
        return index.ProjectPage(name=name, files=tuple(index.DistFile(
            filename=f"{name}-1.{i}-py3-none-any.whl", url=f"../../packages/{name}/{name}-1.{i}-py3-none-any.whl",
            hashes={"sha256": f"{i:064d}"}) for i in range(5)))
    for k in (1, 10):
        took = []
        for _ in range(batches):
            pages = {f"p{n + i}": page(f"p{n + i}") for i in range(k)}
            n += k
            start = time.perf_counter()
            repo.publish_pages(pages)
            took.append(time.perf_counter() - start)
        print(k, statistics.median(took) * 1e3)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+", help="NAME=DIR")
    ap.add_argument("--bins", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=20)
    args = ap.parse_args()
    trees = dict(spec.split("=", 1) for spec in args.trees)
    took: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds):
        for name, tree in trees.items():
            done = subprocess.run([sys.executable, "-c", _MEASURE, str(args.bins), str(args.batches)], check=True,
                                  capture_output=True, text=True, env={**os.environ, "PYTHONPATH": tree}, cwd=tree)
            for line in done.stdout.splitlines():
                k, ms = line.split()
                took.setdefault((name, int(k)), []).append(float(ms))
        print(f"round {r + 1}: " + ", ".join(f"{n} k={k} {t[-1]:.1f} ms" for (n, k), t in took.items()), file=sys.stderr)
    first = next(iter(trees))
    print(f"publish_pages into a gateway repository of {args.bins} bins, {args.batches} batches a round, "
          f"{args.rounds} rounds: median ms per batch (ratio to {first})")
    for k in (1, 10):
        for name in trees:
            median = statistics.median(took[(name, k)])
            print(f"{k:2} page(s)  {name:8} {median:6.1f} ({median / statistics.median(took[(first, k)]):.2f})")


if __name__ == "__main__":
    main()
