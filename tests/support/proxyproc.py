"""``tufproxy serve`` as a real subprocess on 127.0.0.1, as users run it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.support.net import free_port, wait_for_port


class ProxyProcess:
    """Start with :meth:`start`; ``url`` is the index URL to give pip."""

    def __init__(self, cache_dir: Path, *args: str, env: dict[str, str] | None = None,
                 prefix: Sequence[str] = ()) -> None:
        self.cache_dir = cache_dir
        self.env = env  # added to this process's environment (None: inherit it as it is)
        self.prefix = tuple(prefix)  # a command that execs the server (e.g. into a private mount namespace)
        self.args = args
        self.port = free_port()
        self.log_path = cache_dir.parent / f"proxy-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def url(self) -> str:
        return f"{self.base}simple/"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "proxy", "serve", "--cache-dir", str(self.cache_dir),
                "--listen", f"127.0.0.1:{self.port}", *self.args]

    def start(self, timeout: float = 20.0) -> ProxyProcess:
        """Start and wait (at most ``timeout`` seconds) until it listens."""
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - open for the process's life
        env = None if self.env is None else {**os.environ, **self.env}
        self.proc = subprocess.Popen([*self.prefix, *self.argv()], stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_for_port(self.port, self.proc, timeout)
        except RuntimeError as e:
            raise RuntimeError(f"{e}\n{self.log()}") from None
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

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

    def __enter__(self) -> ProxyProcess:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
