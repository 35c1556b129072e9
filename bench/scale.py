"""A real gateway grown to 100,000 published projects, measured side by side at each size (issue 37).

Everything runs on 127.0.0.1:

* a synthetic index in this process (aiohttp, its own thread and event loop): PEP 691 JSON or PEP 503
  HTML by ``Accept`` for ``/simple/p<digits>/``, any such name, the page made up from the name (three
  wheels with sha256, PEP 658 core-metadata hash, size and upload-time; no file is ever served, nothing
  of the index is on disk); it counts the page requests per name;
* ``tufproxy gateway init DIR --bins 4096`` once (the count PEP 458's rule picks for ~100,000 projects,
  ``bins_for_targets(200_000)``: the gateway is set up for the size it expects and then grows, so the
  1.25x goals compare one gateway at 1,000 and at 100,000), then ``tufproxy gateway serve`` as one process
  (``--workers 1``: its CPU is one pid's), ``--page-ttl 86400`` (nothing falls due during the run),
  ``--gc-grace 1`` (a collection removes every superseded file at once), ``--prefetch-depth 0`` (the
  made-up pages' .metadata files do not exist);
* at each checkpoint a real edge (``tufproxy serve --profile gateway --workers 1 --refresh-interval 3600``)
  whose upstream is a counting relay in this process in front of the gateway.

Growing: ``--concurrency`` POSTs at once to the gateway's publish API (the miss protocol's
``/_tufproxy/publish/<project>``, what edges send), names ``p0``, ``p1``, ..., so the gateway batches them;
progress on stderr.  At each checkpoint (N projects published that way), in this order:

1. the gateway's VmHWM and CPU over the fill (the process that did it);
2. restart: SIGTERM; "aged" (unless ``--fresh-bins``): every online role re-signed while it is down
   (``tufproxy repo refresh DIR --force``), which is what PEP 458's one-day bin-n expiry has done to any gateway
   older than a day; without it the first checkpoint's snapshot still names most bins at version 1 and each
   publish re-signs a smaller snapshot than a gateway that has run a day does (its 1,000-project figures are
   then a fresh install's, not a running gateway's); start again, seconds from the spawn until ``/readyz`` answers 200 ("start-up"); the
   first collection of a gateway runs at its first tick (``proxy/gateway/freshness.py``: the online roles
   are re-signed at once after a start, then ``Collector.collect`` looks at the projects signed since its
   record in ``run/gc-pending.json``, at every project without one), so the restart is also the garbage
   collection.  For ``--restart-watch`` seconds after the gateway is ready (and until
   the collection is over: at most 2 versions of each role left in ``public/metadata`` and the gateway's
   CPU idle) the index's page requests are counted: "page fetches after a restart" (goal 0: every ttl is a
   day away);
3. the directory's size after that collection (blocks, hard links once), and per project;
4. ``--probes`` sequential cold misses through the edge, ``GET edge/simple/<never-published name>/``
   (after one unmeasured warm-up miss): client latency (median, p90), the gateway's CPU per publish
   (utime + stime of its pid from /proc over the probes / probes; the edge's reads of the new metadata
   are part of it), disk per publish (the directory's growth over the probes / probes; no collection runs
   then), and the edge's bytes per new project (body bytes the relay passed from the gateway to the edge
   for one miss, as on the wire: the snapshot is gzipped for the edge; HTTP headers not counted),
   with the share of timestamp, snapshot, bin-n, page and publish answer;
5. the gateway's VmRSS and VmHWM after the probes (since the restart): the ledger, the catalog and the
   per-project maps are all in this one process.

Where this differs from a plain reading of the issue, and why:

* the edge reads the gateway through the relay, so each latency includes one more local hop; it is the
  same hop at every size, and the relay is the one place that sees every byte the edge downloads (the
  edge's own ``tufproxy_upstream_bytes_total`` counts files and pages, not the TUF metadata);
* the probes are published too: the gateway holds the checkpoint's N plus 21 per earlier checkpoint
  (100,042 at "100,000"); the table's first row is the gateway's own count;
* the gateway's CPU per publish is its whole process over a miss: the publish, and serving the edge the
  new timestamp, snapshot, bin-n and page;
* the fill takes about 45 minutes to 100,000 on a shared 2-CPU machine (about 2 minutes to 10,000:
  96 projects/s at first, about 35/s past 50,000), longer than the 30 minutes hoped for, but it finishes,
  so the run goes to 100,000 rather than stopping at a smaller size; ``--checkpoints 1000 10000`` takes
  about 5 minutes.

Printed: a table side by side, the ratios last / first, the goals met or missed; written:
``bench/results/scale.json`` and ``bench/results/scale.md``.

Usage: ``python bench/scale.py [--checkpoints 1000 10000 100000] [--bins 4096] [--concurrency 128]
[--probes 20] [--restart-watch 30] [--workdir DIR] [--out bench/results]``; ``--report bench/results/scale.json``
prints and writes the report of a saved run again.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.protocol import index  # noqa: E402
from proxy.protocol.bins import bins_for_targets  # noqa: E402
from tests.support.gatewayproc import GatewayProcess  # noqa: E402
from tests.support.poll import wait_for  # noqa: E402
from tests.support.proxyproc import ProxyProcess  # noqa: E402

T = TypeVar("T")
JSON_ACCEPT = "application/vnd.pypi.simple.v1+json"
NAME = re.compile(r"p[0-9]{1,12}")
FILES = 3  # per made-up page: a small project, as most of the public index's are
PROBE_BASE = 10**9  # probe names p<PROBE_BASE + ...>: never among the fill's p0 ... p<N-1>
HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade",
                 "proxy-connection", "te", "trailer"})
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- a loop in a thread, for the index and the relay ---------------------------------------------------------
class LoopThread:
    """An event loop running in a daemon thread; :meth:`run` runs a coroutine on it and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


async def _site(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


# -- the synthetic index ---------------------------------------------------------------------------------------
class SyntheticIndex:
    """Any ``p<digits>`` project, made up from its name; page requests counted per name."""

    def __init__(self, loop: LoopThread) -> None:
        self._lock = threading.Lock()  # counted on the loop's thread, read from the main one
        self._pages: Counter[str] = Counter()
        self._other: Counter[str] = Counter()
        app = web.Application()
        app.router.add_get("/simple/{project}/", self._page)
        app.router.add_route("*", "/{tail:.*}", self._elsewhere)
        self._runner, self.port = loop.run(_site(app))
        self._loop = loop

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/simple/"

    def counts(self) -> tuple[Counter[str], Counter[str]]:
        """(page requests by project, other requests by path), as they are now."""
        with self._lock:
            return Counter(self._pages), Counter(self._other)

    def page(self, project: str) -> index.ProjectPage:
        files = []
        for i in range(FILES):
            filename = f"{project}-1.{i}.0-py3-none-any.whl"
            digest = hashlib.sha256(filename.encode()).hexdigest()  # fixed per name: a refresh changes nothing
            files.append(index.DistFile(
                filename=filename, url=f"http://127.0.0.1:{self.port}/files/{project}/{filename}",
                hashes={"sha256": digest}, requires_python=">=3.9",
                core_metadata={"sha256": hashlib.sha256(digest.encode()).hexdigest()},
                size=20_000 + 1_000 * i, upload_time="2024-01-01T00:00:00.000000Z"))
        return index.ProjectPage(name=project, files=tuple(files), versions=tuple(f"1.{i}.0" for i in range(FILES)))

    async def _page(self, request: web.Request) -> web.Response:
        project = request.match_info["project"]
        with self._lock:
            self._pages[project] += 1
        if not NAME.fullmatch(project):
            raise web.HTTPNotFound()
        page = self.page(project)
        if index.negotiate(request.headers.get("Accept")) is index.MediaType.JSON_V1:
            return web.Response(body=index.render_project_json(page), headers={"Content-Type": JSON_ACCEPT})
        return web.Response(body=index.render_project_html(page), headers={"Content-Type": "text/html"})

    async def _elsewhere(self, request: web.Request) -> web.Response:
        # The root list included (the gateway's start-up check reads it): not served, so the check reads no page.
        with self._lock:
            self._other[request.path] += 1
        raise web.HTTPNotFound()

    def close(self) -> None:
        self._loop.run(self._runner.cleanup())


# -- the counting relay between the edge and the gateway -----------------------------------------------------
def kind_of(path: str) -> str:
    """Which part of a miss a path of the gateway's tree is."""
    name = path.rsplit("/", 1)[-1]
    if path.startswith("/_tufproxy/publish/"):
        return "publish"
    if path.startswith("/metadata/"):
        if name == "timestamp.json":
            return "timestamp"
        if re.fullmatch(r"[0-9]+\.snapshot\.json", name):
            return "snapshot"
        if re.fullmatch(r"[0-9]+\.bin-[0-9a-f]+\.json", name):
            return "bin-n"
        return "other-metadata"
    if path.startswith("/simple/"):
        return "page"
    return "other"


class CountingRelay:
    """Forwards every request to the gateway and counts the answers' body bytes (as sent: gzip stays gzip)."""

    def __init__(self, loop: LoopThread, target: str) -> None:
        self.target = target.rstrip("/")
        self._lock = threading.Lock()
        self._bytes: Counter[str] = Counter()
        self._loop = loop

        async def start() -> tuple[aiohttp.ClientSession, web.AppRunner, int]:
            session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=600))
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            return (session, *await _site(app))

        self._session, self._runner, self.port = loop.run(start())

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self._bytes)

    async def _handle(self, request: web.Request) -> web.Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with self._session.request(request.method, self.target + request.path_qs, headers=headers,
                                         data=await request.read(), allow_redirects=False) as upstream:
            body = await upstream.read()
            passed = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP}
        with self._lock:
            self._bytes[kind_of(request.path)] += len(body)
        return web.Response(status=upstream.status, body=body, headers=passed)

    def close(self) -> None:
        async def stop() -> None:
            await self._runner.cleanup()
            await self._session.close()
        self._loop.run(stop())


# -- the gateway process, seen from /proc -----------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (fields 14 and 15 of /proc/PID/stat, after the command name)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of ``pid``, MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def dir_bytes(path: Path) -> int:
    """Disk used under ``path``: blocks, each hard link once (a page's plain and hashed names share an inode).
    As bench/model.py's ``_dir_bytes``; copied, not imported, so this bench does not depend on that one."""
    seen: dict[tuple[int, int], int] = {}
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                st = os.stat(os.path.join(dirpath, f))
            except FileNotFoundError:  # a temp file renamed away under us
                continue
            seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values())


def status(url: str, accept: str | None = None, timeout: float = 60) -> int:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def metrics(base: str) -> dict[str, float]:
    """The gateway's metrics that matter here (name with labels -> value)."""
    text = urllib.request.urlopen(f"{base}metrics", timeout=60).read().decode()
    wanted = ("tufproxy_gateway_projects ", "tufproxy_gateway_usage_entries", "tufproxy_gateway_publishes_total ",
              "tufproxy_gateway_published_projects_total ", "tufproxy_gateway_pages_fetched_total")
    out = {}
    for line in text.splitlines():
        if line.startswith(wanted):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def versions_left(metadata: Path) -> int:
    """The most versions of any one role (root aside) in ``metadata``: 2 once a collection is over."""
    roles: Counter[str] = Counter()
    for name in os.listdir(metadata):
        m = re.fullmatch(r"[0-9]+\.(.+)\.json", name)
        if m and m.group(1) != "root":
            roles[m.group(1)] += 1
    return max(roles.values(), default=0)


def idle(pid: int, window: float = 1.0, below: float = 0.05) -> Callable[[], bool]:
    """A condition for :func:`wait_for`: true once ``pid`` used less than ``below`` CPU seconds in ``window``."""
    last = [cpu_seconds(pid), time.monotonic()]

    def quiet() -> bool:
        now = time.monotonic()
        if now - last[1] < window:
            return False
        used = cpu_seconds(pid) - last[0]
        last[:] = [cpu_seconds(pid), now]
        return used < below
    return quiet


class Gateway:
    """``tufproxy gateway serve`` with this bench's settings, restartable, each start's log kept."""

    def __init__(self, directory: Path, index_url: str, batch_window: float) -> None:
        self.proc = GatewayProcess(directory, "--index-url", index_url, "--workers", "1", "--page-ttl", "86400",
                                   "--refresh-rate", "5", "--gc-grace", "1", "--prefetch-depth", "0",
                                   "--batch-window", str(batch_window), "--log-level", "warning")
        self.directory = directory
        self.starts = 0

    @property
    def pid(self) -> int:
        assert self.proc.proc is not None
        return self.proc.proc.pid

    def start(self) -> dict[str, float]:
        """Start; seconds until it listens and until /readyz says 200."""
        self.starts += 1
        self.proc.log_path = self.directory.parent / f"gateway-{self.starts}.log"
        began = time.perf_counter()
        self.proc.start(timeout=1800)
        listening = time.perf_counter() - began
        wait_for(lambda: status(f"{self.proc.base}readyz", timeout=10), "gateway ready", timeout=1800,
                 done=lambda s: s == 200)
        return {"listen_s": round(listening, 2), "ready_s": round(time.perf_counter() - began, 2)}

    def stop(self) -> float:
        began = time.perf_counter()
        self.proc.stop()
        return round(time.perf_counter() - began, 2)


# -- filling --------------------------------------------------------------------------------------------------
async def _fill(base: str, names: range, concurrency: int, label: str, progress: list[tuple[int, float]]) -> int:
    """POST a publish of every name, ``concurrency`` at once; the count of answers that were not 200.
    ``progress`` gets (published, seconds) every 10 s: whether the rate falls as the gateway grows."""
    todo = iter(names)
    done = failed = 0
    began = last = time.monotonic()

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done, failed, last
        for i in todo:
            for attempt in range(5):
                try:
                    async with session.post(f"{base}_tufproxy/publish/p{i}", data=b"") as r:
                        await r.read()
                        ok = r.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                if ok:
                    break
                await asyncio.sleep(0.5 * 2 ** attempt)  # a back-off before a retry, not a synchronisation
            else:
                failed += 1
            done += 1
            now = time.monotonic()
            if now - last >= 10:
                last = now
                progress.append((names.start + done, round(now - began, 1)))
                print(f"  fill {label}: {done:,}/{len(names):,} ({done / (now - began):.0f}/s)", file=sys.stderr, flush=True)

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency), timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return failed


def fill(gw: Gateway, names: range, concurrency: int) -> dict[str, Any]:
    cpu0, began = cpu_seconds(gw.pid), time.perf_counter()
    before = metrics(gw.proc.base)
    progress: list[tuple[int, float]] = []
    failed = asyncio.run(_fill(gw.proc.base, names, concurrency, f"p{names.start}..p{names.stop - 1}", progress))
    seconds = time.perf_counter() - began
    after = metrics(gw.proc.base)
    batches = after["tufproxy_gateway_publishes_total"] - before.get("tufproxy_gateway_publishes_total", 0)
    return {"projects": len(names), "failed": failed, "seconds": round(seconds, 1),
            "per_second": round(len(names) / seconds, 1),
            "gateway_cpu_ms_per_project": round((cpu_seconds(gw.pid) - cpu0) * 1e3 / len(names), 2),
            "batches": int(batches), "projects_per_batch": round(len(names) / max(1, batches), 1),
            **{f"gateway_{k}_mb": v for k, v in memory_mb(gw.pid).items()}, "progress": progress}


# -- one checkpoint --------------------------------------------------------------------------------------------
def restart(gw: Gateway, idx: SyntheticIndex, watch: float, age: bool) -> dict[str, Any]:
    """Stop and start the gateway (with ``age``, every online role re-signed in between: the state of a gateway
    older than a bin-n's lifetime); start-up time, the index requests after it, the collection's end."""
    pages0, other0 = idx.counts()
    stopped = gw.stop()
    if age:
        subprocess.run([sys.executable, "-m", "proxy", "repo", "refresh", str(gw.directory), "--force"], check=True,
                       stdout=subprocess.DEVNULL)
    started = gw.start()
    ready = time.monotonic()
    metadata = gw.directory / "public" / "metadata"
    wait_for(lambda: versions_left(metadata) <= 2, "collection of old metadata", timeout=1800, interval=0.5)
    wait_for(idle(gw.pid), "gateway idle after the collection", timeout=1800, interval=0.2)
    gc_s = time.monotonic() - ready
    # The watch is a measuring window (requests the index sees in it), not a wait for something to happen.
    if (left := watch - (time.monotonic() - ready)) > 0:
        time.sleep(left)
    pages1, other1 = idx.counts()
    fetched = pages1 - pages0
    return {"stop_s": stopped, **started, "gc_after_ready_s": round(gc_s, 1),
            "watched_s": round(time.monotonic() - ready, 1), "page_fetches": sum(fetched.values()),
            "page_fetches_sample": sorted(fetched)[:10], "other_index_requests": dict(other1 - other0)}


def probe(edge: ProxyProcess, name: str) -> tuple[int, float]:
    began = time.perf_counter()
    code = status(f"{edge.url}{name}/", JSON_ACCEPT, timeout=120)
    return code, time.perf_counter() - began


def probes(gw: Gateway, relay: CountingRelay, edge: ProxyProcess, names: list[str]) -> dict[str, Any]:
    """Sequential cold misses through the edge: latency, gateway CPU and disk per publish, edge bytes."""
    code, _ = probe(edge, names[0])  # warm-up: the first miss of an edge and of a freshly started gateway
    assert code == 200, f"warm-up miss answered {code}"
    disk0, cpu0 = breakdown(gw.directory), cpu_seconds(gw.pid)
    latencies, per_probe, codes = [], [], Counter[int]()
    for name in names[1:]:
        b0 = relay.counts()
        code, seconds = probe(edge, name)
        codes[code] += 1
        latencies.append(seconds)
        per_probe.append(relay.counts() - b0)
    cpu = cpu_seconds(gw.pid) - cpu0
    parts = breakdown(gw.directory)
    disk = {k: parts[k] - disk0[k] for k in parts}
    n = len(latencies)
    latencies.sort()
    kinds = sorted({k for c in per_probe for k in c})
    return {
        "probes": n, "answers": dict(codes),
        "latency_ms_median": round(statistics.median(latencies) * 1e3, 1),
        "latency_ms_p90": round(latencies[min(n - 1, int(0.9 * n))] * 1e3, 1),
        "gateway_cpu_ms_per_publish": round(cpu * 1e3 / n, 1),
        "disk_bytes_per_publish": disk["total"] // n,
        # What a publish signs and writes, apart from the gateway's own state (the ledger's lines and its SQLite
        # index, whose write-ahead log grows by whole pages until SQLite's checkpoint reuses it).
        "disk_public_bytes_per_publish": (disk["metadata"] + disk["simple"]) // n,
        "disk_state_bytes_per_publish": disk["gateway"] // n,
        "edge_bytes_per_project_median": int(statistics.median(sum(c.values()) for c in per_probe)),
        "edge_bytes_by_kind_median": {k: int(statistics.median(c[k] for c in per_probe)) for k in kinds},
    }


def breakdown(directory: Path) -> dict[str, int]:
    parts = {"metadata": directory / "public" / "metadata", "simple": directory / "public" / "simple",
             "gateway": directory / "gateway"}
    out = {k: dir_bytes(p) for k, p in parts.items()}
    out["total"] = dir_bytes(directory)
    return out


def checkpoint(n: int, k: int, gw: Gateway, idx: SyntheticIndex, relay: CountingRelay, tmp: Path,
               args: argparse.Namespace, filled: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"checkpoint": n, "fill": filled}
    print(f"checkpoint {n:,}: restart", file=sys.stderr, flush=True)
    row["restart"] = restart(gw, idx, args.restart_watch, not args.fresh_bins)
    sizes = breakdown(gw.directory)
    m = metrics(gw.proc.base)
    published = int(m.get("tufproxy_gateway_projects", 0))
    row["after_gc"] = {"published": published, "dir_bytes": sizes,
                       "dir_bytes_per_project": sizes["total"] // max(1, published)}
    print(f"checkpoint {n:,}: {args.probes} cold misses through an edge", file=sys.stderr, flush=True)
    edge = ProxyProcess(tmp / f"edge-{n}", "--profile", "gateway", "--upstream", relay.base, "--root", str(gw.proc.root),
                        "--workers", "1", "--refresh-interval", "3600", "--log-level", "warning")
    with edge:
        wait_for(lambda: status(f"{edge.base}readyz", timeout=10), "edge ready", timeout=120, done=lambda s: s == 200)
        names = [f"p{PROBE_BASE + 1000 * k + j}" for j in range(args.probes + 1)]
        row["publish"] = probes(gw, relay, edge, names)
    row["memory"] = memory_mb(gw.pid)
    row["gateway_metrics"] = metrics(gw.proc.base)
    return row


# -- the report ------------------------------------------------------------------------------------------------
def _kb(value: float | None) -> float | None:
    return value / 1024 if value is not None else None  # absent from runs before the split was measured


ROWS: list[tuple[str, Callable[[dict[str, Any]], float | None], str]] = [
    ("projects published (gateway gauge)", lambda r: r["after_gc"]["published"], "{:,.0f}"),
    ("latency per publish, median ms (edge miss)", lambda r: r["publish"]["latency_ms_median"], "{:,.0f}"),
    ("latency per publish, p90 ms", lambda r: r["publish"]["latency_ms_p90"], "{:,.0f}"),
    ("gateway CPU per publish, ms", lambda r: r["publish"]["gateway_cpu_ms_per_publish"], "{:,.1f}"),
    ("disk per publish, KB", lambda r: r["publish"]["disk_bytes_per_publish"] / 1024, "{:,.1f}"),
    ("  of which public/ (metadata, pages), KB", lambda r: _kb(r["publish"].get("disk_public_bytes_per_publish")),
     "{:,.1f}"),
    ("  of which gateway/ (ledger, its index), KB", lambda r: _kb(r["publish"].get("disk_state_bytes_per_publish")),
     "{:,.1f}"),
    ("edge bytes per new project, KB", lambda r: r["publish"]["edge_bytes_per_project_median"] / 1024, "{:,.1f}"),
    ("  of which snapshot, KB", lambda r: r["publish"]["edge_bytes_by_kind_median"].get("snapshot", 0) / 1024, "{:,.1f}"),
    ("  of which bin-n, KB", lambda r: r["publish"]["edge_bytes_by_kind_median"].get("bin-n", 0) / 1024, "{:,.1f}"),
    ("  of which page, KB", lambda r: r["publish"]["edge_bytes_by_kind_median"].get("page", 0) / 1024, "{:,.1f}"),
    ("directory after GC, MB", lambda r: r["after_gc"]["dir_bytes"]["total"] / 2**20, "{:,.1f}"),
    ("  metadata/, MB", lambda r: r["after_gc"]["dir_bytes"]["metadata"] / 2**20, "{:,.1f}"),
    ("  simple/, MB", lambda r: r["after_gc"]["dir_bytes"]["simple"] / 2**20, "{:,.1f}"),
    ("  gateway/ (ledger, fetch times), MB", lambda r: r["after_gc"]["dir_bytes"]["gateway"] / 2**20, "{:,.1f}"),
    ("directory bytes per project after GC", lambda r: r["after_gc"]["dir_bytes_per_project"], "{:,.0f}"),
    ("gateway VmRSS after the probes, MB", lambda r: r["memory"]["VmRSS"], "{:,.1f}"),
    ("gateway VmHWM since restart, MB", lambda r: r["memory"]["VmHWM"], "{:,.1f}"),
    ("gateway VmHWM over the fill, MB", lambda r: r["fill"].get("gateway_VmHWM_mb"), "{:,.1f}"),
    ("start-up (spawn to /readyz 200), s", lambda r: r["restart"]["ready_s"], "{:,.2f}"),
    ("  of which until listening, s", lambda r: r["restart"]["listen_s"], "{:,.2f}"),
    ("stop (SIGTERM to exit), s", lambda r: r["restart"]["stop_s"], "{:,.2f}"),
    ("GC done after ready, s", lambda r: r["restart"]["gc_after_ready_s"], "{:,.1f}"),
    ("page fetches after restart", lambda r: r["restart"]["page_fetches"], "{:,.0f}"),
    ("fill: seconds (this segment)", lambda r: r["fill"].get("seconds"), "{:,.0f}"),
    ("fill: projects/s (this segment)", lambda r: r["fill"].get("per_second"), "{:,.1f}"),
    ("fill: gateway CPU ms per project", lambda r: r["fill"].get("gateway_cpu_ms_per_project"), "{:,.2f}"),
    ("fill: projects per batch", lambda r: r["fill"].get("projects_per_batch"), "{:,.1f}"),
]


NO_RATIO = frozenset({"fill: seconds (this segment)"})


def marginal(rows: list[dict[str, Any]]) -> list[float | None]:
    """Bytes per project added between one checkpoint and the one before (the slope of size against N)."""
    out: list[float | None] = [None]
    for a, b in itertools.pairwise(rows):
        da = b["after_gc"]["dir_bytes"]["total"] - a["after_gc"]["dir_bytes"]["total"]
        dn = b["after_gc"]["published"] - a["after_gc"]["published"]
        out.append(da / dn if dn else None)
    return out


def table(rows: list[dict[str, Any]]) -> list[str]:
    head = ["", *(f"{r['checkpoint']:,}" for r in rows), f"ratio {rows[-1]['checkpoint']:,} / {rows[0]['checkpoint']:,}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, get, fmt in ROWS:
        values = [get(r) for r in rows]
        cells = [fmt.format(v) if v is not None else "-" for v in values]
        first, last = values[0], values[-1]
        # A segment's seconds depend on its length (1,000, then 9,000, then 90,000 projects): no ratio.
        ratio = f"{last / first:.2f}x" if first and last is not None and label not in NO_RATIO else "-"
        lines.append("| " + " | ".join([label, *cells, ratio]) + " |")
    slopes = marginal(rows)
    lines.append("| " + " | ".join(["directory bytes per added project (slope)",
                                    *(f"{s:,.0f}" if s is not None else "-" for s in slopes), "-"]) + " |")
    return lines


def goals(rows: list[dict[str, Any]]) -> list[str]:
    first, last = rows[0], rows[-1]

    def ratio(get: Callable[[dict[str, Any]], float]) -> float:
        return get(last) / get(first) if get(first) else float("inf")

    out = []
    for what, get in (("CPU per publish", lambda r: r["publish"]["gateway_cpu_ms_per_publish"]),
                      ("disk per publish", lambda r: r["publish"]["disk_bytes_per_publish"]),
                      ("latency per publish", lambda r: r["publish"]["latency_ms_median"])):
        x = ratio(get)
        out.append(f"- {what} within 1.25x: {x:.2f}x, **{'met' if x <= 1.25 else 'missed'}**")
    if all("disk_public_bytes_per_publish" in r["publish"] for r in (first, last)):
        x = ratio(lambda r: r["publish"]["disk_public_bytes_per_publish"])
        out.append(f"  - of which the signed tree (public/): {x:.2f}x, **{'met' if x <= 1.25 else 'missed'}**")
    slopes = [s for s in marginal(rows) if s is not None]
    per = [r["after_gc"]["dir_bytes_per_project"] for r in rows]
    if len(slopes) >= 2:
        x = slopes[-1] / slopes[0]
        out.append(f"- directory linear in N (bytes per added project flat after GC): slope {slopes[0]:,.0f} -> "
                   f"{slopes[-1]:,.0f} B/project ({x:.2f}x), **{'met' if 0.8 <= x <= 1.25 else 'missed'}**; "
                   f"total / projects {per[0]:,} -> {per[-1]:,} B (the fixed part, every bin's metadata, spread thinner)")
    else:
        out.append(f"- directory bytes per project after GC: {per[0]:,} -> {per[-1]:,} B (one slope only: "
                   f"{slopes[0]:,.0f} B per added project)" if slopes else "- directory: one checkpoint only")
    peak = max(max(r["memory"]["VmHWM"], r["fill"].get("gateway_VmHWM_mb") or 0) for r in rows)
    out.append(f"- RSS <= 300 MB: peak VmHWM {peak:,.0f} MB, **{'met' if peak <= 300 else 'missed'}**")
    fetches = [r["restart"]["page_fetches"] for r in rows]
    out.append(f"- a restart re-fetches nothing whose ttl has not expired: page fetches after each restart "
               f"{fetches}, **{'met' if not any(fetches) else 'missed'}**")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoints", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--bins", type=int, default=bins_for_targets(200_000))
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--batch-window", type=float, default=0.2)
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--restart-watch", type=float, default=30.0)
    ap.add_argument("--workdir", type=Path, help="keep the gateway's directory and logs here (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--fresh-bins", action="store_true",
                    help="do not re-sign every online role at each restart (see the docstring: 'aged')")
    ap.add_argument("--report", type=Path, metavar="JSON", help="only print and write the report of an earlier run's JSON")
    args = ap.parse_args()
    if args.report is not None:
        saved = json.loads(args.report.read_text())
        report({k: v for k, v in saved.items() if k != "checkpoints"}, saved["checkpoints"], args.out)
        return
    checkpoints = sorted(args.checkpoints)
    began, load_before = time.time(), Path("/proc/loadavg").read_text().strip()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as t:
        tmp = args.workdir or Path(t)
        tmp.mkdir(parents=True, exist_ok=True)
        loop = LoopThread()
        idx = SyntheticIndex(loop)
        gw_dir = tmp / "gw"
        subprocess.run([sys.executable, "-m", "proxy", "gateway", "init", str(gw_dir), "--bins", str(args.bins), "--quiet"],
                       check=True, capture_output=True)
        gw = Gateway(gw_dir, idx.url, args.batch_window)
        relay: CountingRelay | None = None
        rows: list[dict[str, Any]] = []
        try:
            gw.start()
            relay = CountingRelay(loop, gw.proc.base)
            done = 0
            for k, n in enumerate(checkpoints):
                print(f"filling to {n:,} ({args.concurrency} at once)", file=sys.stderr, flush=True)
                filled = fill(gw, range(done, n), args.concurrency)
                done = n
                print(f"  filled {filled['projects']:,} in {filled['seconds']:,.0f} s ({filled['per_second']:.0f}/s, "
                      f"{filled['failed']} failed)", file=sys.stderr, flush=True)
                rows.append(checkpoint(n, k, gw, idx, relay, tmp, args, filled))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            gw.stop()
            if relay is not None:
                relay.close()
            idx.close()
            loop.close()
    load_after = Path("/proc/loadavg").read_text().strip()
    meta = {"command": "python bench/scale.py " + " ".join(sys.argv[1:]),
            "date": datetime.fromtimestamp(began, UTC).isoformat(timespec="seconds"),
            "wall_seconds": round(time.time() - began), "loadavg_before": load_before, "loadavg_after": load_after,
            "cpus": os.cpu_count(), "python": platform.python_version(), "bins": args.bins,
            "concurrency": args.concurrency, "probes": args.probes, "aged": not args.fresh_bins}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps({**meta, "checkpoints": rows}, indent=2) + "\n")
    report(meta, rows, args.out)


def report(meta: dict[str, Any], rows: list[dict[str, Any]], out: Path) -> None:
    """The table and the goals on stdout and in OUT/scale.md."""
    lines = table(rows)
    verdicts = goals(rows)
    print("\n".join(lines))
    print("\n".join(verdicts))
    md = [f"# One gateway grown to {rows[-1]['checkpoint']:,} projects (issue 37)", "",
          f"`{meta['command']}`, {meta['date']}, {meta['wall_seconds'] / 60:.0f} min wall; {meta['cpus']} CPUs, shared; "
          f"load average before `{meta['loadavg_before']}`, after `{meta['loadavg_after']}`. {meta['bins']} bins from "
          f"the start; fill through the publish API, {meta['concurrency']} at once; {meta['probes']} cold misses per "
          "checkpoint through an edge" + ("; every online role re-signed at each restart, as a gateway older than a "
                                          "day has had them (`aged`)" if meta.get("aged") else "") + ". How each figure is measured: the docstring of `bench/scale.py`; raw figures: "
          "`scale.json`.", "", *lines, "", "Goals (ratio last / first checkpoint):", "", *verdicts, ""]
    (out / "scale.md").write_text("\n".join(md))

if __name__ == "__main__":
    main()
