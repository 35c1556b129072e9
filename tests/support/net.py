"""Ports and readiness for servers the tests start as subprocesses."""

from __future__ import annotations

import socket
import subprocess
import time


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
