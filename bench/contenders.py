"""The processes under test: the static upstream and each proxy in front of it.

Every contender is a real server process on 127.0.0.1 with its own work
directory, started the way its documentation says and tuned alike (one
process or one worker each), so the figures compare the programs, not their
deployment.  ``fresh()`` gives a contender an empty cache (a restart on a
wiped directory, or a new mirror index for devpi), and the peak RSS of every
instance is kept across restarts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urljoin

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv"
# Peers are pinned to the versions this harness was written against.
PEERS = ("proxpi==1.3.1", "gunicorn==27.0.1", "devpi-server==6.20.3", "devpi-client==7.3.0")
START_TIMEOUT = 60.0
PIP_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01"


class Unavailable(Exception):
    """A contender cannot be installed or started here: it is skipped, with this reason."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 30.0, accept: str = PIP_ACCEPT) -> tuple[int, bytes, str]:
    """(status, body, final URL); HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), r.geturl()
    except urllib.error.HTTPError as e:
        return e.code, e.read(), url


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` and its descendants (those alive now)."""
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0.0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user, system = user + int(fields[11]) / tick, system + int(fields[12]) / tick
    return user, system


def peak_rss_mb(pid: int) -> float:
    """Sum of VmHWM (peak resident set) over the process tree, in MB."""
    total = 0
    for p in _tree(pid):
        try:
            m = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{p}/status").read_text())
        except OSError:
            continue
        total += int(m.group(1)) if m else 0
    return total / 1000


class Server:
    """One server process: started, polled until ready, peak RSS read, stopped."""

    def __init__(self, name: str, argv: list[str], workdir: Path, ready_url: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - open for the process's life
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir,
                                     env={**os.environ, **(env or {})}, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise Unavailable(f"{name} exited at start ({self.proc.returncode}): {self._tail()}")
            try:
                if http_get(ready_url, timeout=2, accept="*/*")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise Unavailable(f"{name} not ready within {START_TIMEOUT:.0f}s: {self._tail()}")
            time.sleep(0.05)  # polling a port, not synchronising with our own code

    def _tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-400:].strip().replace("\n", " | ")

    def peak_rss_mb(self) -> float:
        return peak_rss_mb(self.proc.pid)

    def stop(self) -> float:
        """Stop it; return its peak RSS (MB)."""
        rss = self.peak_rss_mb() if self.proc.poll() is None else 0.0
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()
        return rss


def _nginx_conf(workdir: Path, port: int, body: str) -> Path:
    for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (workdir / "tmp" / d).mkdir(parents=True, exist_ok=True)
    conf = workdir / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  include /etc/nginx/mime.types;
  default_type application/octet-stream;
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 1000000;
  client_body_temp_path {workdir}/tmp/client_body;
  proxy_temp_path {workdir}/tmp/proxy;
  fastcgi_temp_path {workdir}/tmp/fastcgi;
  uwsgi_temp_path {workdir}/tmp/uwsgi;
  scgi_temp_path {workdir}/tmp/scgi;
  {body}
}}
""")
    return conf


def nginx_argv(conf: Path, workdir: Path) -> list[str]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        raise Unavailable("nginx not installed (apt-get install -y nginx)")
    return [nginx, "-p", str(workdir), "-c", str(conf), "-e", str(workdir / "error.log")]


class Upstream:
    """The signed tree served as static files by nginx: every contender's origin."""

    def __init__(self, public: Path, workdir: Path, rate: str | None = None) -> None:
        """``rate``: nginx ``limit_rate`` per connection (e.g. ``12m``), a mirror slower than the disk."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        limit = f"limit_rate {rate};" if rate else ""
        conf = _nginx_conf(workdir, self.port, f"""
  server {{
    listen 127.0.0.1:{self.port} backlog=4096;
    root {public};
    index index.html;
    location / {{ try_files $uri $uri/ =404; {limit} }}
  }}""")
        self.server = Server("upstream", nginx_argv(conf, workdir), workdir, f"{self.url}simple/")

    def stop(self) -> None:
        self.server.stop()


class Contender:
    """A proxy (or none) in front of the upstream, seen the way pip sees it."""

    name = "?"
    note = ""

    def __init__(self, upstream: Upstream, corpus, workdir: Path, src: Path = HERE.parent) -> None:  # type: ignore[no-untyped-def]
        self.src = src  # the tufproxy source tree under test
        self.upstream = upstream
        self.corpus = corpus
        self.workdir = workdir
        self.server: Server | None = None
        self.peak_rss = 0.0
        self.index_url = ""

    # subclasses: start the process on an empty cache, set self.index_url
    def _start(self, workdir: Path) -> None:
        raise NotImplementedError

    def fresh(self) -> None:
        """Make the cache cold: by default, stop, wipe the work dir, start again."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        self._start(self.workdir)

    def stop(self) -> None:
        if self.server is not None:
            self.peak_rss = max(self.peak_rss, self.server.stop())
            self.server = None

    def current_rss(self) -> float:
        return self.server.peak_rss_mb() if self.server else 0.0

    @property
    def pid(self) -> int | None:
        return self.server.proc.pid if self.server else None

    def page_url(self, project: str) -> str:
        return f"{self.index_url}{project}/"

    def file_url(self, project: str, filename: str) -> str:
        """The link this contender's page gives for ``filename`` (fetching the page)."""
        status, body, final = http_get(self.page_url(project), accept="text/html")
        if status != 200:
            raise Unavailable(f"{self.name}: page of {project} answered {status}")
        m = re.search(rb'href="([^"#]*' + re.escape(filename.encode()) + rb')[#"]', body)
        if not m:
            raise Unavailable(f"{self.name}: no link to {filename} on the page of {project}")
        return urljoin(final, m.group(1).decode().replace("&amp;", "&"))


class Direct(Contender):
    name = "direct"
    note = "pip straight at the static upstream (no proxy, no cache, no verification)"

    def _start(self, workdir: Path) -> None:
        self.index_url = f"{self.upstream.url}simple/"

    def fresh(self) -> None:
        self._start(self.workdir)


class Tufproxy(Contender):
    name = "tufproxy"
    note = "tufproxy serve --upstream --workers 2 (two asyncio processes on one port), every page and file verified"
    # Two processes, as the warm-path targets are stated; bench/workers.py measures other N.
    extra_args: tuple[str, ...] = ("--workers", "2")

    def _start(self, workdir: Path) -> None:
        port = free_port()
        argv = [sys.executable, "-m", "proxy", "serve", "--upstream", self.upstream.url,
                "--root", str(self.corpus.root_file), "--cache-dir", str(workdir / "cache"),
                "--listen", f"127.0.0.1:{port}", "--audit-log", str(workdir / "audit.log"),
                "--log-level", "warning", "--refresh-interval", "600", *self.extra_args]
        base = f"http://127.0.0.1:{port}/"
        self.server = Server("tufproxy", argv, workdir, f"{base}readyz",
                             env={"PYTHONPATH": str(self.src)})
        self.index_url = f"{base}simple/"


class NginxCache(Contender):
    name = "nginx"
    note = "nginx proxy_cache (1 worker), caches whatever the upstream sends"

    def _start(self, workdir: Path) -> None:
        port = free_port()
        up = self.upstream.port
        conf = _nginx_conf(workdir, port, f"""
  proxy_cache_path {workdir}/cache levels=1:2 keys_zone=pkgs:10m max_size=10g inactive=1d use_temp_path=off;
  upstream origin {{ server 127.0.0.1:{up}; keepalive 32; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host 127.0.0.1:{up};
      proxy_cache pkgs;
      proxy_cache_valid 200 301 1d;
      proxy_cache_lock on;
      proxy_cache_lock_timeout 300s;
    }}
  }}""")
        self.server = Server("nginx", nginx_argv(conf, workdir), workdir, f"http://127.0.0.1:{port}/simple/")
        self.index_url = f"http://127.0.0.1:{port}/simple/"


def venv_bin(name: str) -> Path:
    return VENV / "bin" / name


def ensure_venv(log=print) -> str | None:  # type: ignore[no-untyped-def]
    """Create bench/.venv with the peers; None when ready, else why it could not be."""
    if all(venv_bin(n).exists() for n in ("gunicorn", "devpi-server", "devpi-init", "devpi")) and \
            subprocess.run([venv_bin("python"), "-c", "import proxpi.server"], capture_output=True).returncode == 0:
        return None
    log(f"installing the peers into {VENV}: {' '.join(PEERS)} ...")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True)
        subprocess.run([venv_bin("python"), "-m", "pip", "install", "-q", *PEERS], check=True, capture_output=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        out = getattr(e, "stderr", b"") or b""
        return f"pip install of the peers failed: {out.decode(errors='replace')[-300:]}"
    return None


class Proxpi(Contender):
    name = "proxpi"
    note = "proxpi under gunicorn, 1 worker x 16 threads (its cache is per process)"

    def _start(self, workdir: Path) -> None:
        port = free_port()
        env = {"PROXPI_INDEX_URL": f"{self.upstream.url}simple/", "PROXPI_CACHE_DIR": str(workdir / "cache"),
               "PROXPI_LOGGING_LEVEL": "WARNING"}
        argv = [str(venv_bin("gunicorn")), "--workers", "1", "--threads", "16", "--bind", f"127.0.0.1:{port}",
                "--keep-alive", "75", "--log-level", "warning", "proxpi.server:app"]
        self.server = Server("proxpi", argv, workdir, f"http://127.0.0.1:{port}/", env=env)
        self.index_url = f"http://127.0.0.1:{port}/index/"


class Devpi(Contender):
    name = "devpi"
    note = "devpi-server (waitress, 50 threads); each cold run is a new mirror index of the upstream"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._indexes = 0
        self._base = ""

    def _devpi(self, *args: str) -> None:
        r = subprocess.run([str(venv_bin("devpi")), "--clientdir", str(self.workdir / "client"), *args],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise Unavailable(f"devpi {' '.join(args[:2])} failed: {(r.stdout + r.stderr)[-300:]}")

    def _start(self, workdir: Path) -> None:
        port = free_port()
        serverdir = workdir / "server"
        r = subprocess.run([str(venv_bin("devpi-init")), "--serverdir", str(serverdir), "--no-root-pypi",
                            "--root-passwd", "bench"], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise Unavailable(f"devpi-init failed: {(r.stdout + r.stderr)[-300:]}")
        # Warnings only, like the others: its default logs a line per request.
        logcfg = workdir / "logging.json"
        logcfg.write_text(json.dumps({"version": 1, "handlers": {"err": {"class": "logging.StreamHandler"}},
                                      "root": {"level": "WARNING", "handlers": ["err"]}}))
        argv = [str(venv_bin("devpi-server")), "--serverdir", str(serverdir), "--host", "127.0.0.1",
                "--port", str(port), "--logger-cfg", str(logcfg)]
        self._base = f"http://127.0.0.1:{port}/"
        self.server = Server("devpi", argv, workdir, f"{self._base}+api")
        self._devpi("use", self._base)
        self._devpi("login", "root", "--password", "bench")
        self._new_index()

    def _new_index(self) -> None:
        self._indexes += 1
        name = f"up{self._indexes}"
        self._devpi("index", "-c", name, "type=mirror", f"mirror_url={self.upstream.url}simple/")
        self.index_url = f"{self._base}root/{name}/+simple/"

    def fresh(self) -> None:
        if self.server is None:
            super().fresh()
        else:
            self._new_index()


ALL = (Tufproxy, Proxpi, Devpi, NginxCache, Direct)
NEEDS_VENV = {"proxpi", "devpi"}
