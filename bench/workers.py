"""Benchmark ``tufproxy serve --workers N``: warm index req/s and warm file MB/s at 1, 2 and 4 workers.

One run builds a signed repository (the sample dependency chain plus one
8 MiB wheel), serves it with ``--repository`` (no upstream on the path,
so only the proxy is measured), warms every worker, then drives each
setting with ``wrk`` (a C load generator: a Python client would use
more CPU than the proxy it measures).  All figures come from one run, on
one machine, so the scaling ratio is meaningful; the load generator runs
on the same cores, which caps what N workers can show on a small box.

Usage: ``python3 bench/workers.py [--seconds 5] [--workers 1 2 4]``.
Needs ``wrk`` on PATH.  Not run by the tests.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from tests.conftest import make_sample_dists
from tests.support.net import free_port, wait_for_port

BIG = 8 * 2**20
CONNECTIONS = 32


def _wrk(url: str, seconds: float, threads: int) -> tuple[float, float]:
    """(requests/s, MiB/s) for ``url``."""
    out = subprocess.run(["wrk", f"-t{threads}", f"-c{CONNECTIONS}", f"-d{seconds:g}s", url],
                         capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    amount, unit = re.search(r"Transfer/sec:\s+([\d.]+)(\w+)", out).groups()
    mib = float(amount) * {"B": 2**-20, "KB": 2**-10, "MB": 1, "GB": 2**10}[unit]
    if re.search(r"Non-2xx or 3xx responses", out):
        raise RuntimeError(f"wrk saw errors for {url}:\n{out}")
    return rps, mib


def _serve(repo: Repository, cache: Path, workers: int) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--repository", str(repo.public_dir),
                             "--cache-dir", str(cache), "--listen", f"127.0.0.1:{port}", "--workers", str(workers),
                             "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    proc.stdout.readline()  # "tufproxy serving on ...": every worker is ready
    wait_for_port(port, proc)
    return proc, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--wrk-threads", type=int, default=1)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("bench/workers.py needs wrk on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        repo = Repository.init(base / "repo", bins=16)
        big = build_wheel(base / "dists", "big", "1.0", payload=os.urandom(BIG))
        repo.add([*make_sample_dists(base / "dists"), big])
        page = "simple/lib/"
        file = f"packages/big/{big.name}"
        print(f"{os.cpu_count()} CPUs; wrk -t{args.wrk_threads} -c{CONNECTIONS} -d{args.seconds:g}s; "
              f"warm page /{page}, warm file {BIG >> 20} MiB")
        print(f"{'workers':>7}  {'index req/s':>11}  {'x1':>5}  {'file MiB/s':>10}  {'x1':>5}")
        first: tuple[float, float] | None = None
        for n in args.workers:
            proc, port = _serve(repo, base / f"cache-{n}", n)
            try:
                url = f"http://127.0.0.1:{port}/"
                urllib.request.urlopen(url + file).read()  # cold fetch, then every worker warms below
                _wrk(url + page, 1, args.wrk_threads)
                _wrk(url + file, 1, args.wrk_threads)
                rps, _ = _wrk(url + page, args.seconds, args.wrk_threads)
                _, mib = _wrk(url + file, args.seconds, args.wrk_threads)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
            first = first or (rps, mib)
            print(f"{n:>7}  {rps:>11.0f}  {rps / first[0]:>5.2f}  {mib:>10.0f}  {mib / first[1]:>5.2f}", flush=True)


if __name__ == "__main__":
    main()
