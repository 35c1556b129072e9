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
``--rounds``.  Before each path's transfer the bench writes and deletes a file
of the size that path will write (:func:`recycle_pages`: on this virtual
machine a page never used since it went back to the host costs about ten
times more to write into).  For every path the bench also takes the CPU time
(user and system) each part spent on the transfer: the index (this process),
curl, and each server (its process and workers, from ``/proc``). Their sum is
what the path costs the machine's cores, a steadier figure than the wall on a
shared machine.  The figure is the speed ratio nginx / tufproxy (the issue's
goal: at least 0.66).  ``--tree NAME=DIR`` (repeatable) runs the tufproxy
tree at ``DIR`` (put first on ``PYTHONPATH``, as bench/uvab.py does) under
that name, each in turn within every round: an A/B in one run; ``:VAR=VALUE``
after ``DIR`` sets an environment variable for that tree's servers.

    python bench/gateway_cold.py [--mb 200] [--rounds 5] [--tree NAME=DIR[:VAR=VALUE...] ...]
"""

from __future__ import annotations

import argparse
import os
import resource
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


def recycle_pages(work: Path, nbytes: int) -> None:
    """Let the next ``nbytes`` written into the page cache land in pages that were in use a moment ago.

    This machine is a virtual machine that hands free memory back to its host (free page reporting): a page
    the kernel takes from that pool costs a fault in the host on its first touch. Writing 287 MB into a new
    file took 0.07-0.10 s when a file of that size had just been deleted, and 0.67 s into reported pages
    (``bench/results/gateway_cold.md``). Which one a path got depended on what the bench had just freed:
    nginx's setup deleted its previous round's cache, the tufproxy setups moved theirs aside. So before each
    path's transfer the bench writes and deletes a file of the size that path will write, as on a server
    whose page cache is full and reclaims its old pages for new files."""
    ballast = work / "ballast"
    piece = bytes(1 << 20)
    with ballast.open("wb") as out:
        for _ in range(-(-nbytes // len(piece))):
            out.write(piece)
    ballast.unlink()


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
    # (path, part) -> (user, system) seconds per transfer
    cpus: dict[tuple[str, str], list[tuple[float, float]]] = {}

    def transfer(label: str, url: str, servers: list[tuple[str, int]]) -> None:
        """Time one read of ``url`` under ``label``, with the CPU each part spent on it."""
        before = [cpu_times(pid) for _, pid in servers]
        ours, kids = os.times(), resource.getrusage(resource.RUSAGE_CHILDREN)
        times.setdefault(label, []).append(curl(url))
        now, done = os.times(), resource.getrusage(resource.RUSAGE_CHILDREN)
        spent = {"index": (now.user - ours.user, now.system - ours.system),
                 "curl": (done.ru_utime - kids.ru_utime, done.ru_stime - kids.ru_stime)}
        for (name, pid), (u0, s0) in zip(servers, before, strict=True):
            u1, s1 = cpu_times(pid)
            if u1 + s1 > u0 + s0:  # not the edge the gateway-alone path leaves idle
                spent[name] = (u1 - u0, s1 - s0)
        for part, figures in spent.items():
            cpus.setdefault((label, part), []).append(figures)

    with tempfile.TemporaryDirectory(prefix="bench-gateway-cold-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)  # nginx's worker runs as another user when we are root
        for r in range(args.rounds):
            transfer("floor", f"http://127.0.0.1:{index.port}/files/{dist.filename}", [])
            nginx = Nginx(index, work / "nginx")
            try:
                recycle_pages(work, len(dist.data))
                transfer("nginx", f"{nginx.base}files/{dist.filename}", [("nginx", nginx.server.proc.pid)])
            finally:
                nginx.server.stop()
            for name, env in trees.items():
                for label, setup in ((name, Tufproxy), (f"{name} gateway alone", GatewayOnly)):
                    chain = setup(index, work / "tufproxy", env)
                    chain.fresh()
                    try:
                        curl(f"{chain.url}bigcold/")  # the miss that publishes the page: not timed
                        recycle_pages(work, len(dist.data) * len(chain.servers))
                        transfer(label, f"{chain.url.removesuffix('simple/')}packages/bigcold/{dist.filename}",
                                 [(server.name, server.proc.pid) for server in chain.servers])
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
    print("\nCPU seconds per transfer, user + system (medians of each; index: the bench's own process, which serves "
          "the file):\n\n| path | part | user | system | total |"
          "\n|---|---|---:|---:|---:|")
    for (label, server), spent in cpus.items():
        user, system = (statistics.median(x[i] for x in spent) for i in (0, 1))
        total = statistics.median(u + s for u, s in spent)
        print(f"| {label} | {server} | {user:.2f} | {system:.2f} | {total:.2f} |")
    for label in times:
        whole = sum(statistics.median(u + s for u, s in spent) for (path, _), spent in cpus.items() if path == label)
        print(f"| {label} | all (sum of the medians) | | | {whole:.2f} |")
    for name in trees:
        print(f"\nspeed ratio nginx / {name}: **{med['nginx'] / med[name]:.2f}** (goal >= 0.66); the gateway alone "
              f"(one hop): {med['nginx'] / med[f'{name} gateway alone']:.2f}")


if __name__ == "__main__":
    main()
