"""Turn one benchmark run into ``latest.md``, a throughput PNG and a stdout summary.

Every cell is a median with its ratio to tufproxy (contender ÷ tufproxy);
the issue's targets are checked on the same run's figures, and each missed
target carries the note that explains it.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ORDER = ("tufproxy", "proxpi", "devpi", "nginx", "direct")


@dataclass
class Run:
    source: str  # which tufproxy tree was measured
    plan: str
    plan_detail: Any
    corpus: Any
    results: list[Any]
    floor_s: float
    metadata: Any
    elapsed_s: float
    concurrency: tuple[int, ...]
    # os.getloadavg() when the run started and when it ended: how busy the machine was.
    load: tuple[tuple[float, float, float], tuple[float, float, float]] | None = None
    mid_connections: int = 8
    cold: Any = None  # bench/coldpath.py's ColdPath

    def by_name(self) -> dict[str, Any]:
        return {r.name: r for r in self.results}

    def median(self, name: str, key: str) -> float | None:
        r = self.by_name().get(name)
        return None if r is None or r.skipped else r.median(key)


def _rows(run: Run) -> list[tuple[str, str, bool]]:
    """(label, sample key, lower is better)."""
    rows = [("pip download, cold cache (s)", "pip_cold", True), ("pip download, warm cache (s)", "pip_warm", True)]
    for c in run.concurrency:
        rows += [(f"index pages x{c}: req/s", f"rps_{c}", False), (f"index pages x{c}: p50 (ms)", f"p50_{c}", True),
                 (f"index pages x{c}: p99 (ms)", f"p99_{c}", True)]
    rows += [("large file warm (MB/s)", "file_warm", False),
             (f"16 MB wheel warm x{run.mid_connections} (MB/s)", "mid_warm", False),
             ("large file cold (s)", "file_cold", True)]
    return rows


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _cell(value: float | None, ref: float | None) -> str:
    if value is None:
        return "—"
    if ref in (None, 0):
        return _fmt(value)
    return f"{_fmt(value)} ({value / ref:.2f}×)"


def _names(run: Run) -> list[str]:
    present = {r.name for r in run.results}
    return [n for n in ORDER if n in present]


@dataclass(frozen=True)
class Target:
    label: str
    ratio: float | None  # a ratio, or a value in ``unit``
    limit: float
    at_least: bool  # True: ratio must be >= limit
    why: str  # shown when missed
    unit: str = "×"

    @property
    def met(self) -> bool | None:
        if self.ratio is None:
            return None
        return self.ratio >= self.limit if self.at_least else self.ratio <= self.limit

    def measured(self) -> str:
        if self.ratio is None:
            return "—"
        return f"{self.ratio:.0f} {self.unit}" if self.unit == "MB" else f"{self.ratio:.2f}{self.unit}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b in (None, 0) else a / b


# Why a target is missed, from the profiles in bench/README.md ("What the profiles say").
WHY = {
    "file": "Warm files leave through aiohttp's sendfile, as nginx's do; py-spy puts ~75 % of the "
            "samples inside os.sendfile and ~17 % in epoll, so the gap is asyncio's per-call loop "
            "(sendfile until EAGAIN, wait for writable, again) against nginx's C loop, plus noise: "
            "on this shared 2-CPU machine the same figure varies by ±30 % between runs.",
    "index": "A warm page hit is answered below aiohttp's web layer (proxy/serving/hotpath.py: the request head "
             "recognised in data_received, the kept page written to the transport; trusted-state and expiry "
             "checks as on every request): 114 Python calls per hit (303 through aiohttp; `python bench/calls.py`), "
             "~55-80 µs of CPU per page against nginx's ~30-40 (`python bench/warmab.py`). What is left is "
             "asyncio's selector loop, the recv and send system calls, and prometheus' multiprocess values "
             "(a pid check and an mmap write per value, five per hit); x1 is one round trip at a time, so "
             "it also carries wrk's and the kernel's wake-ups and moves most with the machine's load.",
    "mid": "Warm files leave through aiohttp's FileResponse and asyncio's sendfile; on this shared machine "
           "the 16 MB wheel over 8 connections measured 0.91x nginx in `python bench/warmab.py` "
           "(asyncio, load average ~7) and varies by ±30 % between runs; the remaining gap is asyncio's sendfile loop "
           "(sendfile until EAGAIN, wait for writable) and FileResponse's per-request thread hops "
           "(stat and open, close) against nginx's C loop, plus noise.",
    "p99": "p99 at 64 connections is queueing behind the page throughput (see the index note); the "
           "'before' ratio comes from another run, on a machine whose load varies from 1 to 9.",
    "cold": "A cold file is streamed as it arrives and its final byte is held back until every signed digest "
            "matched: sha256 and sha512 here, each in a thread of its own over 1-2 MiB batches beside the write "
            "to the cache, while the next bytes arrive; the bytes go out with sendfile from the file being "
            "written; the fsync runs after publishing, off the request. The floor is one process receiving and "
            "computing sha256, ~0.3 s of CPU. One cold fetch costs the proxy ~0.9 s of CPU (on an idle core: "
            "sha512 0.28 s, sha256 0.13 s, the write ~0.08 s, receiving from the upstream and sendfile to the "
            "client most of the rest; `python bench/coldab.py after=.`, bench/results/cold-large.md), and the "
            "client ~0.08 s more: ~1 s of CPU on 2 cores is at least 0.5 s of wall time, ~1.7x the floor on an "
            "idle machine, before any other load. ",
    "cold_bound": "sha512 by itself over the same file takes {sha512} here, more than 1.3× this floor ({floor}): "
                  "out of reach of any verifier of both digests on this CPU.",
    "cold_load": "sha512 by itself over the same file takes {sha512} here; the rest shares 2 cores with the "
                 "upstream, the client and, in this run, other work (load average {load}); the ratio moves "
                 "with the load.",
    "first": "The first bytes are sent once 1 MiB arrived or half a second passed.",
    "rss": "Each download keeps at most 1 MiB of received bytes waiting while one batch is hashed and "
           "written (a batch closes at 1 MiB or after 50 ms: ~200 KiB at the bench's 4 MiB/s), besides "
           "aiohttp's read buffer (it pauses the socket at 512 KiB); the rest is the interpreter and the "
           "trusted metadata.",
    "pip_warm": "pip itself dominates a warm run and the figure is noise-bound on this shared machine "
                "(tufproxy's warm median was 1.96 s and 2.99 s in two runs of the same code); the "
                "per-request cost is the index note's.",
    "pip_cold": "Each cold file is hashed with every signed digest (sha256 and sha512) and written to the "
                "cache as it arrives; it streams once 1 MiB of it arrived (or half a second passed), its final "
                "byte held back until both matched, and one verified before that is answered whole (see the "
                "cold large file); each page is "
                "verified against its signed hashes, and each first lookup in a bin fetches and verifies "
                "that bin (one more round trip per project); proxpi and nginx pass bytes on as they "
                "arrive, unverified.",
}


# p99 of a warm page hit at 64 connections before the warm-path work, as a ratio to nginx's in the
# same run (absolute latencies follow the machine's load): 53.9 ms against 7.00 ms, from
# `python bench/run.py --quick --only tufproxy,nginx --tufproxy-src DIR` on a `git archive 25aa790 proxy`
# with tufproxy --workers 2 (load average 1.7 to 3.1). The target is to be no worse.
P99_X64_BEFORE = 53.9 / 7.00


def targets(run: Run) -> list[Target]:
    t = run.median
    out = [Target(f"warm index req/s x{c} ≥ 0.35× nginx", _ratio(t("tufproxy", f"rps_{c}"), t("nginx", f"rps_{c}")),
                  0.35, True, WHY["index"]) for c in run.concurrency]
    out.append(Target(f"warm 16 MB wheel x{run.mid_connections} MB/s ≥ 0.9× nginx",
                      _ratio(t("tufproxy", "mid_warm"), t("nginx", "mid_warm")), 0.9, True, WHY["mid"]))
    if 64 in run.concurrency:
        out.append(Target(f"warm page p99 x64 ÷ nginx's ≤ before ({P99_X64_BEFORE:.1f}×)",
                          _ratio(t("tufproxy", "p99_64"), t("nginx", "p99_64")), P99_X64_BEFORE, False, WHY["p99"]))
    out += [Target("warm file MB/s ≥ 0.8× nginx", _ratio(t("tufproxy", "file_warm"), t("nginx", "file_warm")), 0.8, True, WHY["file"])]
    for c in run.concurrency:
        out.append(
            Target(
                f"warm index req/s x{c} ≥ 2× proxpi",
                _ratio(t("tufproxy", f"rps_{c}"), t("proxpi", f"rps_{c}")),
                2.0,
                True,
                WHY["index"],
            )
        )
    out += [
        Target(
            "cold 200 MB wheel ≤ 1.3× (download + sha256 floor)",
            _ratio(t("tufproxy", "file_cold"), run.floor_s),
            1.3,
            False,
            _cold_why(run),
        ),
        Target(
            "pip download warm ≤ 1.0× proxpi",
            _ratio(t("tufproxy", "pip_warm"), t("proxpi", "pip_warm")),
            1.0,
            False,
            WHY["pip_warm"],
        ),
        Target(
            "pip download cold ≤ 1.2× proxpi",
            _ratio(t("tufproxy", "pip_cold"), t("proxpi", "pip_cold")),
            1.2,
            False,
            WHY["pip_cold"],
        ),
    ]
    cold = run.cold
    if cold is not None:
        out += [
            Target(
                "first byte ≤ 1 s after the mirror's (212 MB wheel, 12 MiB/s mirror)",
                cold.first_byte_gap_s,
                1.0,
                False,
                WHY["first"],
                unit=" s",
            ),
            Target(
                "peak RSS < 300 MB with 50 concurrent cold 200 MB downloads",
                cold.fanout_rss_mb,
                300,
                False,
                WHY["rss"],
                unit="MB",
            ),
        ]
    return out


def _load(avg: tuple[float, float, float]) -> str:
    return "/".join(f"{v:.2f}" for v in avg)


def _cold_why(run: Run) -> str:
    sha512 = run.cold.sha512_s if run.cold is not None else None
    if sha512 is None:
        return WHY["cold"]
    if sha512 > 1.3 * run.floor_s:
        return WHY["cold"] + WHY["cold_bound"].format(sha512=f"{sha512:.2f} s", floor=f"{run.floor_s:.2f} s")
    load = f"{run.load[1][1]:.1f} over 5 min" if run.load else "unknown"
    return WHY["cold"] + WHY["cold_load"].format(sha512=f"{sha512:.2f} s", load=load)


def _machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, Python {sys.version.split()[0]}"


def markdown(run: Run) -> str:
    names = _names(run)
    by = run.by_name()
    p = run.plan_detail
    c = run.corpus
    lines = [
        "# tufproxy benchmark: latest run",
        "",
        f"Produced by `python bench/run.py --{run.plan}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{_machine()}; the run took {run.elapsed_s:.0f} s. tufproxy measured: {run.source}."
        + (f" Load average (1/5/15 min) at the start {_load(run.load[0])}, at the end {_load(run.load[1])}." if run.load else ""),
        "",
        f"Repeats (each cell is the median): pip download cold {p.pip_cold}, warm {p.pip_warm}; "
        f"index load {p.load_runs} × {p.load_seconds:g} s per concurrency; large file warm {p.file_warm}, "
        f"cold {p.file_cold}; floor {p.floor}; metadata {p.metadata}."
        + (
            " `--quick` repeats cold runs and loads fewer than 5 times; use `--full` for medians of ≥ 5."
            if run.plan == "quick"
            else ""
        ),
        "",
        f"Upstream: nginx serving a `tufproxy repo` tree ({len(c.projects)} projects, latest wheels "
        f"{c.total_bytes / 1e6:.0f} MB in all, the largest `{c.large_file}` {c.large_size / 1e6:.0f} MB, plus 120 "
        f"older versions of one project; 16384 bins) on 127.0.0.1. Cells: median (ratio = contender ÷ tufproxy).",
        "",
        "| scenario | " + " | ".join(names) + " | floor |",
        "|---|" + "---:|" * (len(names) + 1),
    ]
    for label, key, lower in _rows(run):
        ref = run.median("tufproxy", key)
        cells = [_cell(run.median(n, key), ref) for n in names]
        floor = f"{_fmt(run.floor_s)} ({run.floor_s / ref:.2f}×)" if key == "file_cold" and ref else ""
        lines.append(f"| {label} {'↓' if lower else '↑'} | " + " | ".join(cells) + f" | {floor} |")
    ref_rss = by["tufproxy"].peak_rss_mb if "tufproxy" in by and not by["tufproxy"].skipped else None
    rss_cells = [_cell(by[n].peak_rss_mb, ref_rss) if not by[n].skipped else "—" for n in names]
    lines.append("| peak RSS over the run (MB) ↓ | " + " | ".join(rss_cells) + " | |")
    lines += [
        "",
        "↓ lower is better, ↑ higher is better. Floor: the large file downloaded straight from the upstream and sha256-hashed as it arrives (one Python loop, OpenSSL's sha256).",
        "",
    ]

    lines += ["## Contenders", ""]
    for n in names:
        r = by[n]
        state = f" **Skipped: {r.skipped}**" if r.skipped else ""
        lines.append(f"- **{n}**: {r.note}.{state}")
        for err in r.errors:
            lines.append(f"  - failed scenario (no figure): {err}")
    lines.append("")

    if run.metadata is not None:
        m = run.metadata
        lines += [
            "## tufproxy metadata cost (trust core over HTTP, same upstream)",
            "",
            "| step | median |",
            "|---|---:|",
            f"| refresh from nothing: timestamp, snapshot of 16384 bins ({m.snapshot_bytes / 1e6:.2f} MB), targets, bins | {m.refresh_ms:.0f} ms |",
            f"| first lookup in an untouched bin (fetch + verify bin-n) | {m.first_lookup_ms:.1f} ms |",
            f"| lookup in a loaded bin | {m.warm_lookup_ms * 1e3:.0f} µs |",
            "",
        ]

    if run.cold is not None:
        k = run.cold
        f = lambda v, spec: "—" if v is None else format(v, spec)  # noqa: E731
        lines += [
            "## tufproxy cold path (`bench/coldpath.py`, same run)",
            "",
            "| figure | value |",
            "|---|---:|",
            f"| first body byte straight from a 12 MiB/s mirror, 212 MB wheel (median) | {f(k.mirror_first_s, '.3f')} s |",
            f"| first body byte through a cold tufproxy from that mirror (median) | {f(k.proxy_first_s, '.3f')} s |",
            f"| peak RSS, 50 concurrent cold 200 MB downloads (4 MiB/s mirror each; {k.fanout_in_flight} in flight when sampled) | {f(k.fanout_rss_mb, '.0f')} MB |",
            f"| sha512 alone over the 212 MB wheel in memory, one thread | {f(k.sha512_s, '.2f')} s |",
            *(f"| failed (no figure): {e[:200]} | |" for e in k.errors),
            "",
        ]

    lines += ["## Targets (same run)", "", "| target | measured | met |", "|---|---:|:---:|"]
    missed = []
    for t in targets(run):
        met = {True: "yes", False: "**no**", None: "n/a"}[t.met]
        lines.append(f"| {t.label} | {t.measured()} | {met} |")
        if t.met is False:
            missed.append(f"- *{t.label}*: {t.why}")
    if missed:
        lines += ["", "Why the missed targets are missed:", "", *missed]
    lines.append("")
    return "\n".join(lines)


def plot(run: Run, path: Path) -> Path | None:
    """Throughput and p99 against concurrency; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for n in _names(run):
        rps = [run.median(n, f"rps_{c}") for c in run.concurrency]
        p99 = [run.median(n, f"p99_{c}") for c in run.concurrency]
        if all(v is not None for v in rps):
            ax1.plot(run.concurrency, rps, marker="o", label=n, linewidth=2.5 if n == "tufproxy" else 1.5)
            ax2.plot(run.concurrency, p99, marker="o", label=n, linewidth=2.5 if n == "tufproxy" else 1.5)
    for ax, title, unit in ((ax1, "warm index pages: throughput", "requests/s"), (ax2, "warm index pages: p99 latency", "ms")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(list(run.concurrency), [str(c) for c in run.concurrency])
        ax.set_xlabel("concurrent connections")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    if ax1.lines:
        ax1.legend()
    fig.suptitle(f"tufproxy bench --{run.plan} ({os.cpu_count()} CPUs)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summary(run: Run, md: Path, png: Path | None) -> str:
    """At most one screen: the main figures, the targets, where the files went."""
    names = _names(run)
    keep = {"pip_cold", "pip_warm", "rps_1", "rps_16", "rps_64", "p99_64", "file_warm", "mid_warm", "file_cold"}
    out = [
        f"tufproxy bench --{run.plan}: {run.elapsed_s:.0f} s   (median, ratio to tufproxy)",
        f"{'':<30}" + "".join(f"{n:>16}" for n in names),
    ]
    for label, key, _ in _rows(run):
        if key in keep:
            ref = run.median("tufproxy", key)
            out.append(f"{label:<30}" + "".join(f"{_cell(run.median(n, key), ref):>16}" for n in names))
    out.append(f"{'floor for the cold large file':<30}{_fmt(run.floor_s):>16} s")
    if run.load:
        out.append(f"load average at start {_load(run.load[0])}, at end {_load(run.load[1])}")
    by = run.by_name()
    out.append(f"{'peak RSS (MB)':<30}" + "".join(f"{_fmt(by[n].peak_rss_mb):>16}" for n in names))
    for n in names:
        if by[n].skipped:
            out.append(f"skipped {n}: {by[n].skipped[:100]}")
    if run.metadata is not None:
        m = run.metadata
        out.append(
            f"metadata: refresh (16384 bins) {m.refresh_ms:.0f} ms, first lookup in an untouched bin {m.first_lookup_ms:.1f} ms"
        )
    for t in targets(run):
        mark = {True: "met   ", False: "MISSED", None: "n/a   "}[t.met]
        out.append(f"  [{mark}] {t.label}: {t.measured()}")
    out.append(f"written: {md}" + (f", {png}" if png else " (no PNG: pip install matplotlib)"))
    return "\n".join(out)
