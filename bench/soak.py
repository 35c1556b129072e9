"""Soak: edge -> gateway under steady mixed load, then under each connection flood of issue 38.

One run on 127.0.0.1: the test index (tests/support/testindex.py) serving
real wheels, a gateway and an edge (``serve --profile gateway``) as
subprocesses, each with ``--max-connections 512``.  A steady load (pages,
wheels and missing names through the edge, ``--clients`` threads) runs
throughout; each phase then adds a flood against the edge and the gateway
at once:

* ``steady``: the load alone (the peer every other phase is compared with);
* ``idle-reopen``: ``--flood`` idle connections to each process, re-opened as they are closed;
* ``slowloris``: ``--flood`` connections to each dripping a header line every 0.5 s;
* ``idle-keepalive``: ``--flood`` connections to each that asked once and stay open.

Sampled every second: RSS, descriptors and threads of both processes, the
edge's cache size, the load's latency (p50, p99) and errors, and how many
bytes each process logged.  Prints a Markdown table; ``--out`` writes it.

Usage: ``python bench/soak.py [--phase-seconds 20] [--flood 2000] [--clients 4] [--out bench/results/soak.md]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.repository.sample import build_wheel  # noqa: E402
from tests.support.flood import Flood  # noqa: E402
from tests.support.gatewayproc import GatewayProcess, gateway_init  # noqa: E402
from tests.support.proxyproc import ProxyProcess  # noqa: E402
from tests.support.testindex import TestIndex  # noqa: E402

PROJECTS = ("alpha", "beta", "gamma", "delta")
LIMITS = ("--max-connections", "512", "--header-timeout", "5", "--idle-timeout", "5")
FLOODS = {
    "steady": None,
    "idle-reopen": (b"", True, None),
    "slowloris": (b"GET /simple/ HTTP/1.1\r\nHost: x\r\n", False, b"X-Slow: y\r\n"),
    "idle-keepalive": (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", False, None),
}


def _proc(pid: int) -> tuple[float, int, int]:
    """RSS (MB), open descriptors, threads of ``pid``."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return (int(fields["VmRSS"].split()[0]) / 1024, len(os.listdir(f"/proc/{pid}/fd")), int(fields["Threads"]))


def _du(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


class Load:
    """``clients`` threads asking the edge for pages, wheels and missing names; latencies and errors kept."""

    def __init__(self, edge: ProxyProcess, wheels: dict[str, str], clients: int) -> None:
        self.edge, self.wheels, self.clients = edge, wheels, clients
        self.latencies: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, seed: int) -> None:
        urls = [f"{self.edge.url}{p}/" for p in PROJECTS] + [f"{self.edge.base}{w}" for w in self.wheels.values()] \
            + [f"{self.edge.url}no-such-project-{seed}/"]
        i = seed
        while not self._stop.is_set():
            url = urls[i % len(urls)]
            i += 1
            start = time.perf_counter()
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    r.read()
            except urllib.error.HTTPError as e:
                e.read()
                if e.code != 404:
                    self.errors += 1
            except OSError:
                self.errors += 1
            self.latencies.append(time.perf_counter() - start)

    def take(self) -> list[float]:
        taken, self.latencies = self.latencies, []
        return taken

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(35)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phase-seconds", type=float, default=20.0)
    parser.add_argument("--flood", type=int, default=2000, help="connections per process per flood")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir, TestIndex() as index:
        tmp = Path(tmp_dir)
        wheels = {}
        for name in PROJECTS:
            wheel = build_wheel(tmp / "dists", name, "1.0", payload=os.urandom(256 * 1024))
            index.add(wheel)
            wheels[name] = f"packages/{name}/{wheel.name}"
        gateway_init(tmp / "gw")
        with GatewayProcess(tmp / "gw", "--index-url", index.url, "--batch-window", "0.05", *LIMITS) as gw, \
                ProxyProcess(tmp / "edge", "--profile", "gateway", "--upstream", gw.base, "--root", str(gw.root),
                             "--workers", "1", "--refresh-interval", "2", *LIMITS) as edge:
            for name in PROJECTS:  # published once: the load then asks warm and cold-file paths
                urllib.request.urlopen(f"{edge.url}{name}/", timeout=60).read()
            rows = []
            with Load(edge, wheels, args.clients) as load:
                for phase, flood in FLOODS.items():
                    rows.append(_phase(phase, flood, args, load, edge, gw))
    table = _table(rows, args)
    print(table)
    if args.out:
        args.out.write_text(table)


def _phase(phase: str, flood: tuple[bytes, bool, bytes | None] | None, args: argparse.Namespace, load: Load,
           edge: ProxyProcess, gw: GatewayProcess) -> dict[str, object]:
    logs = (edge.log_path.stat().st_size, gw.log_path.stat().st_size)
    load.take()
    samples: list[tuple[float, ...]] = []
    latencies: list[float] = []
    errors = load.errors
    with contextlib.ExitStack() as floods:
        held = []
        if flood is not None:
            first, reopen, _ = flood
            held = [floods.enter_context(Flood(p.port, args.flood, first=first, reopen=reopen)) for p in (edge, gw)]
        end = time.monotonic() + args.phase_seconds
        while time.monotonic() < end:
            time.sleep(1.0 if drip_of(flood) is None else 0.5)  # the sampling and dripping period
            for f in held:
                if drip_of(flood) is not None:
                    f.send_all(drip_of(flood))  # type: ignore[arg-type]
                if not f.reopen:
                    f.collect()
            assert edge.proc is not None and gw.proc is not None
            samples.append((*_proc(edge.proc.pid), *_proc(gw.proc.pid), _du(edge.cache_dir)))
            latencies += load.take()
        opened = sum(f.opened for f in held)
    logged = (edge.log_path.stat().st_size - logs[0], gw.log_path.stat().st_size - logs[1])
    last = samples[-1]
    return {"phase": phase, "requests": len(latencies), "errors": load.errors - errors,
            "p50": _pct(latencies, 0.5) * 1000, "p99": _pct(latencies, 0.99) * 1000,
            "edge": f"{max(s[0] for s in samples):.0f} MB / {max(s[1] for s in samples)} fds / {last[2]} thr",
            "gateway": f"{max(s[3] for s in samples):.0f} MB / {max(s[4] for s in samples)} fds / {last[5]} thr",
            "cache": f"{last[6]:.1f} MB", "logged": f"{logged[0]} / {logged[1]} B", "flood_opened": opened}


def drip_of(flood: tuple[bytes, bool, bytes | None] | None) -> bytes | None:
    return None if flood is None else flood[2]


def _table(rows: list[dict[str, object]], args: argparse.Namespace) -> str:
    steady = rows[0]
    lines = [f"Soak: `python bench/soak.py --phase-seconds {args.phase_seconds:g} --flood {args.flood} "
             f"--clients {args.clients}` ({args.phase_seconds:g} s a phase, {args.flood} flood connections per "
             "process, both processes at --max-connections 512 --header-timeout 5 --idle-timeout 5).", "",
             "| phase | requests (x steady) | errors | p50 ms (x steady) | p99 ms (x steady) | edge max RSS / fds / threads "
             "| gateway max RSS / fds / threads | edge cache | logged edge / gateway | flood connections opened |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['phase']} | {r['requests']} ({r['requests'] / max(1, steady['requests']):.2f}x) "  # type: ignore[operator]
            f"| {r['errors']} | {r['p50']:.1f} ({r['p50'] / steady['p50']:.2f}x) "  # type: ignore[operator]
            f"| {r['p99']:.1f} ({r['p99'] / steady['p99']:.2f}x) | {r['edge']} | {r['gateway']} | {r['cache']} "  # type: ignore[operator]
            f"| {r['logged']} | {r['flood_opened']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
