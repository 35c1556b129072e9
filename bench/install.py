"""Install times through edge -> gateway beside direct, proxpi and devpi-server, cold and warm (issue 33).

One run, one machine.  A local index serves about 30 real projects (their
real wheels, downloaded once from the public index into ``bench/.cache/
install/``) as PEP 691 JSON and PEP 503 HTML with PEP 658 metadata, and
answers every request after an injected delay (``--rtt-ms``, default 40:
20 ms each way), so that it is "remote" the way an index is in life.  In
front of it in turn: nothing (direct), proxpi, devpi-server, and a fresh
``tufproxy gateway`` with a ``tufproxy serve`` edge in front of it.  pip
and uv install the same five projects (and their dependencies) into a
fresh target, cold (fresh servers and caches) and warm (the same servers, a
new client with no cache); medians of ``--rounds``, and each figure's ratio
to direct.  Each round runs every setup in turn (round-robin), so load that
drifts on a shared machine weighs on all of them alike.  ``floor`` (in
``--only``) is the same index with no delay: what the client itself costs,
the best any proxy could do.

The clients' target and temporary directory (``TMPDIR``: uv's throwaway
cache under ``--no-cache``, pip's build and ``--target`` staging) are on
``--client-dir``, a tmpfs (``/dev/shm``) where there is one: on a disk
shared with other work, uv's unpacking of the wheels (its "Prepared" phase)
took 150 to 900 ms from one run to the next whatever served them, which
swamped the servers' differences.  uv's own phases (resolve, prepare,
install) are reported beside the totals.

    python bench/install.py [--rounds 3] [--rtt-ms 40] [--only direct,tufproxy] [--client-dir DIR]

Results: ``bench/results/install.md`` (the command is written at its top).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from packaging.utils import canonicalize_name, parse_wheel_filename

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from contenders import Server, Unavailable, ensure_venv, free_port, venv_bin  # noqa: E402

CACHE = HERE / ".cache" / "install"
WHEELS = CACHE / "wheels"
REQUIREMENTS = ["requests", "rich", "httpx", "pydantic", "click"]
# The corpus: these and their dependencies, plus a few more so the index is not only the closure.
CORPUS = [*REQUIREMENTS, "attrs", "python-dateutil", "pyyaml", "jinja2", "packaging", "pytest", "six",
          "platformdirs", "filelock"]
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
TUFPROXY = [sys.executable, "-m", "proxy"]
UV_PHASES = ("Resolved", "Prepared", "Installed")
_UV_PHASE = re.compile(r"^(Resolved|Prepared|Installed) \d+ packages? in ([\d.]+)(ms|s)$", re.MULTILINE)


def fetch_corpus(log: Callable[[str], None]) -> list[Path]:
    """The corpus's wheels for this Python on Linux x86_64, downloaded once."""
    wheels = sorted(WHEELS.glob("*.whl"))
    if len(wheels) >= 30:
        return wheels
    WHEELS.mkdir(parents=True, exist_ok=True)
    log(f"downloading the corpus ({len(CORPUS)} projects and their dependencies) into {WHEELS}")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", PY,
                    "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64", "--platform", "any",
                    "-d", str(WHEELS), *CORPUS], check=True)
    return sorted(WHEELS.glob("*.whl"))


@dataclass(frozen=True)
class Dist:
    project: str
    filename: str
    data: bytes
    metadata: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def metadata_sha256(self) -> str:
        return hashlib.sha256(self.metadata).hexdigest()


def load(wheels: list[Path]) -> dict[str, list[Dist]]:
    projects: dict[str, list[Dist]] = {}
    for wheel in wheels:
        name = canonicalize_name(parse_wheel_filename(wheel.name)[0])
        with zipfile.ZipFile(wheel) as z:
            metadata = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
        projects.setdefault(name, []).append(Dist(name, wheel.name, wheel.read_bytes(), metadata))
    return projects


def _json(body: object) -> web.Response:
    # Exactly PEP 691's media type: some peers compare the header whole (no "; charset=").
    return web.Response(body=json.dumps(body).encode(), headers={"Content-Type": "application/vnd.pypi.simple.v1+json"})


_WHOLE = 1 << 20  # bodies up to this size are written whole


def index_app(projects: dict[str, list[Dist]], delay: float) -> web.Application:
    """PEP 691 JSON and PEP 503 HTML pages with PEP 658 metadata; every answer after ``delay`` seconds."""
    files = {d.filename: d for dists in projects.values() for d in dists}

    @web.middleware
    async def remote(request: web.Request, handler):  # type: ignore[no-untyped-def]
        await asyncio.sleep(delay)
        return await handler(request)

    async def root(request: web.Request) -> web.Response:
        if "application/vnd.pypi.simple.v1+json" in request.headers.get("Accept", ""):
            return _json({"meta": {"api-version": "1.1"}, "projects": [{"name": p} for p in sorted(projects)]})
        links = "".join(f'<a href="/simple/{p}/">{p}</a>\n' for p in sorted(projects))
        return web.Response(text=f"<!DOCTYPE html><html><body>\n{links}</body></html>", content_type="text/html")

    async def page(request: web.Request) -> web.Response:
        name = request.match_info["project"]
        if name != canonicalize_name(name):
            raise web.HTTPMovedPermanently(f"/simple/{canonicalize_name(name)}/")
        dists = projects.get(name)
        if dists is None:
            raise web.HTTPNotFound()
        if "application/vnd.pypi.simple.v1+json" in request.headers.get("Accept", ""):
            versions = sorted({str(parse_wheel_filename(d.filename)[1]) for d in dists})
            body = {"meta": {"api-version": "1.1"}, "name": name, "versions": versions,
                    "files": [{"filename": d.filename, "url": f"/files/{d.filename}", "hashes": {"sha256": d.sha256},
                               "size": len(d.data), "upload-time": "2024-01-01T00:00:00Z",
                               "core-metadata": {"sha256": d.metadata_sha256},
                               "data-dist-info-metadata": {"sha256": d.metadata_sha256}} for d in dists]}
            return _json(body)
        links = "".join(f'<a href="/files/{d.filename}#sha256={d.sha256}" data-core-metadata="sha256={d.metadata_sha256}"'
                        f' data-dist-info-metadata="sha256={d.metadata_sha256}">{d.filename}</a>\n' for d in dists)
        return web.Response(text=f"<!DOCTYPE html><html><body>\n{links}</body></html>", content_type="text/html")

    async def file(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name.endswith(".metadata") and (d := files.get(name.removesuffix(".metadata"))):
            return web.Response(body=d.metadata, content_type="application/octet-stream")
        if (d := files.get(name)) is None:
            raise web.HTTPNotFound()
        if len(d.data) <= _WHOLE:
            return web.Response(body=d.data, content_type="application/octet-stream")
        # A big body in pieces, each sent before the next, as a server streams a file: one write of the whole
        # would copy all but the socket's first few MB into the transport's buffer at once, stalling every
        # client of this index (and this process) for a third of a second per 300 MB.
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.content_length = len(d.data)
        await response.prepare(request)
        view = memoryview(d.data)
        for at in range(0, len(view), _WHOLE):
            await response.write(view[at:at + _WHOLE])
        await response.write_eof()
        return response

    app = web.Application(middlewares=[remote])
    app.router.add_get("/simple/", root)
    app.router.add_get("/simple/{project}/", page)
    app.router.add_get("/simple/{project}", lambda r: web.HTTPMovedPermanently(f"/simple/{r.match_info['project']}/"))
    app.router.add_get("/files/{name}", file)
    return app


class Index:
    """The "remote" index, on its own event loop in a thread of this process."""

    def __init__(self, projects: dict[str, list[Dist]], delay: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/simple/"
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def start() -> None:
            runner = web.AppRunner(index_app(projects, delay), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            ready.set()

        threading.Thread(target=lambda: (self._loop.run_until_complete(start()), self._loop.run_forever()),
                         daemon=True).start()
        if not ready.wait(30):
            raise RuntimeError("the index did not start")


class Setup:
    """Something pip and uv are pointed at; ``fresh()`` forgets everything it has cached."""

    name = ""

    def __init__(self, index: Index, workdir: Path) -> None:
        self.index, self.workdir, self.servers = index, workdir, []  # type: list[Server]
        self.url = ""

    def fresh(self) -> None:
        self.stop()
        if self.workdir.exists():
            # Moved aside, deleted with the bench's temp directory at its end.  On this machine's filesystem (ext4
            # without a journal) the kernel will not reuse an inode freed less than a minute ago (six while its
            # block is dirty) and scans past each one: deleting the last round's few thousand files just before a
            # cold install made every file a server then created pay that scan (`recently_deleted`, 12-20 % of
            # the gateway's and edge's CPU under `perf`), a cost of the bench that a direct install never paid.
            spent = self.workdir.parent / ".spent"
            spent.mkdir(exist_ok=True)
            self.workdir.rename(spent / f"{self.workdir.name}-{time.monotonic_ns()}")
        self.workdir.mkdir(parents=True)
        self.start()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers = []


class Direct(Setup):
    name = "direct"

    def start(self) -> None:
        self.url = self.index.url


class Floor(Direct):
    """The same index with no delay (``Floor.index`` is that one): what the client costs by itself."""

    name = "floor"


class Tufproxy(Setup):
    """Edge in front of gateway; ``env`` is added to their environment (``{"PYTHONPATH": DIR}`` runs the
    tufproxy tree at DIR, as bench/uvab.py and the other A/B benches do)."""

    name = "tufproxy"
    # The edge's upstream for the gateway at this URL (bench/trace_install.py puts a tap between them).
    gateway_via: Callable[[str], str] = staticmethod(lambda url: url)

    def __init__(self, index: Index, workdir: Path, env: Mapping[str, str] | None = None) -> None:
        super().__init__(index, workdir)
        self.env = dict(env or {})

    def start(self) -> None:
        gateway_dir = self.workdir / "gateway"
        # cwd: "python -m proxy" looks in the working directory first, which would beat a tree on PYTHONPATH
        # (bench/uvab.py's trees); the servers run in their workdir already.
        subprocess.run([*TUFPROXY, "gateway", "init", str(gateway_dir)], check=True, capture_output=True,
                       cwd=self.workdir, env={**os.environ, **self.env})
        gw_port, edge_port = free_port(), free_port()
        gateway = Server("gateway", [*TUFPROXY, "gateway", "serve", str(gateway_dir), "--index-url", self.index.url,
                                     "--listen", f"127.0.0.1:{gw_port}"], self.workdir / "gw",
                         f"http://127.0.0.1:{gw_port}/readyz", env=self.env)
        self.servers.append(gateway)
        edge = Server("edge", [*TUFPROXY, "serve", "--profile", "gateway", "--upstream",
                               self.gateway_via(f"http://127.0.0.1:{gw_port}/"),
                               "--root", str(gateway_dir / "public" / "metadata" / "1.root.json"),
                               "--cache-dir", str(self.workdir / "edge-cache"), "--listen", f"127.0.0.1:{edge_port}"],
                      self.workdir / "edge", f"http://127.0.0.1:{edge_port}/readyz", env=self.env)
        self.servers.append(edge)
        self.url = f"http://127.0.0.1:{edge_port}/simple/"
        self.gateway_url = f"http://127.0.0.1:{gw_port}/"


class GatewayOnly(Tufproxy):
    """The same gateway with the clients pointed straight at it (its plain pages, no edge): what the edge
    hop costs, where the gap between this setup and ``tufproxy`` is."""

    name = "gateway"

    def start(self) -> None:
        super().start()
        self.url = f"{self.gateway_url}simple/"


class Proxpi(Setup):
    name = "proxpi"

    def start(self) -> None:
        port = free_port()
        env = {"PROXPI_INDEX_URL": self.index.url, "PROXPI_CACHE_DIR": str(self.workdir / "cache"),
               "PROXPI_DISABLE_INDEX_SSL_VERIFICATION": "1"}
        argv = [str(venv_bin("gunicorn")), "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "16",
                "--log-level", "warning", "proxpi.server:app"]
        self.servers.append(Server("proxpi", argv, self.workdir, f"http://127.0.0.1:{port}/", env=env))
        self.url = f"http://127.0.0.1:{port}/index/"


class Devpi(Setup):
    name = "devpi"

    def start(self) -> None:
        port = free_port()
        serverdir = self.workdir / "server"
        subprocess.run([str(venv_bin("devpi-init")), "--serverdir", str(serverdir), "--no-root-pypi",
                        "--root-passwd", "bench"], check=True, capture_output=True, timeout=120)
        logcfg = self.workdir / "logging.json"
        logcfg.write_text(json.dumps({"version": 1, "handlers": {"err": {"class": "logging.StreamHandler"}},
                                      "root": {"level": "WARNING", "handlers": ["err"]}}))
        base = f"http://127.0.0.1:{port}/"
        self.servers.append(Server("devpi", [str(venv_bin("devpi-server")), "--serverdir", str(serverdir), "--host",
                                             "127.0.0.1", "--port", str(port), "--logger-cfg", str(logcfg)],
                                   self.workdir, f"{base}+api"))
        client = ["--clientdir", str(self.workdir / "client")]
        for args in (["use", base], ["login", "root", "--password", "bench"],
                     ["index", "-c", "up", "type=mirror", f"mirror_url={self.index.url}"]):
            subprocess.run([str(venv_bin("devpi")), *client, *args], check=True, capture_output=True, timeout=120)
        self.url = f"{base}root/up/+simple/"


def install(client: str, url: str, target: Path, tmp: Path | None = None,
            requirements: Sequence[str] = REQUIREMENTS) -> tuple[float, dict[str, float]]:
    """Seconds for ``client`` to install ``requirements`` from ``url`` into an empty ``target``, no cache,
    with ``TMPDIR`` at ``tmp``; and uv's phases (:func:`uv_phases`; none for pip)."""
    shutil.rmtree(target, ignore_errors=True)
    if client == "pip":
        argv = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "install", "-q",
                "--no-cache-dir", "--no-compile", "--index-url", url, "--target", str(target), *requirements]
    else:  # not -q: uv's summary lines time its phases
        argv = [str(Path(sys.executable).parent / "uv"), "pip", "install", "--no-cache", "--python",
                sys.executable, "--index-url", url, "--target", str(target), *requirements]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"{client} via {url}: {(done.stdout + done.stderr)[-500:]}")
    return took, uv_phases(done.stderr) if client == "uv" else {}


def uv_phases(output: str) -> dict[str, float]:
    """Seconds of each phase uv's summary lines name ("Resolved 19 packages in 284ms", "... in 1.02s")."""
    return {m[1]: float(m[2]) / (1000 if m[3] == "ms" else 1) for m in _UV_PHASE.finditer(output)}


def client_dir(given: Path | None, fallback: Path) -> tuple[Path, str]:
    """Where the clients' target and TMPDIR go, and how the results describe it."""
    if given is not None:
        return given, str(given)
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="bench-install-", dir=shm)), "tmpfs (/dev/shm)"
    return fallback, f"{fallback} (no /dev/shm)"


def _timed(method: str, url: str,
           accept: str = "application/vnd.pypi.simple.v1+json") -> tuple[float, float, int, str | None]:
    """(seconds to the first body byte, seconds to the end, status, Server-Timing) of one request on a new
    connection."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    started = time.monotonic()
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request(method, parts.path, headers={"Accept": accept})
        resp = conn.getresponse()
        resp.read(1)
        first = time.monotonic() - started
        resp.read()
        return first, time.monotonic() - started, resp.status, resp.getheader("Server-Timing")
    finally:
        conn.close()


# What each phase of a miss answer's Server-Timing (proxy.util.timing) is, as the table says it.
PHASES = {
    "index": "index page fetched and screened",
    "accept": "policy, pins, page rendered",
    "batch-wait": "waiting for its signing batch to start",
    "sign": "signing: pages rendered, bin-n, snapshot and timestamp signed",
    "write": "metadata and page files written and fsynced",
    "lookup": "edge: lookup in the metadata it trusted before (the project's bin-n)",
    "publish": "edge -> gateway publish exchange, what was left of it when the lookup ended (asked ahead)",
    "refresh": "edge: refresh of timestamp and snapshot to the version the gateway named",
    "relookup": "edge: lookup again (the new bin-n)",
    "page": "edge: page fetched from the gateway and verified",
}


def _said(header: str | None) -> list[tuple[str, float]]:
    """The rows of a miss answer's Server-Timing, the gateway's relayed by an edge set in under it."""
    from proxy.util.timing import parse

    return [(f"{'of which, at the gateway' if name.startswith('gw-') else 'of which'}: "
             f"{PHASES.get(name.removeprefix('gw-'), name)}", seconds) for name, seconds in parse(header)]


def phases(index: Index, workdir: Path, projects: dict[str, list[Dist]]) -> list[tuple[str, float]]:
    """One cold miss through edge -> gateway, taken apart from outside by asking each hop in turn."""
    setup = Tufproxy(index, workdir)
    setup.fresh()
    try:
        gateway = setup.gateway_url
        edge = setup.url.removesuffix("simple/")
        names = iter(sorted(projects))
        a, b = next(names), next(names)
        big = max(projects[b], key=lambda d: len(d.data))
        out = [("index page fetched directly", _timed("GET", f"{index.url}{a}/")[1])]
        _, took, _, said = _timed("POST", f"{gateway}_tufproxy/publish/{a}")
        out += [("gateway publish of a new project, in all", took), *_said(said)]
        _, took, _, said = _timed("GET", f"{edge}simple/{b}/")
        out += [("edge miss of another new project, in all", took), *_said(said)]
        out.append(("the same page again (warm)", _timed("GET", f"{edge}simple/{b}/")[1]))
        first, done, _, _ = _timed("GET", f"{edge}packages/{b}/{big.filename}", accept="*/*")
        out += [(f"cold file through edge -> gateway, first byte ({len(big.data) / 1e6:.1f} MB)", first),
                ("cold file, done", done)]
        _, direct_done, _, _ = _timed("GET", f"http://127.0.0.1:{index.port}/files/{big.filename}", "*/*")
        out += [("the same file from the index directly, done", direct_done)]
        return out
    finally:
        setup.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rtt-ms", type=float, default=40.0, help="delay before every index answer (default 40)")
    ap.add_argument("--only", default="direct,tufproxy,proxpi,devpi",
                    help="setups: direct, tufproxy, proxpi, devpi, floor (the index with no delay), gateway (tufproxy's "
                         "gateway alone, no edge)")
    ap.add_argument("--client-dir", type=Path, default=None,
                    help="the clients' target and TMPDIR (default: a directory on /dev/shm, tmpfs, if there is one)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "install.md")
    args = ap.parse_args()
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    projects = load(fetch_corpus(log))
    index = Index(projects, args.rtt_ms / 1000)
    wanted = args.only.split(",")
    if {"proxpi", "devpi"} & set(wanted) and (why := ensure_venv(log)):
        log(f"peers unavailable: {why}")
        wanted = [w for w in wanted if w not in ("proxpi", "devpi")]
    kinds = {c.name: c for c in (Direct, Tufproxy, Proxpi, Devpi, Floor, GatewayOnly)}
    times: dict[tuple[str, str, str], list[float]] = {}
    uv_parts: dict[tuple[str, str, str], list[float]] = {}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp:
        work = Path(tmp)
        clients, args.client_where = client_dir(args.client_dir, work / "client")
        client_tmp = clients / "tmp"
        client_tmp.mkdir(parents=True, exist_ok=True)
        breakdown = phases(index, work / "phases", projects) if "tufproxy" in wanted else []
        floor = Index(projects, 0.0) if "floor" in wanted else index
        setups = {name: kinds[name](floor if name == "floor" else index, work / name) for name in wanted}
        # Round-robin: each round runs every setup in turn, so a machine whose load drifts (a shared one)
        # drifts under all of them alike, and the ratios compare figures taken minutes apart at most.
        for client in ("pip", "uv"):
            for r in range(args.rounds):
                for name, setup in setups.items():
                    if any(f.startswith(f"{name}:") for f in failures):
                        continue
                    try:
                        setup.fresh()
                        for phase in ("cold", "warm"):
                            took, parts = install(client, setup.url, clients / "target", client_tmp)
                            times.setdefault((name, client, phase), []).append(took)
                            for part, seconds in parts.items():
                                uv_parts.setdefault((name, phase, part), []).append(seconds)
                            shown = " ".join(f"{p.lower()} {parts[p]:.2f}" for p in UV_PHASES if p in parts)
                            log(f"{name:9} {client:3} {phase} round {r + 1}: {took:.2f} s{f' ({shown})' if shown else ''}")
                    except (Unavailable, RuntimeError, subprocess.CalledProcessError) as e:
                        failures.append(f"{name}: {e}")
                        log(f"{name} failed: {e}")
                    finally:
                        setup.stop()
        if args.client_dir is None and clients != work / "client":
            shutil.rmtree(clients, ignore_errors=True)
    write(args, projects, times, failures, wanted, breakdown, uv_parts)


def write(args: argparse.Namespace, projects: dict[str, list[Dist]], times: dict[tuple[str, str, str], list[float]],
          failures: list[str], wanted: list[str], breakdown: list[tuple[str, float]],
          uv_parts: dict[tuple[str, str, str], list[float]] | None = None) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    where = getattr(args, "client_where", None)
    command = (f"`python bench/install.py --rounds {args.rounds} --rtt-ms {args.rtt_ms:g} --only {','.join(wanted)}"
               f"{f' --client-dir {args.client_dir}' if args.client_dir is not None else ''}`")
    lines = [f"# Installs through edge -> gateway, beside direct, proxpi and devpi-server ({time.strftime('%Y-%m-%d')})",
             "", f"{command}; load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.", "",
             f"pip and uv install {' '.join(REQUIREMENTS)} (and their dependencies) into an empty target with no "
             f"client cache, from a local index of {len(projects)} real projects (real wheels, PEP 658 metadata) "
             f"that answers every request after {args.rtt_ms:g} ms. Cold: fresh servers and caches; warm: the same "
             f"servers again. Median seconds of {args.rounds} rounds, each running every setup in turn; the ratio is "
             f"to direct (lower is better).{f' Target and TMPDIR of the clients: {where}.' if where else ''}"
             f"{' floor: the same index with no delay.' if 'floor' in wanted else ''}", "",
             "| setup | pip cold | pip warm | uv cold | uv warm |", "|---|---:|---:|---:|---:|"]
    for name in wanted:
        cells = []
        for client in ("pip", "uv"):
            for phase in ("cold", "warm"):
                value, base = med.get((name, client, phase)), med.get(("direct", client, phase))
                ratio = f" ({value / base:.2f}x)" if value and base and name != "direct" else ""
                cells.append("-" if value is None else f"{value:.2f}{ratio}")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    if uv_parts:
        lines += ["", "uv's own account of those runs: median seconds of its phases (resolve: index pages and metadata; "
                  "prepare: download and unpack the wheels; install: into the target), wall time less them being "
                  "its start-up:", "",
                  "| setup | cold resolve | cold prepare | cold install | warm resolve | warm prepare | warm install |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name in wanted:
            cells = [f"{statistics.median(v):.2f}" if (v := uv_parts.get((name, phase, part))) else "-"
                     for phase in ("cold", "warm") for part in UV_PHASES]
            if any(c != "-" for c in cells):
                lines.append(f"| {name} | {' | '.join(cells)} |")
    if breakdown:
        lines += ["", "One cold miss through edge -> gateway, each hop asked in turn on a new connection (seconds):", "",
                  "| step | seconds |", "|---|---:|", *(f"| {step} | {s:.3f} |" for step, s in breakdown)]
    if failures:
        lines += ["", "Failures:", *(f"- {f}" for f in failures)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
