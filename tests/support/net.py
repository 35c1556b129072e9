"""Ports and readiness for servers the tests start as subprocesses."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import time
from collections.abc import Iterator

# Ports handed to servers the tests start: below the kernel's ephemeral range (where bind(0) and outgoing
# connections take theirs), a slice of its own per pytest-xdist worker. A port picked with bind(0) and then
# closed could be taken by anyone before the server bound it: by the other worker's server, whose answers
# then passed for this one's (CI saw a gateway fail with "address already in use" while the test went on
# against another test's gateway).
_FIRST_PORT = 12000
_PORTS_PER_WORKER = 2000


def _ports() -> Iterator[int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    first = _FIRST_PORT + (int(worker) if worker.isdigit() else 0) * _PORTS_PER_WORKER
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    if first + _PORTS_PER_WORKER > ephemeral:
        raise RuntimeError(f"no room for test ports of xdist worker gw{worker} below {ephemeral}")
    return itertools.cycle(range(first, first + _PORTS_PER_WORKER))


_next_ports: Iterator[int] | None = None


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on right now, from this process's own slice (see above)."""
    global _next_ports
    if _next_ports is None:
        _next_ports = _ports()
    for _ in range(_PORTS_PER_WORKER):
        port = next(_next_ports)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free test port left")


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Return once ``port`` accepts connections; fail if ``proc`` exits or time runs out.

    Polls with real connects; between tries it waits on the process itself,
    so an early exit is reported at once instead of after the timeout.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            pass
        try:
            code = proc.wait(timeout=0.02)
        except subprocess.TimeoutExpired:
            continue
        out = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise RuntimeError(f"server exited with {code} before listening: {out[-2000:]}")
    raise RuntimeError(f"nothing listened on port {port} within {timeout}s")
