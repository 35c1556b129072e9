"""One measurement each: what a client sees, timed from outside the server.

Every load runs in its own process (pip, wrk, curl), so the proxy under
test never shares an interpreter with its client; tufproxy's metadata cost
is measured by ``bench/metacost.py``, also a process of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PIP_TIMEOUT = 600
WRK_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01"


class MeasureError(Exception):
    """A client run failed or saw errors: the figure would be meaningless."""


def _clean_env() -> dict[str, str]:
    # The machine's pip config adds find-links and extra indexes: none may leak in.
    return {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}


def pip_download(index_url: str, projects: tuple[str, ...], expect_bytes: int) -> float:
    """Seconds for ``pip download --no-deps`` of every project into an empty dir."""
    with tempfile.TemporaryDirectory(prefix="bench-pip-") as dest:
        argv = [sys.executable, "-m", "pip", "download", "--isolated", "--no-cache-dir", "--no-deps",
                "--disable-pip-version-check", "--progress-bar", "off", "-q", "-d", dest,
                "--index-url", index_url, *projects]
        t0 = time.perf_counter()
        r = subprocess.run(argv, capture_output=True, text=True, env=_clean_env(), timeout=PIP_TIMEOUT)
        elapsed = time.perf_counter() - t0
        if r.returncode != 0:
            raise MeasureError(f"pip download failed: {(r.stdout + r.stderr)[-500:]}")
        got = sum(p.stat().st_size for p in Path(dest).iterdir())
        if got != expect_bytes:
            raise MeasureError(f"pip download fetched {got} bytes, expected {expect_bytes}")
    return elapsed


@dataclass(frozen=True)
class Load:
    """One wrk run: requests per second and latency percentiles (ms)."""

    rps: float
    p50_ms: float
    p99_ms: float


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not m:
        raise MeasureError(f"unreadable wrk latency {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _wrk(url: str, connections: int, seconds: float, *extra: str) -> tuple[str, float]:
    """Run wrk (keep-alive, at most 2 threads); its output and requests per second."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise MeasureError("wrk not installed (apt-get install -y wrk)")
    r = subprocess.run([wrk, "-t", str(min(2, connections)), "-c", str(connections), "-d", f"{max(1, round(seconds))}s",
                        "--timeout", "10s", *extra, url], capture_output=True, text=True, timeout=seconds + 60)
    out = r.stdout
    if r.returncode != 0 or "Requests/sec" not in out:
        raise MeasureError(f"wrk failed: {(out + r.stderr)[-400:]}")
    if "Non-2xx" in out or "Socket errors" in out:
        raise MeasureError(f"wrk saw errors: {out[-400:]}")
    return out, float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]


def wrk_pages(base: str, paths: list[str], connections: int, seconds: float, workdir: Path) -> Load:
    """Keep-alive GETs rotating over ``paths`` with pip's Accept header, via wrk."""
    script = workdir / "pages.lua"
    quoted = ", ".join(f'"{p}"' for p in paths)
    script.write_text(f"""
local paths = {{{quoted}}}
local i = 0
wrk.headers["Accept"] = "{WRK_ACCEPT}"
request = function()
  i = i % #paths + 1
  return wrk.format("GET", paths[i])
end
""")
    out, rps = _wrk(base, connections, seconds, "--latency", "-s", str(script))
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    return Load(rps, p50, p99)


def wrk_file(url: str, size: int, connections: int, seconds: float) -> float:
    """MB/s of keep-alive GETs of one file over ``connections`` connections, via wrk (bodies discarded)."""
    return _wrk(url, connections, seconds)[1] * size / 1e6


def curl_file(url: str, expect_bytes: int) -> float:
    """Seconds to receive ``url`` in full (following redirects), bytes discarded."""
    r = subprocess.run(["curl", "-s", "-L", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{time_total}", url],
                       capture_output=True, text=True, timeout=600)
    parts = r.stdout.split()
    if r.returncode != 0 or len(parts) != 3 or parts[0] != "200" or int(parts[1]) != expect_bytes:
        raise MeasureError(f"curl {url}: rc={r.returncode} {r.stdout!r} {r.stderr[-200:]!r}")
    return float(parts[2])


# Read and hash in one loop, one thread: the least any verifier must do.
_FLOOR_SCRIPT = """
import hashlib, sys, time, urllib.request
t0 = time.perf_counter()
h = hashlib.sha256()
with urllib.request.urlopen(sys.argv[1], timeout=60) as r:
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    while n := r.readinto(buf):
        h.update(view[:n])
print(h.hexdigest(), time.perf_counter() - t0)
"""


def download_and_hash(url: str, sha256: str) -> float:
    """The physical floor: download straight from the upstream and sha256 the bytes
    (OpenSSL's sha256, as the proxies have) in a process of its own; seconds from
    the request to the digest, interpreter start-up left out."""
    r = subprocess.run([sys.executable, "-c", _FLOOR_SCRIPT, url], capture_output=True, text=True, timeout=600)
    parts = r.stdout.split()
    if r.returncode != 0 or len(parts) != 2 or parts[0] != sha256:
        raise MeasureError(f"floor download of {url} failed or hashed wrong: {(r.stdout + r.stderr)[-200:]!r}")
    return float(parts[1])


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class MetadataCost:
    """tufproxy's trust core against the upstream over HTTP (medians, ms)."""

    snapshot_bytes: int
    refresh_ms: float
    first_lookup_ms: float
    warm_lookup_ms: float


def metadata_cost(upstream: str, corpus, repeats: int, src: Path) -> MetadataCost:  # type: ignore[no-untyped-def]
    """Run bench/metacost.py against ``upstream`` with the tufproxy source at ``src``."""
    paths = [f"packages/{p}/{p.replace('-', '_')}-1.0-py3-none-any.whl" for p in corpus.projects[:8]]
    argv = [sys.executable, str(Path(__file__).with_name("metacost.py")), upstream, str(corpus.root_file), str(repeats), *paths]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(src)})
    if r.returncode != 0:
        raise MeasureError(f"metacost failed: {r.stderr[-400:]}")
    figures = json.loads(r.stdout)
    snapshot = max((corpus.public_dir / "metadata").glob("*.snapshot.json"), key=lambda p: int(p.name.split(".")[0]))
    return MetadataCost(snapshot.stat().st_size, figures["refresh_ms"], figures["first_lookup_ms"], figures["warm_lookup_ms"])
