"""A/B the cold large file: tufproxy trees beside the floor, round-robin, in one run.

The scenario is run.py's "large file cold" alone: the corpus's largest
wheel (212 MB) through a proxy with an empty cache, ``curl -o /dev/null``
wall seconds, beside the floor (the same file straight from the upstream,
sha256-hashed as it arrives, ``measure.download_and_hash``).  Each round
measures the floor and then each tree on a fresh cache, so every ratio
compares figures taken under the same load.  Besides wall time it reports
the CPU seconds the proxy's process tree spent on the fetch (utime +
stime): on a shared 2-core machine the sum of what must run (receive,
every signed hash, write, send) bounds the wall time from below.

Usage: ``python bench/coldab.py NAME=DIR[:ENV=VALUE...],... [--rounds 5] [--workers 2]``,
e.g. ``before=/tmp/before,after=.`` (DIR: a tufproxy tree, e.g.
``git archive <commit> proxy | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import contenders as C  # noqa: E402
import corpus as corpus_mod  # noqa: E402
import measure as M  # noqa: E402
from warmab import _cpu_seconds  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("contenders", help="comma-separated NAME=DIR[:ENV=VALUE...]")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2, help="tufproxy --workers (run.py uses 2)")
    args = parser.parse_args()
    corp = corpus_mod.build(HERE / ".cache", log=lambda m: None)
    large = corp.public_dir / "packages" / corpus_mod.LARGE_PROJECT / corp.large_file
    sha = M.sha256_of(large)
    specs = [s.partition("=") for s in args.contenders.split(",")]
    wall: dict[str, list[float]] = {"floor": []}
    cpu: dict[str, list[float]] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tufproxy-coldab-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        upstream = C.Upstream(corp.public_dir, work / "upstream")
        try:
            url = f"{upstream.url}packages/{corpus_mod.LARGE_PROJECT}/{corp.large_file}"
            for _ in range(args.rounds):
                wall["floor"].append(M.download_and_hash(url, sha))
                for name, _, rest in specs:
                    src, *env = rest.split(":")
                    saved = dict(os.environ)
                    os.environ.update(dict(e.split("=", 1) for e in env))
                    proxy = C.Tufproxy(upstream, corp, work / name, Path(src).resolve())
                    proxy.extra_args = ("--workers", str(args.workers))
                    try:
                        proxy.fresh()
                        link = proxy.file_url(corpus_mod.LARGE_PROJECT, corp.large_file)  # the page only
                        assert proxy.server is not None
                        before = _cpu_seconds(proxy.server)
                        wall.setdefault(name, []).append(M.curl_file(link, corp.large_size))
                        cpu.setdefault(name, []).append(_cpu_seconds(proxy.server) - before)
                    finally:
                        proxy.stop()
                        os.environ.clear()
                        os.environ.update(saved)
        finally:
            upstream.stop()
    floor = statistics.median(wall["floor"])
    print(f"load average {'/'.join(f'{v:.2f}' for v in load_before)} -> {'/'.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"{args.rounds} rounds, cold {corp.large_size / 1e6:.0f} MB wheel, tufproxy --workers {args.workers}; medians")
    print(f"{'':12}{'wall (s)':>10}{'x floor':>9}{'proxy CPU (s)':>15}   all walls")
    for name, values in wall.items():
        med = statistics.median(values)
        used = f"{statistics.median(cpu[name]):>15.2f}" if name in cpu else f"{'':>15}"
        print(f"{name:12}{med:>10.2f}{med / floor:>9.2f}{used}   {' '.join(f'{v:.2f}' for v in values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
