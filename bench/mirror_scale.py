"""``tufproxy mirror sync`` of 10 changed projects in a tree of N projects (issue 37: within 1.5x from 1,000 to
100,000).

For each N: a gateway-layout repository built through the signer API (each project one page listing one
small real file, written beside it; no index, no network), with --bins bins (default: the count PEP 458's
rule picks for N); a first ``mirror sync --all`` of it into an empty tree (timed), then --repeats times: 10
projects get a new release and the same sync runs again (timed; the median is the figure the goal is
about); then a day under PEP 458 (every bin re-signed, as their one-day expiry makes the index do, and 10
projects changed) and the same sync (timed); up to --full-max projects once more with ``--full`` (every project re-checked, as every sync did
before it was incremental); up to --verify-max projects ``mirror verify`` of the whole tree with its peak
memory (VmHWM of the verifying process).  The sync runs in this process through the CLI's ``main``; verify
runs as a subprocess so its VmHWM is its own.

Usage: ``python bench/mirror_scale.py [--projects 1000 100000] [--bins 4096] [--changed 10] [--repeats 3]
[--full-max 10000] [--verify-max 100000]``; prints JSON (bench/results/mirror_scale.json).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from proxy.cli import main  # noqa: E402
from proxy.protocol import index  # noqa: E402
from proxy.protocol.bins import bins_for_targets  # noqa: E402
from proxy.protocol.layout import page_file_href  # noqa: E402
from proxy.repository import Repository  # noqa: E402

CHUNK = 10_000


def _page(repo: Repository, project: str, version: str) -> index.ProjectPage:
    """``project``'s page listing one file, whose bytes are written where the page's link points."""
    filename = f"{project}-{version}-py3-none-any.whl"
    data = f"{project} {version}\n".encode() * 8
    path = repo.public_dir / "packages" / project / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    dist = index.DistFile(filename=filename, url=page_file_href(project, filename),
                          hashes={"sha256": hashlib.sha256(data).hexdigest()}, size=len(data))
    return index.ProjectPage(name=project, files=(dist,), versions=(version,))


def _sync(repo: Repository, dest: Path, *args: str) -> tuple[float, str]:
    out = io.StringIO()
    start = time.perf_counter()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        code = main(["mirror", "sync", "--upstream", str(repo.public_dir), "--root", str(repo.metadata_dir / "1.root.json"),
                     "--dest", str(dest), "--all", "--profile", "gateway", *args])
    elapsed = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"mirror sync exited {code}: {out.getvalue()}")
    return elapsed, out.getvalue().splitlines()[1]


def _verify(dest: Path, root: Path) -> tuple[float, int, str]:
    code = ("import sys\nfrom proxy.cli import main\nrc = main(sys.argv[1:])\n"
            "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1], file=sys.stderr)\n"
            "sys.exit(rc)")
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code, "mirror", "verify", str(dest), "--root", str(root)],
                       capture_output=True, text=True, cwd=HERE.parent)
    elapsed = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"mirror verify exited {r.returncode}: {r.stdout[-2000:]}")
    return elapsed, int(r.stderr.strip().splitlines()[-1]), r.stdout.strip().splitlines()[-1]


def measure(tmp: Path, projects: int, changed: int, *, verify_max: int, full_max: int, bins: int | None,
            repeats: int) -> dict[str, object]:
    bins = bins or bins_for_targets(2 * projects)
    repo = Repository.init(tmp / f"up{projects}", bins=bins, layout="gateway", clock_versions=True)
    for first in range(0, projects, CHUNK):
        repo.publish_pages({f"p{i}": _page(repo, f"p{i}", "1.0") for i in range(first, min(projects, first + CHUNK))})
    dest = tmp / f"mirror{projects}"
    first_s, _ = _sync(repo, dest)
    step = max(1, projects // changed)
    deltas = []
    for release in range(2, 2 + repeats):  # each round: 10 projects get a new release, then the same sync
        repo.publish_pages({f"p{i}": _page(repo, f"p{i}", f"{release}.0") for i in range(0, step * changed, step)})
        delta_s, summary = _sync(repo, dest)
        deltas.append(delta_s)
    # A day of the public index under PEP 458: every bin-n re-signed (their expiry is a day), 10 projects changed.
    repo.refresh(force=True)
    repo.publish_pages({f"p{i}": _page(repo, f"p{i}", "9.0") for i in range(0, step * changed, step)})
    daily_s, daily = _sync(repo, dest)
    files = sum(len(f) for _, _, f in os.walk(dest))
    row: dict[str, object] = {
        "projects": projects,
        "bins": bins,
        "first_sync_seconds": round(first_s, 2),
        "sync_of_changed_seconds": round(statistics.median(deltas), 3),
        "sync_of_changed_seconds_each": [round(d, 3) for d in deltas],
        "sync_of_changed_summary": summary,
        "daily_sync_seconds": round(daily_s, 2),
        "daily_sync_summary": daily,
        "tree_files": files,
    }
    if projects <= full_max:
        row["sync_full_seconds"] = round(_sync(repo, dest, "--full")[0], 2)  # every project re-checked (before: always)
    if projects <= verify_max:
        verify_s, hwm_kb, verdict = _verify(dest, repo.metadata_dir / "1.root.json")
        row |= {"verify_seconds": round(verify_s, 1), "verify_vmhwm_mb": round(hwm_kb / 1024, 1), "verify_verdict": verdict}
    return row


def main_() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--projects", type=int, nargs="*", default=[1000, 100_000])
    ap.add_argument("--changed", type=int, default=10)
    ap.add_argument("--verify-max", type=int, default=100_000, help="run mirror verify on trees up to this many projects")
    ap.add_argument("--full-max", type=int, default=10_000, help="run a --full sync on trees up to this many projects")
    ap.add_argument("--repeats", type=int, default=3, help="syncs of changed projects per size (the median is reported)")
    ap.add_argument("--bins", type=int, default=None,
                    help="one bin count at every size (a repository initialised for the largest); default: PEP 458's "
                         "rule for each size")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mirror-") as t:
        rows = [measure(Path(t), n, args.changed, verify_max=args.verify_max, full_max=args.full_max, bins=args.bins,
                        repeats=args.repeats) for n in args.projects]
    ratio = rows[-1]["sync_of_changed_seconds"] / rows[0]["sync_of_changed_seconds"]  # type: ignore[operator]
    print(json.dumps({"measured": rows, f"sync_of_{args.changed}_changed_ratio_largest_to_smallest": round(ratio, 2),
                      "goal": "<= 1.5", "command": "python bench/mirror_scale.py " + " ".join(sys.argv[1:])}, indent=2))


if __name__ == "__main__":
    main_()
