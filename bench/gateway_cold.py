"""A big file cold through edge -> gateway, beside nginx proxy_cache cold, from one index (issue 33, item 5).

A local index (``bench/install.py``'s, in this process, no added delay)
lists one project whose only file is a wheel holding ``--mb`` MiB of random
bytes, written as a Python bytes literal, so the wheel is larger (287 MB for
200), built once into ``bench/.cache/gateway_cold/``.  Each round, in turn:

* **floor**: the file straight from the index, read to the end;
* **nginx**: a fresh nginx ``proxy_cache`` (1 worker) in front of the index,
  the file asked through it once (cold: fetched, stored, sent);
* **tufproxy**: a fresh ``tufproxy gateway`` and a ``tufproxy serve`` edge
  in front of it; the project's page asked first (untimed: the miss that
  publishes it), then the file once, cold in both;
* **tufproxy gateway alone**: the same gateway asked directly (one hop), to
  tell the hops' shares apart.

The index writes a body over 1 MiB in 1 MiB pieces, as a server streams a
file (until 2026-12-07 it wrote the whole body at once: asyncio then
copied all but the first few MB into its buffer, a stall of about 0.35 s
at the start of every path's transfer, the floor's too, which flattered
every ratio to it).

Each is read to the end with one client (``curl -o /dev/null``); medians of
``--rounds``.  For the tufproxy paths the bench also takes each server's CPU
time (user and system, its process and workers, from ``/proc``) around the
transfer: the steadier figure on a shared machine, whose walls move with
the kernel's writeback of earlier rounds' files.  The figure is the speed ratio nginx / tufproxy (the issue's
goal: at least 0.66).  ``--tree NAME=DIR`` (repeatable) runs the tufproxy
tree at ``DIR`` (put first on ``PYTHONPATH``, as bench/uvab.py does) under
that name, each in turn within every round: an A/B in one run; ``:VAR=VALUE``
after ``DIR`` sets an environment variable for that tree's servers.

    python bench/gateway_cold.py [--mb 200] [--rounds 5] [--tree NAME=DIR[:VAR=VALUE...] ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from contenders import Server, _nginx_conf, cpu_times, free_port, nginx_argv  # noqa: E402
from install import GatewayOnly, Index, Tufproxy, load  # noqa: E402

from proxy.repository.sample import build_wheel  # noqa: E402

CACHE = HERE / ".cache" / "gateway_cold"


def big_wheel(mb: int) -> Path:
    """A wheel holding ``mb`` MiB of random bytes (which do not compress), built once."""
    found = sorted(CACHE.glob(f"bigcold-{mb}.0-*.whl"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    return build_wheel(CACHE, "bigcold", f"{mb}.0", payload=os.urandom(mb << 20))


def curl(url: str) -> float:
    """Seconds to read ``url`` to its end, as curl counts them (which fails the run on an HTTP error).

    curl's own count: the time until ``subprocess.run`` (with a timeout) sees the process end comes in
    steps of up to 50 ms, its polling interval."""
    done = subprocess.run(["curl", "-sSf", "-o", "/dev/null", "-w", "%{time_total}", url], check=True, timeout=600,
                          capture_output=True, text=True)
    return float(done.stdout)


class Nginx:
    """A fresh nginx proxy_cache in front of the index."""

    def __init__(self, index: Index, workdir: Path) -> None:
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        port = free_port()
        conf = _nginx_conf(workdir, port, f"""
  proxy_cache_path {workdir}/cache levels=1:2 keys_zone=pkgs:10m max_size=10g inactive=1d use_temp_path=off;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://127.0.0.1:{index.port};
      proxy_http_version 1.1;
      proxy_cache pkgs;
      proxy_cache_valid 200 1d;
    }}
  }}""")
        self.server = Server("nginx", nginx_argv(conf, workdir), workdir, f"http://127.0.0.1:{port}/simple/")
        self.base = f"http://127.0.0.1:{port}/"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR[:VAR=VALUE...]",
                    help="a tufproxy tree to run under NAME, with these environment settings for its servers "
                         "(default: this one, as 'tufproxy')")
    args = ap.parse_args()
    trees: dict[str, dict[str, str]] = {}
    for name, _, rest in (t.partition("=") for t in args.tree):
        tree, *settings = rest.split(":")
        trees[name] = {"PYTHONPATH": str(Path(tree).resolve()), **dict(s.split("=", 1) for s in settings)}
    trees = trees or {"tufproxy": {}}
    wheel = big_wheel(args.mb)
    projects = load([wheel])
    [dist] = projects["bigcold"]
    index = Index(projects, 0.0)
    times: dict[str, list[float]] = {"floor": [], "nginx": [], **{name: [] for name in trees}}
    # (path, server) -> (user, system) seconds per transfer
    cpus: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-gateway-cold-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)  # nginx's worker runs as another user when we are root
        for r in range(args.rounds):
            times["floor"].append(curl(f"http://127.0.0.1:{index.port}/files/{dist.filename}"))
            nginx = Nginx(index, work / "nginx")
            try:
                times["nginx"].append(curl(f"{nginx.base}files/{dist.filename}"))
            finally:
                nginx.server.stop()
            for name, env in trees.items():
                for label, setup in ((name, Tufproxy), (f"{name} gateway alone", GatewayOnly)):
                    chain = setup(index, work / "tufproxy", env)
                    chain.fresh()
                    try:
                        curl(f"{chain.url}bigcold/")  # the miss that publishes the page: not timed
                        before = [cpu_times(server.proc.pid) for server in chain.servers]
                        times.setdefault(label, []).append(
                            curl(f"{chain.url.removesuffix('simple/')}packages/bigcold/{dist.filename}"))
                        for server, (u0, s0) in zip(chain.servers, before, strict=True):
                            u1, s1 = cpu_times(server.proc.pid)
                            if u1 + s1 > u0 + s0:  # not the edge the gateway-alone path leaves idle
                                cpus.setdefault((label, server.name), []).append((u1 - u0, s1 - s0))
                    finally:
                        chain.stop()
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), file=sys.stderr)
    med = {k: statistics.median(v) for k, v in times.items()}
    size = len(dist.data) / 1e6
    print(f"# A {size:.0f} MB file cold: edge -> gateway beside nginx proxy_cache ({time.strftime('%Y-%m-%d')})\n")
    given = "".join(f" --tree {t}" for t in args.tree)
    print(f"`python bench/gateway_cold.py --mb {args.mb} --rounds {args.rounds}{given}`; load average at the end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; one client (curl); medians.\n")
    print("| path | median (s) | MB/s | all rounds (s) |\n|---|---:|---:|---|")
    for k, v in times.items():
        print(f"| {k} | {med[k]:.2f} | {size / med[k]:.0f} | {' '.join(f'{x:.2f}' for x in v)} |")
    print("\nCPU seconds per transfer, user + system (medians of each):\n\n| path | server | user | system | total |"
          "\n|---|---|---:|---:|---:|")
    for (label, server), spent in cpus.items():
        user, system = (statistics.median(x[i] for x in spent) for i in (0, 1))
        total = statistics.median(u + s for u, s in spent)
        print(f"| {label} | {server} | {user:.2f} | {system:.2f} | {total:.2f} |")
    for name in trees:
        print(f"\nspeed ratio nginx / {name}: **{med['nginx'] / med[name]:.2f}** (goal >= 0.66); the gateway alone "
              f"(one hop): {med['nginx'] / med[f'{name} gateway alone']:.2f}")


if __name__ == "__main__":
    main()
