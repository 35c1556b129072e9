"""``tufproxy gateway serve`` as a real subprocess on 127.0.0.1, and the miss protocol's client side."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.proxyproc import ProxyProcess


class GatewayProcess(ProxyProcess):
    """Start with :meth:`start`; ``base`` is the URL edges use as ``--upstream``."""

    def __init__(self, directory: Path, *args: str) -> None:
        super().__init__(directory, *args)
        self.directory = directory
        self.log_path = directory.parent / f"gateway-{self.port}.log"
        self.audit_path = directory.parent / f"gateway-{self.port}.audit"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "proxy", "gateway", "serve", str(self.directory), "--listen", f"127.0.0.1:{self.port}",
                "--audit-log", str(self.audit_path), *self.args]

    @property
    def root(self) -> Path:
        return self.directory / "public" / "metadata" / "1.root.json"

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

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self._log.close()
        self.proc = None
