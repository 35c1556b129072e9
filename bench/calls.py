"""Python calls per warm page hit: a deterministic measure of the warm path's per-request work.

Runs ``tufproxy serve --workers 1`` from each given tree under a small
wrapper that counts Python and C calls (``sys.setprofile``) between SIGUSR1
and SIGUSR2, warms every project page of the bench corpus, then counts N
keep-alive page requests.  Noise-free where req/s on a shared machine is not.

Usage: ``python bench/calls.py NAME=DIR[:EXTRA_ARG...] ... [--requests 500] [--top 0]``,
e.g. ``before=/tmp/before after=. uvloop=.:--uvloop:yes``.
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import contenders as C  # noqa: E402
import corpus as corpus_mod  # noqa: E402

# Runs ``python -m proxy ARGS`` counting calls between SIGUSR1 and SIGUSR2 (then writes CALLS_OUT).
_WRAPPER = """
import collections, os, runpy, signal, sys
counts = collections.Counter()
def prof(frame, event, arg):
    if event == "call":
        counts[f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"] += 1
    elif event == "c_call":
        counts[f"C:{getattr(arg, '__qualname__', arg)}"] += 1
def start(*_):
    counts.clear()
    sys.setprofile(prof)
def stop(*_):
    sys.setprofile(None)
    out = os.environ["CALLS_OUT"]
    with open(out + ".tmp", "w") as f:
        f.write(f"{sum(counts.values())}\\n")
        f.writelines(f"{n} {name}\\n" for name, n in counts.most_common(60))
    os.replace(out + ".tmp", out)
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
sys.argv = ["proxy", *sys.argv[1:]]
runpy.run_module("proxy", run_name="__main__")
"""
_DEADLINE = 60.0


def count(name: str, src: Path, extra: list[str], corp: corpus_mod.Corpus, n: int, top: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tufproxy-calls-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        wrapper = work / "wrapper.py"
        wrapper.write_text(_WRAPPER)
        upstream = C.Upstream(corp.public_dir, work / "upstream")
        port = C.free_port()
        out = work / "calls"
        argv = [sys.executable, str(wrapper), "serve", "--upstream", upstream.url, "--root", str(corp.root_file),
                "--cache-dir", str(work / "cache"), "--listen", f"127.0.0.1:{port}", "--log-level", "warning",
                "--refresh-interval", "600", "--workers", "1", *extra]
        server = C.Server(name, argv, work, f"http://127.0.0.1:{port}/readyz",
                          env={"PYTHONPATH": str(src), "CALLS_OUT": str(out)})
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            paths = [f"/simple/{p}/" for p in corp.projects]

            def get(path: str) -> int:
                conn.request("GET", path, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
                response = conn.getresponse()
                response.read()
                return response.status

            if any(get(p) != 200 for p in paths):
                raise SystemExit(f"{name}: a page did not answer 200")
            os.kill(server.proc.pid, signal.SIGUSR1)
            get(paths[0])  # the signal is handled by the time this is answered
            os.kill(server.proc.pid, signal.SIGUSR1)  # start again: only the N below count
            get(paths[0])
            os.kill(server.proc.pid, signal.SIGUSR1)
            for i in range(n):
                get(paths[i % len(paths)])
            os.kill(server.proc.pid, signal.SIGUSR2)
            get(paths[0])  # handled after the signal: the count is written
            deadline = time.monotonic() + _DEADLINE
            while not out.exists():
                if time.monotonic() > deadline:
                    raise SystemExit(f"{name}: no count written")
                time.sleep(0.05)
            total, *rows = out.read_text().splitlines()
            print(f"{name}: {int(total) / n:.0f} Python calls per warm page hit ({n} requests)")
            for row in rows[:top]:
                calls, what = row.split(" ", 1)
                print(f"  {int(calls) / n:7.2f}  {what}")
        finally:
            server.stop()
            upstream.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", help="NAME=DIR[:EXTRA_ARG...]")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--top", type=int, default=0, help="also list the N most called functions")
    args = parser.parse_args()
    corp = corpus_mod.build(HERE / ".cache", log=lambda m: None)
    for spec in args.trees:
        name, _, rest = spec.partition("=")
        src, *extra = rest.split(":")
        count(name, Path(src).resolve(), extra, corp, args.requests, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
