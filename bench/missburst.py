"""A burst of cold misses through edge -> gateway, the way uv resolves: A/B of tufproxy trees (issue 33).

``bench/install.py``'s local index (its real wheels, ``--rtt-ms`` delay on
every answer) with, per tree and per round, a fresh ``tufproxy gateway``
and a ``tufproxy serve --profile gateway`` edge in front of it (install.py's
setup).  Then ``--burst`` concurrent GETs of ``/simple/<project>/`` (PEP 691
JSON), one per project, none published yet: every one is a miss the edge
asks the gateway to publish, then refreshes its metadata for.  Reported per
tree, medians of ``--rounds`` (trees alternate within each round, so load
that drifts on a shared machine weighs on all alike): the burst's wall
seconds (first GET sent to last answer read), the slowest and median
request, and the CPU seconds the gateway's and the edge's process trees
spent on the burst (utime + stime).  ``floor``: the same GETs straight
from the index.

    python bench/missburst.py [NAME=DIR,...] [--rounds 7] [--burst 19] [--rtt-ms 40] [--spy DIR]

``DIR``: a tufproxy tree put first on ``PYTHONPATH`` (``git worktree add
/tmp/base HEAD`` for "before"); default ``now=<this tree>``.  ``--spy DIR``
records py-spy raw profiles of the gateway and the edge (``py-spy`` on
``PATH`` or ``--py-spy``) into DIR for each round of the first tree.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import contenders as C  # noqa: E402
from install import Index, Tufproxy, fetch_corpus, load  # noqa: E402
from warmab import _cpu_seconds  # noqa: E402

JSON = "application/vnd.pypi.simple.v1+json"


async def burst(base: str, projects: list[str]) -> list[float]:
    """Seconds of each GET of ``base<project>/``, all sent at once; raises unless every one is a 200."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def one(project: str) -> float:
            started = time.monotonic()
            async with session.get(f"{base}{project}/", headers={"Accept": JSON}) as r:
                body = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{project}: {r.status} {body[:200]!r}")
            return time.monotonic() - started

        return list(await asyncio.gather(*(one(p) for p in projects)))


def _spy(py_spy: str, server: C.Server, out: Path) -> subprocess.Popen[bytes]:
    argv = [py_spy, "record", "-p", str(server.proc.pid), "-f", "raw", "--nonblocking", "-r", "200",
            "-o", str(out)]
    if server.name == "edge":
        argv.append("--subprocesses")
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="?", default=f"now={HERE.parent}", help="comma-separated NAME=DIR")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--burst", type=int, default=19)
    parser.add_argument("--rtt-ms", type=float, default=40)
    parser.add_argument("--spy", type=Path, help="record py-spy profiles of the first tree into this directory")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "/tmp/spy/bin/py-spy")
    args = parser.parse_args()
    trees = [(name, Path(path).resolve()) for name, _, path in (t.partition("=") for t in args.trees.split(","))]

    projects = load(fetch_corpus(lambda m: print(m, file=sys.stderr)))
    names = sorted(projects)[:args.burst]
    index = Index(projects, args.rtt_ms / 1000)
    results: dict[str, list[tuple[float, float, float, float, float]]] = {name: [] for name, _ in trees}
    floor: list[float] = []
    work = Path(tempfile.mkdtemp(prefix="missburst-"))
    try:
        for rnd in range(args.rounds):
            started = time.monotonic()
            asyncio.run(burst(index.url, names))
            floor.append(time.monotonic() - started)
            for i, (name, src) in enumerate(trees):
                setup = Tufproxy(index, work / name, env={"PYTHONPATH": str(src)})
                setup.fresh()
                gateway, edge = setup.servers
                spies = []
                if args.spy is not None and i == 0:
                    args.spy.mkdir(parents=True, exist_ok=True)
                    spies = [_spy(args.py_spy, s, args.spy / f"{s.name}-{rnd}.txt") for s in (gateway, edge)]
                    time.sleep(1.0)  # py-spy attaching: not a synchronisation with tufproxy
                cpu0 = _cpu_seconds(gateway), _cpu_seconds(edge)
                started = time.monotonic()
                took = asyncio.run(burst(setup.url, names))
                wall = time.monotonic() - started
                cpu1 = _cpu_seconds(gateway), _cpu_seconds(edge)
                for spy in spies:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(30)
                setup.stop()
                results[name].append((wall, max(took), statistics.median(took), cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]))
                print(f"round {rnd + 1} {name}: {wall:.3f} s, gateway cpu {cpu1[0] - cpu0[0]:.2f} s, "
                      f"edge cpu {cpu1[1] - cpu0[1]:.2f} s", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"{args.burst} concurrent cold misses, rtt {args.rtt_ms:g} ms, medians of {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"floor (index directly): {statistics.median(floor):.3f} s")
    print("| tree | burst wall s | slowest s | median req s | gateway cpu s | edge cpu s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, rows in results.items():
        cols = [statistics.median(col) for col in zip(*rows, strict=True)]
        print(f"| {name} | " + " | ".join(f"{c:.3f}" for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
