"""Why the gateway signs files through pages, and why 512 bins: the measurements behind the design page.

1. A first publish of one project with FILES files (numpy's page lists
   ~4,415): as per-file targets (``tufproxy`` layout, ``Repository.add``)
   against one page whose hashes cover the files (``gateway`` layout,
   ``Repository.publish_pages``): seconds, bin-n roles re-signed, bytes of
   metadata written.
2. For each bin count: snapshot.json size, and what one publish costs every
   edge: a refresh of a warm edge's trust core (new timestamp + snapshot,
   verified) after one project was published, median over REPEATS.  With
   PROJECTS projects published, the size of an average bin-n, and what an
   edge's first look at a page in a bin it has not read costs (the bin-n
   fetched and verified, median over REPEATS projects): the other side of
   the balance.

Usage: ``python bench/gateway_layout.py [--files 4400] [--projects 20000] [--repeats 5] [--bins 16384 1024 512 256]``;
prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from proxy.protocol import index
from proxy.repository import Repository
from proxy.repository.sample import build_wheel
from proxy.transport.local import LocalFetcher
from proxy.trust import Mirror, TrustConfig, TrustedClient


def _metadata_bytes(repo: Repository) -> int:
    return sum(p.stat().st_size for p in repo.metadata_dir.iterdir())


def synthetic_page(project: str, files: int, seed: str = "") -> index.ProjectPage:
    """A page of ``files`` made-up wheels (hashes, sizes, .metadata): what a publish signs, without the files."""
    entries = tuple(
        index.DistFile(
            filename=f"{project}-{i}.0-py3-none-any.whl",
            url=f"../../packages/{project}/{project}-{i}.0-py3-none-any.whl",
            hashes={"sha256": f"{i:064x}"},
            size=1000 + i,
            core_metadata={"sha256": f"{i + 1:064x}"},
            upload_time="2024-01-01T00:00:00.000000Z",
        )
        for i in range(files)
    )
    return index.ProjectPage(name=project, files=entries, versions=tuple(f"{i}.0{seed}" for i in range(files)))


def first_publish(tmp: Path, files: int, bins: int) -> dict[str, object]:
    dists = [build_wheel(tmp / "dists", "big", f"{i}.0") for i in range(files)]
    out: dict[str, object] = {}
    for layout in ("tufproxy", "gateway"):
        repo = Repository.init(tmp / layout, bins=bins, layout=layout)
        before = _metadata_bytes(repo)
        start = time.perf_counter()
        report = repo.add(dists) if layout == "tufproxy" else repo.publish_pages({"big": synthetic_page("big", files)})
        out[layout] = {
            "seconds": round(time.perf_counter() - start, 2),
            "bin_n_signed": sum(1 for r in report.signed if r.startswith("bin-")),
            "metadata_bytes_written": _metadata_bytes(repo) - before,
        }
    return out


async def edge_costs(repo: Repository, repeats: int, tmp: Path) -> tuple[float, float]:
    """(refresh after one publish, first lookup in an unread bin), seconds, medians over ``repeats``."""
    TrustedClient.initialize(tmp / "edge", (repo.metadata_dir / "1.root.json").read_bytes())
    fetcher = LocalFetcher(repo.public_dir)
    base = fetcher.base_url()
    client = TrustedClient(tmp / "edge", [Mirror(f"{base}metadata/", base)], fetcher, TrustConfig(refresh_interval=3600))
    await client.refresh(force=True)
    costs = []
    for i in range(repeats):
        repo.publish_pages({f"new{i}": synthetic_page(f"new{i}", 3)})
        start = time.perf_counter()
        await client.refresh(force=True)
        costs.append(time.perf_counter() - start)
    looks = []
    fmt = repo.profile.signed_formats[0]
    for i in range(repeats):
        start = time.perf_counter()
        await client.get_target(repo.profile.page_target(f"p{i}", fmt))
        looks.append(time.perf_counter() - start)
    client.close()
    return statistics.median(costs), statistics.median(looks)


def bins_cost(tmp: Path, bins: int, projects: int, repeats: int) -> dict[str, object]:
    repo = Repository.init(tmp / f"bins{bins}", bins=bins, layout="gateway", clock_versions=True)
    repo.publish_pages({f"p{i}": synthetic_page(f"p{i}", 3) for i in range(projects)})
    snapshot = max(repo.metadata_dir.glob("*.snapshot.json"), key=lambda p: int(p.name.split(".")[0]))
    newest: dict[str, Path] = {}  # each bin's current version: older ones are history, not what an edge reads
    for p in repo.metadata_dir.glob("*.bin-*.json"):
        version, _, name = p.name.partition(".")
        if name not in newest or int(version) > int(newest[name].name.partition(".")[0]):
            newest[name] = p
    bin_sizes = [p.stat().st_size for p in newest.values()]
    refresh, lookup = asyncio.run(edge_costs(repo, repeats, tmp / f"edge{bins}"))
    return {
        "snapshot_bytes": snapshot.stat().st_size,
        "edge_refresh_ms_per_publish": round(refresh * 1e3, 1),
        "edge_first_lookup_in_a_bin_ms": round(lookup * 1e3, 1),
        "largest_bin_bytes": max(bin_sizes),
        "median_bin_bytes": int(statistics.median(bin_sizes)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=4400)
    ap.add_argument("--projects", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bins", type=int, nargs="*", default=[16384, 1024, 512, 256])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-gw-") as t:
        tmp = Path(t)
        result = {
            "first_publish_of_one_project": {"files": args.files, **first_publish(tmp / "fp", args.files, 1024)},
            "bins": {b: bins_cost(tmp, b, args.projects, args.repeats) for b in args.bins},
            "projects_published": args.projects,
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
