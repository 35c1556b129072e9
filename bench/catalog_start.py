"""A fresh process's first ``Catalog.update()`` with and without the persisted catalog (issue 37).

Builds (or reuses, with --workdir) a gateway-layout repository of PROJECTS synthetic projects in BINS bins
through the signer API, as bench/model.py does, every tenth project private.  Then, each in a fresh process:

- ``full``: no persisted file, every bin-n read and parsed;
- ``kept``: the file written by a catalog of the current state, every bin taken from it;
- ``kept_changed``: the same file after CHANGED more projects were published one by one (a bin each, at most),
  so only their bins are read.

``--cold`` drops the repository's metadata files and the kept file from the page cache before each run
(``posix_fadvise(DONTNEED)``, these files only: nothing else on the machine is touched).

Usage: ``python bench/catalog_start.py [--projects 100000] [--bins 4096] [--changed 20] [--repeats 3]
[--cold] [--workdir DIR]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from gateway_layout import synthetic_page  # noqa: E402

from proxy.repository import Repository  # noqa: E402
from proxy.repository.catalog import Catalog  # noqa: E402

CHUNK = 10_000  # pages signed per transaction while building


def build(path: Path, projects: int, bins: int) -> Repository:
    if (path / "repository.json").exists():
        return Repository.open(path)
    repo = Repository.init(path, bins=bins, layout="gateway", clock_versions=True)
    for first in range(0, projects, CHUNK):
        repo.publish_pages({f"p{i}": synthetic_page(f"p{i}", 3) for i in range(first, min(projects, first + CHUNK))},
                           private=lambda p: p.endswith("7"))
    return repo


def _uncache(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def measure(path: Path, kept: Path | None, cold: bool) -> dict[str, float]:
    """In this (fresh) process: one first look, timed."""
    repo = Repository.open(path)
    if cold:
        _uncache([*repo.metadata_dir.iterdir(), *([kept] if kept is not None and kept.exists() else [])])
    reads = 0
    real = repo.metadata_json

    def counting(role: str, version: int | None = None) -> dict:
        nonlocal reads
        reads += role.startswith("bin-")
        return real(role, version)

    repo.metadata_json = counting  # type: ignore[method-assign]
    start = time.perf_counter()
    catalog = Catalog(repo, kept).update()
    took = time.perf_counter() - start
    return {"seconds": took, "bins_read": reads, "projects": len(catalog.projects), "private": len(catalog.private)}


def run(path: Path, kept: Path | None, cold: bool, repeats: int) -> dict[str, float]:
    rows = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, __file__, "--measure", str(path), *(["--kept", str(kept)] if kept else []),
                              *(["--cold"] if cold else [])], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout))
    return {**rows[0], "seconds": round(statistics.median(r["seconds"] for r in rows), 3),
            "seconds_each": [round(r["seconds"], 3) for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--projects", type=int, default=100_000)
    ap.add_argument("--bins", type=int, default=4096)
    ap.add_argument("--changed", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--kept", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.kept, args.cold)))
        return
    with tempfile.TemporaryDirectory() as t:
        work = args.workdir or Path(t)
        path = work / f"gw{args.projects}-{args.bins}"
        start = time.perf_counter()
        repo = build(path, args.projects, args.bins)
        built = time.perf_counter() - start
        kept = work / "catalog.json"
        kept.unlink(missing_ok=True)
        Catalog(repo, kept).update().save()
        out: dict[str, object] = {"projects": args.projects, "bins": args.bins, "cold": args.cold,
                                  "build_seconds": round(built, 1), "kept_bytes": kept.stat().st_size}
        out["full"] = run(path, None, args.cold, args.repeats)
        out["kept"] = run(path, kept, args.cold, args.repeats)
        for i in range(args.changed):
            name = f"changed{time.time_ns()}-{i}"
            repo.publish_pages({name: synthetic_page(name, 3)})
        out["kept_changed"] = {"changed_projects": args.changed, **run(path, kept, args.cold, args.repeats)}
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
