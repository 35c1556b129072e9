"""One uv cold install through edge -> gateway, every request timed: where a cold install's time goes (issue 33).

``bench/install.py``'s local index (its real wheels, ``--rtt-ms`` delay on
every answer) with a fresh ``tufproxy gateway`` and ``tufproxy serve``
edge (install.py's setup).  Three timing reverse proxies (taps, in this
process) sit between uv and the edge, the edge and the gateway, and the
gateway and the index, so each request's start and end are known on one clock.  Printed:
uv's wall time and its phases, the CPU seconds each process tree spent on
the install (utime + stime), and the timeline of requests (milliseconds
from uv's start; ``edge``: what uv asked, ``gw``: what the edge asked the gateway, ``index``: what the gateway
asked), which shows the levels of uv's resolution: pages, their
``.metadata``, the dependencies' pages, and so on; and how many
connections each hop's requests came on (keep-alive reuse).  A miss's
answer names where its time went (its ``Server-Timing`` header: the
index fetch, the batch wait, signing, writing, the edge's refresh),
shown after its path.

The taps cost CPU of their own (reported as "this process"), on the same
cores: the timeline is for reading the shape, not for figures to compare
with ``bench/install.py``'s.

    python bench/trace_install.py [--rtt-ms 40] [--direct | --gateway] [--warm]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from aiohttp import ClientSession, TCPConnector, web

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from contenders import free_port  # noqa: E402
from install import GatewayOnly, Index, Tufproxy, fetch_corpus, install, load  # noqa: E402
from warmab import _cpu_seconds  # noqa: E402

# content-encoding passes: bodies go through as sent (auto_decompress=False)
_HOP = frozenset(("host", "transfer-encoding", "content-length", "connection"))


Entry = tuple[str, float, float, int, str, str]  # who, start, end, status, path, its Server-Timing value
_SPENT = re.compile(r"([\w-]+);dur=([\d.]+)")

# Each tap's callers' connections (their address and port): how many the requests came on, i.e. how well the
# caller reuses its connections (keep-alive).
PEERS: dict[str, set[object]] = {}


class Tap:
    """A reverse proxy to ``target`` on its own loop in a thread, recording (name, start, end, status, path);
    with ``delay`` (seconds), each request waits that long before it is passed on: a round trip, as the
    index's delay is one (bench/uvab.py's ``--gateway-rtt-ms``)."""

    def __init__(self, target: str, name: str, log: list[Entry], t0: list[float],
                 delay: float = 0.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        session: list[ClientSession] = []

        async def forward(request: web.Request) -> web.Response:
            began = time.monotonic() - t0[0]
            if request.transport is not None:
                PEERS.setdefault(name, set()).add(request.transport.get_extra_info("peername"))
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
            if delay:
                await asyncio.sleep(delay)
            async with session[0].request(request.method, target + request.rel_url.raw_path_qs, headers=headers,
                                          data=await request.read(), allow_redirects=False) as r:
                body = await r.read()
                answer = {k: v for k, v in r.headers.items() if k.lower() not in _HOP}
            log.append((name, began, time.monotonic() - t0[0], r.status, request.rel_url.raw_path,
                        r.headers.get("Server-Timing", "")))
            return web.Response(status=r.status, body=body, headers=answer)

        async def start() -> None:
            session.append(ClientSession(connector=TCPConnector(limit=0), auto_decompress=False))
            app = web.Application()
            app.router.add_route("*", "/{path:.*}", forward)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            ready.set()

        threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True).start()
        if not ready.wait(30):
            raise RuntimeError(f"the {name} tap did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rtt-ms", type=float, default=40.0)
    ap.add_argument("--direct", action="store_true", help="uv straight at the index (through the tap), for comparison")
    ap.add_argument("--gateway", action="store_true", help="uv straight at the gateway (no edge), through the tap")
    ap.add_argument("--warm", action="store_true", help="trace a second install, the servers warm from a first")
    args = ap.parse_args()
    log: list[Entry] = []
    t0 = [time.monotonic()]
    index = Index(load(fetch_corpus(lambda s: print(s, file=sys.stderr))), args.rtt_ms / 1000)
    index_tap = Tap(index.url.rsplit("/simple/", 1)[0], "index", log, t0)

    class Tapped:  # the index as the gateway sees it: through the tap
        url = f"{index_tap.url}/simple/"

    with tempfile.TemporaryDirectory(prefix="bench-trace-") as tmp:
        work = Path(tmp)
        setup = None
        if args.direct:
            url = Tapped.url
        elif args.gateway:
            setup = GatewayOnly(Tapped, work / "gateway")  # type: ignore[arg-type]
            setup.fresh()
            url = f"{Tap(setup.url.rsplit('/simple/', 1)[0], 'gw', log, t0).url}/simple/"
        else:
            setup = Tufproxy(Tapped, work / "tufproxy")  # type: ignore[arg-type]
            setup.gateway_via = lambda gw: f"{Tap(gw.rstrip('/'), 'gw', log, t0).url}/"  # type: ignore[method-assign]
            setup.fresh()
            url = f"{Tap(setup.url.rsplit('/simple/', 1)[0], 'edge', log, t0).url}/simple/"
        clients = Path("/dev/shm") if Path("/dev/shm").is_dir() else work
        client_dir = Path(tempfile.mkdtemp(prefix="bench-trace-", dir=clients))
        try:
            if args.warm:
                install("uv", url, client_dir / "target", client_dir)
            log.clear()  # what the servers asked while starting, or the warm-up install
            PEERS.clear()
            trees = {s.name: s for s in setup.servers} if setup else {}
            before = {name: _cpu_seconds(server) for name, server in trees.items()}
            mine = os.times()
            t0[0] = time.monotonic()
            print(f"clock origin {t0[0]:.4f}", file=sys.stderr)
            took, phases = install("uv", url, client_dir / "target", client_dir)
            children = os.times()
            spent = {name: _cpu_seconds(server) - before[name] for name, server in trees.items()}
        finally:
            if setup is not None:
                setup.stop()
            shutil.rmtree(client_dir, ignore_errors=True)
    uv_cpu = (children.children_user + children.children_system) - (mine.children_user + mine.children_system)
    taps_cpu = (children.user + children.system) - (mine.user + mine.system)
    route = "direct" if args.direct else "straight at the gateway" if args.gateway else "through edge -> gateway"
    print(f"uv {'warm' if args.warm else 'cold'} install {route}: "
          f"{took:.3f} s; "
          + ", ".join(f"{k.lower()} {v:.3f} s" for k, v in phases.items()))
    print("CPU seconds: " + "".join(f"{k} {v:.2f}, " for k, v in spent.items())
          + f"uv {uv_cpu:.2f}, this process (index and taps) {taps_cpu:.2f}")
    print("connections: " + ", ".join(f"{who}: {sum(1 for e in log if e[0] == who)} requests on {len(peers)}"
                                      for who, peers in sorted(PEERS.items())))
    print(f"{'who':5} {'start':>7} {'end':>7} {'ms':>6} status path")
    for name, began, ended, status, path, spent_on in sorted(log, key=lambda e: e[1]):
        timed = " " + _SPENT.sub(r"\1 \2", spent_on) if spent_on else ""
        print(f"{name:5} {began * 1000:7.1f} {ended * 1000:7.1f} {(ended - began) * 1000:6.1f} {status} {path[:100]}"
              f"{timed}")


if __name__ == "__main__":
    main()
