"""Warm pip and uv installs through edge -> gateway beside proxpi and devpi: trees A/B'd in one run (issue 33).

``bench/install.py``'s local index, setups and install command.  Each
contender is started once and warmed (one pip and one uv install); then
every round runs a warm pip install and a warm uv install (new client, no
client cache) against each contender in turn, so that load drifting on a
shared machine weighs on all alike.  Prints the median and quartiles of
each, and the ratio to the first contender.  Warm installs differ by a few
percent between servers, less than one round's spread: hence many rounds
in one run rather than ``bench/install.py``'s five.

    python bench/warm_installs.py [NAME=DIR[:VAR=VALUE...] ...] [proxpi] [devpi] [--rounds 12] [--rtt-ms 40]

``NAME=DIR[:VAR=VALUE...]``: a tufproxy tree put first on ``PYTHONPATH``
for its servers (``git archive <commit> proxy | tar -x -C DIR``), with
those environment settings (``TUFPROXY_WORKERS=1``); default
``now=<this tree> proxpi devpi``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from install import Devpi, Index, Proxpi, Setup, Tufproxy, fetch_corpus, install, load  # noqa: E402

PEERS: dict[str, type[Setup]] = {"proxpi": Proxpi, "devpi": Devpi}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("contenders", nargs="*", default=[f"now={HERE.parent}", "proxpi", "devpi"])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--rtt-ms", type=float, default=40.0)
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be at least 2 (the quartiles need two figures)")
    index = Index(load(fetch_corpus(lambda s: print(s, file=sys.stderr))), args.rtt_ms / 1000)
    setups: dict[str, Setup] = {}
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        work = Path(tmp)
        clients = Path(tempfile.mkdtemp(prefix="bench-warm-", dir="/dev/shm" if Path("/dev/shm").is_dir() else tmp))
        try:
            for spec in args.contenders:
                name, _, tree = spec.partition("=")
                if tree:  # a tufproxy tree, which its servers import, and environment settings for them
                    tree, *settings = tree.split(":")
                    setup: Setup = Tufproxy(index, work / name, env={"PYTHONPATH": tree,
                                                                     **dict(v.split("=", 1) for v in settings)})
                elif name in PEERS:
                    setup = PEERS[name](index, work / name)
                else:
                    ap.error(f"not NAME=DIR, proxpi or devpi: {spec}")
                setups[name] = setup
                setup.fresh()
                for client in ("pip", "uv"):
                    install(client, setup.url, clients / "target", clients)
            for r in range(args.rounds):
                for name, setup in setups.items():
                    for client in ("pip", "uv"):
                        times.setdefault((client, name), []).append(
                            install(client, setup.url, clients / "target", clients)[0])
                print(f"round {r + 1}: " + ", ".join(f"{c} {n} {t[-1]:.3f}" for (c, n), t in times.items()),
                      file=sys.stderr)
        finally:
            for setup in setups.values():
                setup.stop()
            shutil.rmtree(clients, ignore_errors=True)
    first = next(iter(setups))
    print(f"warm installs, {args.rounds} rounds, index answering after {args.rtt_ms:g} ms; "
          f"seconds: median [quartiles] (ratio of medians to {first})")
    for client in ("pip", "uv"):
        for name in setups:
            t = sorted(times[(client, name)])
            q = statistics.quantiles(t, n=4)
            ratio = statistics.median(t) / statistics.median(times[(client, first)])
            print(f"{client:3} {name:8} {statistics.median(t):.3f} [{q[0]:.3f}-{q[2]:.3f}] ({ratio:.2f})")


if __name__ == "__main__":
    main()
