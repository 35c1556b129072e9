"""``tufproxy gateway serve`` as a real subprocess on 127.0.0.1, and the miss protocol's client side."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.net import free_port, wait_for_port


class GatewayProcess:
    """Start with :meth:`start`; ``base`` is the URL edges use as ``--upstream``."""

    def __init__(self, directory: Path, *args: str) -> None:
        self.directory = directory
        self.args = args
        self.port = free_port()
        self.log_path = directory.parent / f"gateway-{self.port}.log"
        self.audit_path = directory.parent / f"gateway-{self.port}.audit"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def root(self) -> Path:
        return self.directory / "public" / "metadata" / "1.root.json"

    def start(self) -> GatewayProcess:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "gateway", "serve", str(self.directory), "--listen", f"127.0.0.1:{self.port}",
             "--audit-log", str(self.audit_path), *self.args],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        try:
            wait_for_port(self.port, self.proc)
        except RuntimeError as e:
            raise RuntimeError(f"{e}\n{self.log()}") from None
        return self

    def publish(self, project: str, timeout: float = 30) -> tuple[int, dict]:  # type: ignore[type-arg]
        """POST the miss protocol's request; (status, JSON answer)."""
        req = urllib.request.Request(f"{self.base}_tufproxy/publish/{project}", method="POST", data=b"")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def audit(self) -> list[dict]:  # type: ignore[type-arg]
        if not self.audit_path.exists():
            return []
        return [json.loads(line) for line in self.audit_path.read_text().splitlines() if line.strip()]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self._log.close()
        self.proc = None

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        self.proc.terminate()
        try:
            code = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._log.close()
        self.proc = None
        return code

    def __enter__(self) -> GatewayProcess:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
