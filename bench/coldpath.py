"""tufproxy's cold path against issue 18's targets (tufproxy alone; run.py puts them in the Targets).

* **First byte after the mirror's**: a mirror of 12 MB/s per connection
  (nginx ``limit_rate``) serves the corpus's large wheel; the first body
  byte straight from it, then through a cold tufproxy (``bench/stream.py``'s
  ``first_byte``); the gap between the two, whatever the file's size.
* **Peak RSS with 50 concurrent cold 200 MB downloads**: a repository of 50
  distinct 200 MB targets (one wheel under 50 version numbers, hard links,
  built once into ``bench/.cache/fanout``) behind a mirror of 4 MB/s per
  connection, so all 50 stay in flight; 50 ``curl`` clients at once; the
  proxy's peak resident set (VmHWM) once all 50 temp files have been
  growing for ``HOLD`` seconds.  The downloads are stopped then: finishing
  10 GB would take minutes and add nothing (the memory per download is
  fixed by the fetch's buffers, not the file's size).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import contenders as C  # noqa: E402
import corpus as corpus_mod  # noqa: E402
from stream import first_byte  # noqa: E402

FIRST_BYTE_RATE = "12m"
FANOUT = 50
FANOUT_SIZE = 200 * 10**6
FANOUT_RATE = "4m"
HOLD = 8.0
# All 50 downloads must be in flight within this long, or the scenario failed.
START_WITHIN = 120.0


class ColdError(Exception):
    """A cold-path scenario could not be measured."""


@dataclass
class ColdPath:
    """What the cold-path scenarios measured (medians; None: not measured)."""

    first_byte_gap_s: float | None = None
    mirror_first_s: float | None = None
    proxy_first_s: float | None = None
    fanout_rss_mb: float | None = None
    fanout_in_flight: int = 0
    sha512_s: float | None = None  # sha512 alone over the large wheel, in memory, one thread
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Fanout:
    public: Path
    root_file: Path
    paths: tuple[str, ...]


class _Proxy(C.Tufproxy):
    """tufproxy with room for 50 downloads at once from one mirror and in the cache."""

    extra_args = ("--workers", "1", "--mirror-downloads", str(FANOUT + 14), "--cache-size", "40G")


def fanout_repo(cache: Path, log=print) -> _Fanout:  # type: ignore[no-untyped-def]
    """50 signed 200 MB targets (cached across runs)."""
    from proxy.repository import Repository
    from tests.support.faults import sized_wheel

    base = cache / "fanout"
    done = base / "built"
    if not done.exists():
        log(f"building the fan-out repository ({FANOUT} targets of {FANOUT_SIZE / 1e6:.0f} MB, hard links) ...")
        subprocess.run(["rm", "-rf", str(base)], check=True)
        dists = base / "dists"
        first = sized_wheel(dists, "fat", "1.0", FANOUT_SIZE)
        wheels = [first]
        for i in range(1, FANOUT):
            link = dists / first.name.replace("-1.0-", f"-1.0.{i}-")
            os.link(first, link)
            wheels.append(link)
        repo = Repository.init(base / "repo", bins=16)
        repo.add(wheels)
        (base / "root.json").write_bytes((repo.metadata_dir / "1.root.json").read_bytes())
        done.write_text("ok\n")
    public = base / "repo" / "public"
    paths = tuple(sorted(f"packages/fat/{p.name}" for p in (public / "packages" / "fat").glob("fat-*.whl")))
    if len(paths) != FANOUT:
        raise ColdError(f"fan-out repository has {len(paths)} wheels, not {FANOUT}: remove {base}")
    return _Fanout(public, base / "root.json", paths)


def measure(corp: Any, cache: Path, work: Path, src: Path, repeats: int, log=print) -> ColdPath:  # type: ignore[no-untyped-def]
    out = ColdPath(sha512_s=_sha512_seconds(corp.public_dir / "packages" / corpus_mod.LARGE_PROJECT / corp.large_file))
    errors = []
    try:
        out.mirror_first_s, out.proxy_first_s, out.first_byte_gap_s = _first_byte(corp, work / "first", src, repeats, log)
    except (ColdError, C.Unavailable, OSError) as e:
        errors.append(f"first byte: {e}")
    try:
        out.fanout_rss_mb, out.fanout_in_flight = _fanout(fanout_repo(cache, log), work / "fanout", src, log)
    except (ColdError, C.Unavailable, OSError) as e:
        errors.append(f"50 concurrent downloads: {e}")
    out.errors = tuple(errors)
    return out


def _sha512_seconds(path: Path) -> float:
    """What the slowest signed digest costs by itself: a bound the floor (sha256 only) does not pay."""
    data = path.read_bytes()
    start = time.perf_counter()
    hashlib.sha512(data).digest()
    return time.perf_counter() - start


def _first_byte(corp: Any, work: Path, src: Path, repeats: int, log) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    slow = C.Upstream(corp.public_dir, work / "mirror", rate=FIRST_BYTE_RATE)
    proxy = C.Tufproxy(slow, corp, work / "tufproxy", src)
    try:
        mirror, through, gaps = [], [], []
        for _ in range(repeats):
            direct = asyncio.run(first_byte(f"{slow.url}packages/{corpus_mod.LARGE_PROJECT}/{corp.large_file}"))
            proxy.fresh()
            url = proxy.file_url(corpus_mod.LARGE_PROJECT, corp.large_file)  # the page only: the file stays cold
            proxied = asyncio.run(first_byte(url))
            mirror.append(direct)
            through.append(proxied)
            gaps.append(proxied - direct)
    finally:
        proxy.stop()
        slow.stop()
    log(f"  first byte, {FIRST_BYTE_RATE} mirror: {statistics.median(through):.2f}s through tufproxy, "
        f"{statistics.median(mirror):.3f}s from the mirror")
    return statistics.median(mirror), statistics.median(through), statistics.median(gaps)


def _fanout(fan: _Fanout, work: Path, src: Path, log) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    slow = C.Upstream(fan.public, work / "mirror", rate=FANOUT_RATE)
    proxy = _Proxy(slow, fan, work / "tufproxy", src)
    clients: list[subprocess.Popen[bytes]] = []
    try:
        proxy.fresh()
        base = proxy.index_url.removesuffix("simple/")
        clients = [subprocess.Popen(["curl", "-s", "-o", "/dev/null", "--max-time", str(int(START_WITHIN + HOLD)),
                                     base + path], stdin=subprocess.DEVNULL) for path in fan.paths]
        tmp = work / "tufproxy" / "cache" / "tmp"
        deadline = time.monotonic() + START_WITHIN
        in_flight = 0
        # Every download has its temp file and has received bytes: all 50 really at once.
        while in_flight < FANOUT:
            in_flight = sum(1 for p in tmp.glob("*.part") if p.stat().st_size > 0)
            if time.monotonic() > deadline:
                raise ColdError(f"only {in_flight} of {FANOUT} downloads in flight after {START_WITHIN:.0f}s")
            time.sleep(0.2)  # polling files another process writes
        time.sleep(HOLD)  # the measurement window
        in_flight = sum(1 for p in tmp.glob("*.part") if p.stat().st_size > 0)
        rss = proxy.current_rss()
    finally:
        proxy.stop()
        for c in clients:
            c.kill()
            c.wait()
        slow.stop()
    log(f"  50 concurrent cold {FANOUT_SIZE / 1e6:.0f} MB downloads: peak RSS {rss:.0f} MB ({in_flight} in flight)")
    return rss, in_flight
