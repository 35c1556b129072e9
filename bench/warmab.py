"""A/B the warm path: tufproxy trees (and nginx) side by side, round-robin, in one run.

Each contender serves the bench corpus (``bench/corpus.py``); each round
measures, for each: warm index pages with wrk at 1, 16 and 64 connections
(req/s, p99), the server's CPU time per page request (utime + stime of its
process tree / requests: much less sensitive to other load than req/s), the
16 MB wheel over 8 connections (MB/s) and the large wheel with curl (MB/s).
Prints medians and ratios to nginx.

Usage: ``python bench/warmab.py NAME=DIR[:ENV=VALUE...],...,nginx [--rounds 3] [--seconds 2]``,
e.g. ``before=/tmp/before,after=.,asyncio=.:TUFPROXY_UVLOOP=no,nginx`` (DIR: a
tufproxy tree, e.g. ``git archive <commit> proxy | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import contenders as C  # noqa: E402
import corpus as corpus_mod  # noqa: E402
import measure as M  # noqa: E402
import run as R  # noqa: E402

KEYS = ("rps_1", "rps_16", "rps_64", "p99_64", "cpu_us_1", "cpu_us_16", "cpu_us_64", "mid", "large")


def _cpu_seconds(server: C.Server) -> float:
    return sum(C.cpu_times(server.proc.pid))


def _start(spec: str, upstream: C.Upstream, corp: corpus_mod.Corpus, work: Path) -> tuple[str, C.Contender]:
    if spec == "nginx":
        contender: C.Contender = C.NginxCache(upstream, corp, work / "nginx")
        contender.fresh()
        return "nginx", contender
    name, _, rest = spec.partition("=")
    src, *env = rest.split(":")
    saved = dict(os.environ)
    os.environ.update(dict(e.split("=", 1) for e in env))
    try:
        contender = C.Tufproxy(upstream, corp, work / name, Path(src).resolve())
        contender.fresh()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return name, contender


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("contenders", help="comma-separated NAME=DIR[:ENV=VALUE...] or nginx")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    corp = corpus_mod.build(HERE / ".cache", log=lambda m: None)
    mid = next((corp.public_dir / "packages" / R.MID_PROJECT).glob(f"{R.MID_PROJECT}-1.0-*.whl"))
    samples: dict[tuple[str, str], list[float]] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tufproxy-warmab-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        upstream = C.Upstream(corp.public_dir, work / "upstream")
        running: dict[str, C.Contender] = {}
        try:
            for spec in args.contenders.split(","):
                name, c = _start(spec, upstream, corp, work)
                running[name] = c
            urls = {}
            for name, c in running.items():
                for p in corp.projects:
                    C.http_get(c.page_url(p))
                mid_url, large_url = c.file_url(R.MID_PROJECT, mid.name), c.file_url(corpus_mod.LARGE_PROJECT, corp.large_file)
                M.curl_file(mid_url, mid.stat().st_size)
                M.curl_file(large_url, corp.large_size)
                base = f"{urlsplit(c.index_url).scheme}://{urlsplit(c.index_url).netloc}"
                urls[name] = (base, [urlsplit(c.page_url(p)).path for p in corp.projects], mid_url, large_url)
            for _ in range(args.rounds):
                for name, c in running.items():
                    base, paths, mid_url, large_url = urls[name]
                    add = lambda key, value, name=name: samples.setdefault((name, key), []).append(value)  # noqa: E731
                    for conns in R.CONCURRENCY:
                        assert c.server is not None
                        before = _cpu_seconds(c.server)
                        load = M.wrk_pages(base, paths, conns, args.seconds, work)
                        add(f"cpu_us_{conns}", (_cpu_seconds(c.server) - before) / (load.rps * max(1, round(args.seconds))) * 1e6)
                        add(f"rps_{conns}", load.rps)
                        add(f"p99_{conns}", load.p99_ms)
                    add("mid", M.wrk_file(mid_url, mid.stat().st_size, R.MID_CONNECTIONS, args.seconds))
                    add("large", corp.large_size / 1e6 / M.curl_file(large_url, corp.large_size))
        finally:
            for c in running.values():
                c.stop()
            upstream.stop()
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"load average {'/'.join(f'{v:.2f}' for v in load_before)} -> {'/'.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"{args.rounds} rounds of {args.seconds:g} s; medians (mid: 16 MB wheel x{R.MID_CONNECTIONS}, MB/s)")
    print(f"{'':16}" + "".join(f"{k:>11}" for k in KEYS))
    for name in running:
        print(f"{name:16}" + "".join(f"{med[(name, k)]:>11.1f}" for k in KEYS))
    if "nginx" in running:
        for name in running:
            print(f"{name + ' / nginx':16}" + "".join(f"{med[(name, k)] / med[('nginx', k)]:>11.2f}" for k in KEYS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
