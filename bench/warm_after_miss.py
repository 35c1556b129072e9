"""The warm requests after a cold miss through edge -> gateway, each on a new connection, by edge workers (issue 33).

``bench/install.py``'s phases table shows "the same page again (warm)" at
about one index round trip, where a warm page costs a keep-alive client
about a millisecond.  This asks why: ``bench/install.py``'s index and setup
(a fresh gateway and edge), one cold page miss, then the same page again
``--asks`` times, each on a new connection, with the edge at one worker
(``TUFPROXY_WORKERS=1``; the gateway runs one by default anyway) and at its
default, one per CPU, as ``bench/install.py`` runs it; ``--rounds`` times
each.  A new connection may reach an edge worker other than the one
that served the miss, which has not yet trusted the metadata the miss
signed: its first request for the page pays that worker's own refresh.

    python bench/warm_after_miss.py [--rounds 5] [--asks 6] [--rtt-ms 40]

Prints milliseconds per request: the cold miss, then each warm ask (median
over the rounds, and the slowest).
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from install import Index, Tufproxy, fetch_corpus, load  # noqa: E402


def _ask(port: int, path: str) -> float:
    """Seconds for one GET of ``path`` (JSON) on a new connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    started = time.monotonic()
    try:
        conn.request("GET", path, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        response = conn.getresponse()
        response.read()
        assert response.status == 200, (path, response.status)
        return time.monotonic() - started
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--asks", type=int, default=6)
    ap.add_argument("--rtt-ms", type=float, default=40.0, help="delay before every index answer (default 40)")
    args = ap.parse_args()
    projects = load(fetch_corpus(lambda s: print(s, file=sys.stderr)))
    index = Index(projects, args.rtt_ms / 1000)
    names = sorted(projects)
    print(f"`python bench/warm_after_miss.py --rounds {args.rounds} --asks {args.asks} --rtt-ms {args.rtt_ms:g}`: "
          "milliseconds, median of the rounds (slowest in brackets)\n")
    print("| edge workers | cold miss | " + " | ".join(f"warm {i + 1}" for i in range(args.asks)) + " |")
    print("|---:|---:|" + "---:|" * args.asks)
    with tempfile.TemporaryDirectory(prefix="bench-warm-after-miss-") as tmp:
        for label, env in (("1", {"TUFPROXY_WORKERS": "1"}), (f"{os.cpu_count()} (its default)", {})):
            rows: list[list[float]] = []
            for r in range(args.rounds):
                setup = Tufproxy(index, Path(tmp) / f"w{len(env)}-{r}", env=env)
                setup.fresh()
                try:
                    port = int(setup.url.split(":")[2].split("/")[0])
                    path = f"/simple/{names[r % len(names)]}/"
                    rows.append([_ask(port, path) for _ in range(args.asks + 1)])
                finally:
                    setup.stop()
            cells = [f"{1000 * statistics.median(c):.1f} ({1000 * max(c):.1f})" for c in zip(*rows, strict=True)]
            print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
