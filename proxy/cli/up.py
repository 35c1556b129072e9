"""``tufproxy gateway up``: a gateway and an edge in front of it on one host, in one command.

The organisation's embedded default: DIR is initialised if it is new, the
gateway listens on loopback only, and the edge (``tufproxy serve
--profile gateway``) is what pip and uv talk to.  Each runs as a process
of its own, exactly as the split setup runs them on several hosts (the
docs' gateway guide shows how), so nothing here is a second implementation
of either: this module only starts, watches and stops them.  When either
exits, the other is stopped and the command fails with one line naming it.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from proxy.protocol.errors import CommandError
from proxy.serving.config import ConfigError, parse_listen

READY_TIMEOUT = 60.0


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


class _Child:
    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def wait_ready(self, url: str, stop: threading.Event) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while not _ready(url):
            if self.proc.poll() is not None:
                raise CommandError(f"the {self.name} exited at start (status {self.proc.returncode}); see its log above")
            if stop.is_set():
                raise KeyboardInterrupt
            if time.monotonic() > deadline:
                raise CommandError(f"the {self.name} did not become ready within {READY_TIMEOUT:.0f}s at {url}")
            stop.wait(0.1)  # polling another process's port

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _cmd_up(args: argparse.Namespace) -> int:
    try:
        host, port = parse_listen(args.listen)
        gw_host, gw_port = parse_listen(args.gateway_listen)
    except ConfigError as e:
        raise CommandError(f"--listen: {e}") from e
    directory = Path(args.dir)
    tufproxy = [sys.executable, "-m", "proxy"]
    if not (directory / "public" / "metadata" / "1.root.json").exists():
        done = subprocess.run([*tufproxy, "gateway", "init", str(directory)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise CommandError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "gateway init failed")
        print(f"initialised {directory} (keys in {directory / 'keys'}: keep them safe, and back DIR up)")
    gateway_argv = [*tufproxy, "gateway", "serve", str(directory), "--listen", f"{gw_host}:{gw_port}"]
    for url in args.index_url:
        gateway_argv += ["--index-url", url]
    for url in args.files_origin or ():
        gateway_argv += ["--files-origin", url]
    if args.config is not None:
        gateway_argv += ["--config", str(args.config)]
    gateway_url = f"http://{gw_host}:{gw_port}/"
    edge_argv = [*tufproxy, "serve", "--profile", "gateway", "--upstream", gateway_url,
                 "--root", str(directory / "public" / "metadata" / "1.root.json"),
                 "--cache-dir", str(directory / "edge-cache"), "--listen", f"{host}:{port}",
                 "--audit-log", str(directory / "edge-audit.jsonl")]
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    children: list[_Child] = []
    try:
        children.append(_Child("gateway", gateway_argv))
        children[0].wait_ready(f"{gateway_url}readyz", stop)
        children.append(_Child("edge", edge_argv))
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        children[1].wait_ready(f"http://{shown}:{port}/readyz", stop)
        index_url = f"http://{shown}:{port}/simple/"
        print(f"gateway: {gateway_url} (signs into {directory / 'public'}; loopback only)")
        print(f"edge:    {index_url} (cache {directory / 'edge-cache'}, audit log {directory / 'edge-audit.jsonl'})")
        print("point pip and uv at the edge:")
        print(f"  pip install --index-url {index_url} PROJECT")
        print(f"  uv pip install --index-url {index_url} PROJECT")
        print(f"  pip config set global.index-url {index_url}")
        print(f"  export UV_DEFAULT_INDEX={index_url}")
        print("Ctrl-C stops both.", flush=True)
        while not stop.wait(0.5):
            for child in children:
                if child.proc.poll() is not None:
                    raise CommandError(f"the {child.name} exited (status {child.proc.returncode}); the other was "
                                       "stopped")
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        for child in reversed(children):
            child.stop()


def add_up(sub: argparse._SubParsersAction) -> None:
    """Add ``tufproxy gateway up`` to the gateway's subcommands."""
    p = sub.add_parser(
        "up",
        help="one host: initialise DIR if new, run the gateway and an edge in front of it",
        description="Initialise DIR if it is new, run 'tufproxy gateway serve DIR' on a loopback port and "
        "'tufproxy serve --profile gateway' in front of it, and print the pip and uv lines to use. Ctrl-C stops "
        "both. For more than one host, run the two commands on their own (see the docs' gateway guide).",
    )
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--index-url", action="append", required=True, metavar="URL",
                   help="a plain PEP 503/691 index to take projects from; repeatable (first index wins)")
    p.add_argument("--files-origin", action="append", metavar="URL",
                   help="another origin the index's pages may link files to; repeatable")
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                   help="where the edge listens, for pip and uv (default: 127.0.0.1:8080)")
    p.add_argument("--gateway-listen", default="127.0.0.1:8081", metavar="HOST:PORT",
                   help="where the gateway listens (default: 127.0.0.1:8081)")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="the gateway's TOML settings (policy, timeouts, ...), as 'gateway serve --config' reads them")
    p.set_defaults(func=_cmd_up)
