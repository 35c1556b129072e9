"""Benchmark tufproxy beside proxpi, devpi-server, nginx proxy_cache and no proxy.

One run, one machine, one upstream (``bench/corpus.py``: a signed repository
of real-sized wheels served statically by nginx on 127.0.0.1); every
contender in front of it in turn, every scenario measured for each:

* ``pip download`` of the whole set, cold cache and warm cache;
* warm index pages: req/s, p50 and p99 at 1, 16 and 64 connections (wrk);
* the large wheel: warm MB/s, and cold wall time beside the floor
  (download straight from the upstream + sha256);
* tufproxy's metadata cost: refresh with a 16384-bin snapshot, first
  lookup in an untouched bin;
* peak RSS of each proxy over all of the above;
* tufproxy's cold path (``bench/coldpath.py``): first byte after a slow
  mirror's first byte, peak RSS with 50 concurrent cold 200 MB downloads.

Writes ``bench/results/latest.md`` and ``bench/results/throughput.png`` and
prints a one-screen summary.  ``--quick`` (under 5 minutes once the corpus
and the peers' venv exist) repeats less; ``--full`` uses medians of >= 5
everywhere and longer loads.  See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import coldpath  # noqa: E402
import contenders as C  # noqa: E402
import corpus as corpus_mod  # noqa: E402
import measure as M  # noqa: E402
import report  # noqa: E402

from proxy.util.progress import Meter  # noqa: E402  (corpus put the checkout on sys.path)

CONCURRENCY = (1, 16, 64)
# The warm-path issue's file scenario: a 16 MB wheel over this many keep-alive connections.
MID_PROJECT, MID_CONNECTIONS = "numpy", 8


@dataclass(frozen=True)
class Plan:
    """How many repeats of each scenario (medians are taken over them)."""

    name: str
    pip_cold: int
    pip_warm: int
    load_runs: int
    load_seconds: float
    file_warm: int
    file_cold: int
    floor: int
    metadata: int


QUICK = Plan("quick", pip_cold=3, pip_warm=3, load_runs=3, load_seconds=1.0, file_warm=5, file_cold=3, floor=5, metadata=3)
FULL = Plan("full", pip_cold=5, pip_warm=5, load_runs=5, load_seconds=5.0, file_warm=10, file_cold=5, floor=10, metadata=5)


@dataclass
class Result:
    """Everything measured for one contender (raw samples; medians in the report)."""

    name: str
    note: str
    samples: dict[str, list[float]] = field(default_factory=dict)
    peak_rss_mb: float | None = None
    skipped: str | None = None
    errors: list[str] = field(default_factory=list)

    def add(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)

    def median(self, key: str) -> float | None:
        values = self.samples.get(key)
        return statistics.median(values) if values else None


# The run's progress (scenarios done of all planned, their rate, the time left); lines go above its bar.
# Made in main(): on a terminal, making one draws the bar.
_METER = Meter("benchmark", unit="scenarios", quiet=True)
SCENARIOS = 5  # per contender, in bench_contender


def _log(msg: str) -> None:
    _METER.note(msg)


def _scenario(result: Result, label: str, fn) -> None:  # type: ignore[no-untyped-def]
    """Run one scenario; a failure is recorded for the table, not fatal to the run."""
    try:
        fn()
    except (M.MeasureError, C.Unavailable) as e:
        _log(f"  {result.name}: {label} failed: {e}")
        result.errors.append(f"{label}: {str(e)[:200]}")
    finally:
        _METER.advance()


def bench_contender(contender: C.Contender, corp: corpus_mod.Corpus, plan: Plan, workdir: Path) -> Result:
    res = Result(contender.name, contender.note)
    large_project = corpus_mod.LARGE_PROJECT

    def pip_runs() -> None:
        for i in range(plan.pip_cold):
            contender.fresh()
            res.add("pip_cold", M.pip_download(contender.index_url, corp.projects, corp.total_bytes))
            _log(f"  {contender.name}: pip download cold #{i + 1}: {res.samples['pip_cold'][-1]:.2f}s")
        for _ in range(plan.pip_warm):
            res.add("pip_warm", M.pip_download(contender.index_url, corp.projects, corp.total_bytes))
        _log(f"  {contender.name}: pip download warm: {res.median('pip_warm'):.2f}s")

    def index_load() -> None:
        paths = [urlsplit(contender.page_url(p)).path for p in corp.projects]
        for p in corp.projects:  # warm every page first
            status = C.http_get(contender.page_url(p))[0]
            if status != 200:
                raise M.MeasureError(f"page of {p} answered {status}")
        base = f"{urlsplit(contender.index_url).scheme}://{urlsplit(contender.index_url).netloc}"
        for conns in CONCURRENCY:
            for _ in range(plan.load_runs):
                load = M.wrk_pages(base, paths, conns, plan.load_seconds, workdir)
                res.add(f"rps_{conns}", load.rps)
                res.add(f"p50_{conns}", load.p50_ms)
                res.add(f"p99_{conns}", load.p99_ms)
            _log(f"  {contender.name}: index pages x{conns}: {res.median(f'rps_{conns}'):.0f} req/s")

    def file_warm() -> None:
        url = contender.file_url(large_project, corp.large_file)
        M.curl_file(url, corp.large_size)  # make sure it is cached (and re-checked) first
        for _ in range(plan.file_warm):
            res.add("file_warm", corp.large_size / 1e6 / M.curl_file(url, corp.large_size))
        _log(f"  {contender.name}: large file warm: {res.median('file_warm'):.0f} MB/s")

    def mid_warm() -> None:
        mid = next((corp.public_dir / "packages" / MID_PROJECT).glob(f"{MID_PROJECT}-1.0-*.whl"))
        url = contender.file_url(MID_PROJECT, mid.name)
        M.curl_file(url, mid.stat().st_size)  # cached (and re-checked) first
        for _ in range(plan.load_runs):
            res.add("mid_warm", M.wrk_file(url, mid.stat().st_size, MID_CONNECTIONS, plan.load_seconds))
        _log(f"  {contender.name}: 16 MB wheel warm x{MID_CONNECTIONS}: {res.median('mid_warm'):.0f} MB/s")

    def file_cold() -> None:
        for _ in range(plan.file_cold):
            contender.fresh()
            url = contender.file_url(large_project, corp.large_file)  # the page only: the file stays cold
            res.add("file_cold", M.curl_file(url, corp.large_size))
        _log(f"  {contender.name}: large file cold: {res.median('file_cold'):.2f}s")

    try:
        _scenario(res, "pip download", pip_runs)
        if contender.server is None and contender.name != "direct":
            contender.fresh()
        _scenario(res, "index load", index_load)
        _scenario(res, "warm large file", file_warm)
        _scenario(res, "warm 16 MB wheel", mid_warm)
        _scenario(res, "cold large file", file_cold)
    finally:
        contender.stop()
    res.peak_rss_mb = contender.peak_rss if contender.name != "direct" else None
    return res


def _git(src: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(src), *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _describe(src: Path) -> str:
    """Which tufproxy was measured: its commit (flagging local changes), or else its path."""
    if _git(src, "rev-parse", "--show-toplevel") != str(src):
        return str(src)
    dirty = " with uncommitted changes under proxy/" if _git(src, "status", "--porcelain", "--", "proxy") else ""
    return f"commit {_git(src, 'rev-parse', '--short', 'HEAD')}{dirty}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer repeats and 1 s loads (default)")
    mode.add_argument("--full", action="store_true", help="medians of >= 5 everywhere, 5 s loads")
    parser.add_argument("--only", metavar="NAMES", help="comma-separated contenders (default: all)")
    parser.add_argument("--tufproxy-src", type=Path, default=HERE.parent, metavar="DIR",
                        help="tufproxy source tree to run (default: this checkout), e.g. a `git archive` of another commit")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="where latest.md and the PNG go")
    args = parser.parse_args()
    plan = FULL if args.full else QUICK
    wanted = [c for c in C.ALL if not args.only or c.name in args.only.split(",")]
    global _METER
    _METER = Meter("benchmark", len(wanted) * SCENARIOS, "scenarios")

    started = time.monotonic()
    load_before = os.getloadavg()
    corp = corpus_mod.build(HERE / ".cache", log=_log)
    venv_problem = C.ensure_venv(log=_log) if any(c.name in C.NEEDS_VENV for c in wanted) else None
    floor_sha = M.sha256_of(corp.public_dir / "packages" / corpus_mod.LARGE_PROJECT / corp.large_file)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="tufproxy-bench-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # nginx workers run as nobody and keep their cache in here
        try:
            upstream = C.Upstream(corp.public_dir, work / "upstream")
        except C.Unavailable as e:
            _log(f"cannot start the upstream: {e}")
            return 1
        try:
            large_url = f"{upstream.url}packages/{corpus_mod.LARGE_PROJECT}/{corp.large_file}"
            floor = [M.download_and_hash(large_url, floor_sha) for _ in range(plan.floor)]
            _log(f"floor (download from the upstream + sha256): {statistics.median(floor):.2f}s")
            meta = cold = None
            if any(c.name == "tufproxy" for c in wanted):
                meta = M.metadata_cost(upstream.url, corp, plan.metadata, args.tufproxy_src.resolve())
                _log("tufproxy cold path ...")
                cold = coldpath.measure(corp, HERE / ".cache", work / "coldpath", args.tufproxy_src.resolve(),
                                        plan.file_cold, log=_log)
            for cls in wanted:
                _log(f"{cls.name} ...")
                contender = cls(upstream, corp, work / cls.name, args.tufproxy_src.resolve())
                if cls.name in C.NEEDS_VENV and venv_problem:
                    results.append(Result(cls.name, cls.note, skipped=venv_problem))
                    continue
                try:
                    results.append(bench_contender(contender, corp, plan, work))
                except C.Unavailable as e:
                    results.append(Result(cls.name, cls.note, skipped=str(e)))
        finally:
            upstream.stop()
        shutil.rmtree(work, ignore_errors=True)
    _METER.close()
    elapsed = time.monotonic() - started
    run = report.Run(
        source=_describe(args.tufproxy_src.resolve()),
        plan=plan.name,
        plan_detail=plan,
        corpus=corp,
        results=results,
        floor_s=statistics.median(floor),
        metadata=meta,
        elapsed_s=elapsed,
        concurrency=CONCURRENCY,
        load=(load_before, os.getloadavg()),
        mid_connections=MID_CONNECTIONS,
        cold=cold,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    md = args.out / "latest.md"
    md.write_text(report.markdown(run))
    png = report.plot(run, args.out / "throughput.png")
    print(report.summary(run, md, png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
