"""``tufproxy serve --workers N``: N worker processes on one port, and the supervisor that keeps them.

The supervisor binds the port, forks N workers and then only watches:

* Where the platform has ``SO_REUSEPORT``, each worker listens on a socket
  of its own and the kernel spreads connections across them; the
  supervisor keeps a bound, non-listening socket so the port stays theirs
  while a worker restarts.  Elsewhere the workers accept on one listening
  socket they inherit.
* A worker that dies is restarted; more than ``max(5, N)`` deaths within a
  minute, or a worker failing before the first start completed, stops the
  rest and exits 1.  A worker that cannot start for the operator's reason
  (a :class:`CommandError`: unreadable root, unusable cache) tells the
  supervisor why on the pipe it reports readiness on, and the supervisor
  says it once, as ``serve``'s one error line, and exits 2.
* SIGTERM or SIGINT is forwarded to every worker, which drains: it stops
  accepting, lets in-flight requests finish (at most
  :data:`proxy.serving.serve.DRAIN_SECONDS`), then exits.  Stragglers are killed.
* Workers stop too if the supervisor vanishes: a running one sees the pipe
  whose write end only the supervisor holds close, and drains; one still
  starting (refreshing its metadata) gets SIGTERM from the kernel
  (``PR_SET_PDEATHSIG`` on Linux) and dies at once, instead of going on
  writing a cache no supervisor owns.

Workers share the cache directory (see :mod:`proxy.storage.store`), each keeps
its own trusted metadata (see :func:`proxy.serving.serve.start`), and metrics are
summed across them through prometheus-client's multiprocess files in
``cache/metrics/<host>-<supervisor pid>/``.

What a worker runs is a :class:`WorkerApp`: ``serve``'s proxy here, the
gateway's in :mod:`proxy.cli.gateway`; the supervision is the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import select
import selectors
import shutil
import signal
import socket
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Protocol

from proxy.protocol.errors import EXIT_ERROR, CommandError
from proxy.serving.config import ServeConfig
from proxy.serving.serve import DRAIN_SECONDS, bind, run_loop, start
from proxy.util import metrics
from proxy.util.lifetime import die_with

log = logging.getLogger(__name__)

_RESTART_WINDOW = 60.0
# Past the drain, stragglers get this much more before SIGKILL.
_KILL_GRACE = 5.0
_SIGNALS = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT)
# A worker publishes its gauges (and eviction count) this often, not only when it serves a scrape.
_GAUGE_SYNC = 5.0
# A report on the readiness pipe is one write of at most this many bytes, so reports never interleave.
_PIPE_BUF = select.PIPE_BUF


class WorkersError(CommandError):
    """The workers could not be started or kept running."""


@dataclass
class _Worker:
    index: int
    pid: int
    ready: bool = False


def _reuse_port_works(host: str) -> bool:
    if not hasattr(socket, "SO_REUSEPORT"):
        return False
    try:
        bind(host, 0, reuse_port=True, listen=False).close()
    except OSError:
        return False
    return True


def _metrics_dir(cache_dir: Path) -> tuple[Path, int]:
    """This supervisor's multiprocess-metrics directory (fresh) and the fd locking it.

    Directories of supervisors that are gone (their lock is free) are removed.
    The lock fd is inherited by the workers, so the directory counts as live
    while any of them runs.
    """
    parent = cache_dir / "metrics"
    parent.mkdir(parents=True, exist_ok=True)
    for other in parent.iterdir():
        fd = None
        with contextlib.suppress(OSError):
            fd = os.open(other / ".lock", os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(other, ignore_errors=True)
        if fd is not None:
            os.close(fd)
    mine = parent / f"{socket.gethostname()}-{os.getpid()}"
    shutil.rmtree(mine, ignore_errors=True)
    mine.mkdir()
    fd = os.open(mine / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return mine, fd


@dataclass
class Started:
    """A worker's running app: ``sync`` publishes its gauges, ``stop`` drains it."""

    sync: Callable[[], None]
    stop: Callable[[], Awaitable[None]]
    note: str = ""  # for the line that says the workers serve (the edge's layout)


class WorkerApp(Protocol):
    """What the supervisor runs in each worker."""

    @property
    def listen(self) -> tuple[str, int]: ...

    @property
    def scheme(self) -> str:
        """http, or https when the listener has a certificate."""
        ...

    @property
    def state_dir(self) -> Path:
        """Shared by the workers; multiprocess metrics go under state_dir/metrics."""
        ...

    @property
    def name(self) -> str:
        """For the line that says the workers serve."""
        ...

    async def start(self, sock: socket.socket) -> Started:
        """Serve on ``sock``; a :class:`CommandError` says why it cannot."""
        ...


@dataclass
class ServeApp:
    """``tufproxy serve``'s proxy as a :class:`WorkerApp`."""

    config: ServeConfig
    name: str = "tufproxy serving"

    @property
    def listen(self) -> tuple[str, int]:
        return self.config.listen

    @property
    def scheme(self) -> str:
        return "https" if self.config.tls_cert else "http"

    @property
    def state_dir(self) -> Path:
        return self.config.cache_dir

    async def start(self, sock: socket.socket) -> Started:
        running = await start(self.config, sock)
        return Started(running.proxy.update_gauges, running.stop, running.layout)


async def _worker_main(app: WorkerApp, sock: socket.socket, ready_fd: int, alive_fd: int) -> int:
    try:
        running = await app.start(sock)
    except CommandError as e:
        reason = " ".join(str(e).split())
        os.write(ready_fd, f"{os.getpid()} {reason}\n".encode()[:_PIPE_BUF])
        return EXIT_ERROR
    # Any worker may answer a scrape, which sums every worker's files: keep this one's current.
    sync = running.sync
    sync()
    note = " ".join(running.note.split())
    line = f"{os.getpid()}\t{note}" if note else str(os.getpid())
    os.write(ready_fd, line.encode()[:_PIPE_BUF - 1] + b"\n")
    os.close(ready_fd)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Readable (EOF) only once the supervisor is gone: then drain and go too.
    loop.add_reader(alive_fd, stop.set)
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _GAUGE_SYNC)
            sync()
    finally:
        loop.remove_reader(alive_fd)
        await running.stop()
        sync()  # evictions during the drain count too
    return 0


class Supervisor:
    """Runs N workers of one :class:`WorkerApp` until signalled, or until they keep dying."""

    def __init__(self, app: WorkerApp, workers: int) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.app = app
        self.count = workers
        self.restart_budget = max(5, workers)
        self._workers: dict[int, _Worker] = {}
        self._deaths: list[float] = []
        self._serving = False
        self._stopping = False
        self._deadline = 0.0
        self._ready_buf = b""
        self._start_error: str | None = None
        self.exit_code = 0

    def run(self) -> int:
        """Bind, start the workers, supervise; the exit status."""
        host, port = self.app.listen
        self.reuse_port = _reuse_port_works(host)
        try:
            # Reuseport: a bound, non-listening socket holds the port; workers listen on their own.
            self._sock: socket.socket | None = bind(host, port, reuse_port=self.reuse_port, listen=not self.reuse_port)
        except OSError as e:
            raise WorkersError(f"cannot listen on {host}:{port}: {e.strerror}") from e
        self.port = self._sock.getsockname()[1]
        try:
            self._metrics, self._metrics_lock = _metrics_dir(self.app.state_dir)
        except OSError as e:
            self._sock.close()
            raise WorkersError(f"cache dir {self.app.state_dir} is not usable: {e}") from e
        self._wake_r, self._wake_w = os.pipe()
        self._ready_r, self._ready_w = os.pipe()
        self._note = ""
        self._alive_r, self._alive_w = os.pipe()
        for fd in (self._wake_r, self._wake_w, self._ready_r):
            os.set_blocking(fd, False)
        previous = {sig: signal.signal(sig, lambda *_: None) for sig in _SIGNALS}
        old_wakeup = signal.set_wakeup_fd(self._wake_w)
        self._selector = selectors.DefaultSelector()
        try:
            self._selector.register(self._wake_r, selectors.EVENT_READ)
            self._selector.register(self._ready_r, selectors.EVENT_READ)
            for i in range(self.count):
                self._spawn(i)
            self._loop()
            self._read_reports()  # a last report may still be in the pipe
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._selector.close()
            for fd in (self._wake_r, self._wake_w, self._ready_r, self._ready_w, self._alive_r, self._alive_w):
                os.close(fd)
            self._close_socket()
            shutil.rmtree(self._metrics, ignore_errors=True)
            os.close(self._metrics_lock)
        if self._start_error is not None:
            raise WorkersError(self._start_error)
        return self.exit_code

    # -- the loop ------------------------------------------------------
    def _loop(self) -> None:
        while self._workers:
            waiting = self._stopping and self._deadline != float("inf")
            timeout = max(0.0, self._deadline - time.monotonic()) if waiting else None
            for key, _ in self._selector.select(timeout):
                if key.fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        for signum in os.read(self._wake_r, 256):
                            if signum in (signal.SIGTERM, signal.SIGINT):
                                log.info("signal %s: draining %d worker(s)", signal.Signals(signum).name, len(self._workers))
                                self._stop()
                else:
                    self._read_reports()
            self._reap()
            if self._stopping and time.monotonic() >= self._deadline:
                for w in self._workers.values():
                    log.warning("worker %d (pid %d) still running after the drain: killing it", w.index, w.pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(w.pid, signal.SIGKILL)
                self._deadline = float("inf")

    def _read_reports(self) -> None:
        """Workers' lines on the readiness pipe: ``PID`` or ``PID<TAB>NOTE`` (ready) or ``PID REASON`` (could not
        start)."""
        with contextlib.suppress(BlockingIOError):
            self._ready_buf += os.read(self._ready_r, 4096)
        *lines, self._ready_buf = self._ready_buf.split(b"\n")
        for line in lines:
            head, _, note = line.decode(errors="replace").partition("\t")
            pid, _, reason = head.partition(" ")
            if not reason:
                self._note = self._note or note
                self._ready(int(pid))
            elif not self._serving:
                if self._start_error is None:
                    self._start_error = reason
                self._stop()
            else:
                log.error("worker (pid %s) could not start: %s", pid, reason)

    def _ready(self, pid: int) -> None:
        worker = self._workers.get(pid)
        if worker is None:
            return
        worker.ready = True
        log.info("worker %d ready (pid %d)", worker.index, pid)
        if not self._serving and all(w.ready for w in self._workers.values()) and len(self._workers) == self.count:
            self._serving = True
            mode = "SO_REUSEPORT" if self.reuse_port else "one shared socket"
            note = f"; {self._note}" if self._note else ""
            print(f"{self.app.name} on {self.app.scheme}://{self.app.listen[0]}:{self.port}/simple/ "
                  f"({self.count} workers, {mode}{note})", flush=True)

    def _reap(self) -> None:
        while self._workers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = self._workers.pop(pid, None)
            if worker is None:
                continue
            metrics.mark_process_dead(pid, str(self._metrics))
            if self._stopping:
                continue
            self._died(worker, os.waitstatus_to_exitcode(status))

    def _died(self, worker: _Worker, code: int) -> None:
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
        if not self._serving and not worker.ready:
            if code == EXIT_ERROR:  # it reported why on the pipe: said once, by run()
                self._stop()
                return
            log.error("worker %d exited with %s while starting: stopping", worker.index, how)
            self.exit_code = 1
            self._stop()
            return
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < _RESTART_WINDOW] + [now]
        if len(self._deaths) > self.restart_budget:
            log.error("workers keep dying (%d deaths in %.0fs, the last with %s): stopping",
                      len(self._deaths), _RESTART_WINDOW, how)
            self.exit_code = 1
            self._stop()
            return
        log.warning("worker %d (pid %d) exited with %s: restarting it", worker.index, worker.pid, how)
        self._spawn(worker.index)

    def _stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._deadline = time.monotonic() + DRAIN_SECONDS + _KILL_GRACE
        # No new connections: the workers close their own listeners as they drain.
        self._close_socket()
        for w in self._workers.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, signal.SIGTERM)

    def _close_socket(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # -- workers -------------------------------------------------------
    def _spawn(self, index: int) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:
            self._child(supervisor)
        self._workers[pid] = _Worker(index, pid)
        log.debug("worker %d started (pid %d)", index, pid)

    def _child(self, supervisor: int) -> NoReturn:
        code = 1
        try:
            die_with(supervisor, EXIT_ERROR)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self._selector.close()
            for fd in (self._wake_r, self._wake_w, self._ready_r, self._alive_w):
                os.close(fd)
            metrics.enable_multiprocess(self._metrics)
            assert self._sock is not None
            if self.reuse_port:
                host = self.app.listen[0]
                self._sock.close()
                sock = bind(host, self.port, reuse_port=True, listen=True)
            else:
                sock = self._sock
            # The proxy's workers run on uvloop with --uvloop yes; other apps on asyncio's own loop.
            uvloop = isinstance(self.app, ServeApp) and self.app.config.uvloop
            code = run_loop(_worker_main(self.app, sock, self._ready_w, self._alive_r), uvloop)
        except KeyboardInterrupt:
            code = 130
        except Exception:  # noqa: BLE001 - a worker must never return into the supervisor's code
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def run(config: ServeConfig) -> int:
    """``tufproxy serve`` with ``config.workers`` worker processes; the exit status."""
    return Supervisor(ServeApp(config), config.workers).run()
