"""uv cold and warm installs through edge -> gateway: A/B of tufproxy trees, beside direct (issue 33).

``bench/install.py``'s local index (its real wheels, ``--rtt-ms`` delay on
every answer) and setup, uv alone (whose cold install is the goal still
missed), trees alternating within each round so that load drifting on a
shared machine weighs on all alike.  Per round: uv straight at the index,
then for each tree a fresh gateway and edge, a cold install and a warm
one.  Prints medians and every cold figure, the CPU seconds the gateway
and edge spent on each cold install (a steadier figure than the wall
time on a shared machine), and for each tree after the first the median
of its round-by-round difference to the first in both and how many
rounds it was lower: a change smaller than the spread of the medians
shows there first.

    python bench/uvab.py [NAME=DIR[:VAR=VALUE],...] [--rounds 10] [--rtt-ms 40] [--warm-up]

``DIR``: a tufproxy tree put first on ``PYTHONPATH`` (``git worktree add
/tmp/base HEAD`` for "before"); ``VAR=VALUE``: an environment setting for
that tree's servers (``TUFPROXY_WORKERS=1``).  Default ``now=<this tree>``.
``--gateway-rtt-ms N``: the edge reaches the gateway through a relay (in
this process) that holds each request N ms, as the index does: an edge
and a gateway apart, as in most deployments, where the round trips of the
miss protocol count.  ``--disk-load MIB``: a process beside them writes
and fsyncs a file of MIB MiB after another, in the servers' filesystem, for
the whole run: a disk busy with others' writes (a backup, other services,
the shared machines these benches run on at busy hours), on which every
fsync of the gateway and the edge waits for the journal behind them.
``--warm-up``: each fresh edge and gateway first install two projects
outside the install's closure (untimed): the cold install then meets
processes already serving, as a long-running edge and gateway are, with
every page and file of its own still to fetch and sign.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from install import Index, Tufproxy, fetch_corpus, install, load  # noqa: E402
from trace_install import Tap  # noqa: E402
from warmab import _cpu_seconds  # noqa: E402

# Installed (untimed) through each fresh edge and gateway before the cold install with --warm-up: projects of the
# corpus outside the install's dependency closure, so the cold install's pages and files are all still to fetch.
WARM_UP = ("six", "platformdirs")

_WRITER = """
import os, sys
path, block = sys.argv[1], b"x" * 2**20
while True:
    with open(path, "wb") as f:
        for _ in range(int(sys.argv[2])):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
"""


@contextlib.contextmanager
def disk_load(directory: Path, mib: int) -> Iterator[None]:
    """While inside: a process writing and fsyncing ``mib`` MiB files in ``directory``, one after another."""
    if mib <= 0:
        yield
        return
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(directory / "disk-load"), str(mib)])
    try:
        yield
    finally:
        writer.kill()
        writer.wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / "disk-load")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="*", default=[f"now={HERE.parent}"])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--rtt-ms", type=float, default=40.0)
    ap.add_argument("--gateway-rtt-ms", type=float, default=0.0)
    ap.add_argument("--disk-load", type=int, default=0, metavar="MIB")
    ap.add_argument("--warm-up", action="store_true")
    args = ap.parse_args()
    trees = {}
    for spec in args.trees:
        name, _, rest = spec.partition("=")
        tree, _, setting = rest.partition(":")
        trees[name] = (tree, dict([setting.split("=", 1)]) if setting else {})
    index = Index(load(fetch_corpus(lambda s: print(s, file=sys.stderr))), args.rtt_ms / 1000)
    cold: dict[str, list[float]] = {name: [] for name in ["direct", *trees]}
    warm: dict[str, list[float]] = {name: [] for name in ["direct", *trees]}
    cpu: dict[str, list[float]] = {name: [] for name in trees}  # the gateway's and edge's, per cold install
    with tempfile.TemporaryDirectory(prefix="bench-uvab-") as tmp:
        work = Path(tmp)
        clients = Path(tempfile.mkdtemp(prefix="bench-uvab-", dir="/dev/shm" if Path("/dev/shm").is_dir() else tmp))
        with disk_load(work, args.disk_load):
            try:
                for r in range(args.rounds):
                    cold["direct"].append(install("uv", index.url, clients / "target", clients)[0])
                    warm["direct"].append(cold["direct"][-1])
                    for name, (tree, setting) in trees.items():
                        setup = Tufproxy(index, work / name, env={"PYTHONPATH": tree, **setting})
                        if args.gateway_rtt_ms:
                            setup.gateway_via = lambda gw: f"{Tap(gw.rstrip('/'), 'gw', [], [0.0], args.gateway_rtt_ms / 1000).url}/"  # type: ignore[method-assign]
                        setup.fresh()
                        try:
                            if args.warm_up:  # processes up and running, these projects never asked for
                                install("uv", setup.url, clients / "target", clients, WARM_UP)
                            before = sum(_cpu_seconds(server) for server in setup.servers)
                            cold[name].append(install("uv", setup.url, clients / "target", clients)[0])
                            cpu[name].append(sum(_cpu_seconds(server) for server in setup.servers) - before)
                            warm[name].append(install("uv", setup.url, clients / "target", clients)[0])
                        finally:
                            setup.stop()
                    print(f"round {r + 1}: " + ", ".join(f"{n} {c[-1]:.3f}" for n, c in cold.items()), file=sys.stderr)
            finally:
                shutil.rmtree(clients, ignore_errors=True)
    direct = statistics.median(cold["direct"])
    apart = f", the gateway after {args.gateway_rtt_ms:g} ms" if args.gateway_rtt_ms else ""
    apart += f", {args.disk_load} MiB files written and fsynced beside them" if args.disk_load else ""
    apart += f", each edge and gateway warmed up first by an install of {' '.join(WARM_UP)}" if args.warm_up else ""
    print(f"uv installs, {args.rounds} rounds, index answering after {args.rtt_ms:g} ms{apart}; "
          "median seconds (ratio to direct)")
    for name in cold:
        c, w = statistics.median(cold[name]), statistics.median(warm[name])
        print(f"{name:8} cold {c:.3f} ({c / direct:.2f}x)  warm {w:.3f} ({w / direct:.2f}x)  "
              f"cold each: {' '.join(f'{x:.3f}' for x in sorted(cold[name]))}")
    print("CPU seconds of the gateway and edge per cold install, median: "
          + ", ".join(f"{name} {statistics.median(cpu[name]):.2f}" for name in trees))
    # Round against round: load drifting over a run weighs on both figures of a round alike.
    first, *others = trees
    for name in others:
        for what, figures, unit in (("cold", cold, "s"), ("CPU", cpu, "CPU s")):
            diffs = [b - a for a, b in zip(figures[first], figures[name], strict=True)]
            print(f"{name} - {first}, {what}, round by round: median {statistics.median(diffs):+.3f} {unit}, "
                  f"{name} lower in {sum(d < 0 for d in diffs)} of {len(diffs)} rounds")


if __name__ == "__main__":
    main()
