"""OSV advisories at the gateway: import time and memory of a PyPI-sized set, and the matching cost per page.

Generates an advisory set the size of OSV's PyPI one (``--records``, default
20,000: a third MAL- records with exact versions and file hashes, the rest
PYSEC-/GHSA- records with ECOSYSTEM ranges and CVSS v3 or v4 vectors), zips
it as OSV's all.zip is laid out, and measures, each ``--repeat`` times:

* ``tufproxy gateway advisories import DIR all.zip`` in a fresh gateway
  (``gateway init``, 1024 bins), signing the store as its target included:
  wall time and the process's peak resident memory (ru_maxrss);
* the cost of deciding one page: every file of a ``--files``-file page of a
  project some advisories name, through :func:`proxy.gateway.pages.withheld`
  (what the gateway runs per file when it renders a page), median per page,
  with the version-parse cache emptied before each page.

Prints one table with each median beside the issue's goal and its ratio
(measured / goal: below 1 meets it).  Run from the repository root:

    python bench/advisories.py [--records 20000] [--files 200] [--repeat 3] [--out bench/results/advisories.md]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxy.gateway.advisories import load, store_path  # noqa: E402
from proxy.gateway.pages import withheld  # noqa: E402
from proxy.gateway.policy import Policy  # noqa: E402
from proxy.protocol import index, osv  # noqa: E402

V3 = ("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H", "CVSS:3.1/AV:N/AC:L/PR:N/UI:R/S:U/C:L/I:L/A:N",
      "CVSS:3.1/AV:L/AC:H/PR:H/UI:R/S:U/C:L/I:N/A:N")
V4 = ("CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:H/VI:N/VA:N/SC:N/SI:N/SA:N",
      "CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:H/VI:H/VA:H/SC:N/SI:N/SA:N")
GOALS = {"import seconds": 10.0, "import peak RSS MB": 200.0, "matching ms per page": 1.0}


def generate(path: Path, records: int, seed: int = 31) -> None:
    """An all.zip-style zip of ``records`` OSV records over about records/4 projects (PyPI's shape: many per project)."""
    rng = random.Random(seed)
    projects = [f"project-{i}" for i in range(max(1, records // 4))]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(records):
            name = rng.choice(projects) if i else "hot-project"
            modified = f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}T00:00:00Z"
            if i % 3 == 0:
                ident = f"MAL-2024-{i}"
                versions = [f"{rng.randint(0, 9)}.{rng.randint(0, 20)}" for _ in range(rng.randint(1, 3))]
                record = {"id": ident, "modified": modified, "summary": f"Malicious code in {name} (PyPI)",
                          "affected": [{"package": {"ecosystem": "PyPI", "name": name}, "versions": versions}],
                          "database_specific": {"malicious-packages-origins": [
                              {"source": "ossf-package-analysis", "sha256": hashlib.sha256(f"{i}".encode()).hexdigest()}]}}
            else:
                ident = f"PYSEC-2024-{i}" if i % 3 == 1 else f"GHSA-{i:04x}-{i % 7919:04x}-bench"
                major = rng.randint(0, 9)
                events = [{"introduced": "0" if rng.random() < 0.3 else f"{major}.0"}, {"fixed": f"{major}.{rng.randint(1, 20)}"}]
                vector = rng.choice(V3 + V4)
                record = {"id": ident, "modified": modified, "aliases": [f"CVE-2024-{i}"],
                          "severity": [{"type": "CVSS_V4" if vector.startswith("CVSS:4") else "CVSS_V3", "score": vector}],
                          "affected": [{"package": {"ecosystem": "PyPI", "name": name},
                                        "ranges": [{"type": "ECOSYSTEM", "events": events}],
                                        "versions": [f"{major}.0", f"{major}.0.1"]}],
                          "details": "x" * rng.randint(200, 2000)}
            zf.writestr(f"{ident}.json", json.dumps(record))


def import_once(zip_path: Path, work: Path) -> tuple[float, float]:
    gw = work / "gw"
    subprocess.run([sys.executable, "-m", "proxy", "gateway", "init", str(gw), "--bins", "1024"], capture_output=True,
                   cwd=ROOT, check=True)
    code = ("import resource, sys, time\nfrom proxy.cli import main\nstart = time.perf_counter()\nrc = main(sys.argv[1:])\n"
            "print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
            "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code, "gateway", "advisories", "import", str(gw), str(zip_path)],
                       capture_output=True, text=True, cwd=ROOT, check=False)
    if r.returncode != 0:
        raise SystemExit(f"import failed: {r.stderr.strip()}")
    seconds, rss_kb = r.stderr.strip().splitlines()[-1].split()
    return float(seconds), int(rss_kb) / 1024


def matching_ms(store_file: Path, files: int, rounds: int = 200) -> float:
    advisories = load(store_file).advisories
    policy = Policy(block_vulnerable="low")
    project = max(advisories.projects(), key=lambda p: len(advisories.projects()[p]))
    page = [index.DistFile(f"{project.replace('-', '_')}-{v // 20}.{v % 20}-py3-none-any.whl", "x",
                           {"sha256": hashlib.sha256(f"f{v}".encode()).hexdigest()}) for v in range(files)]
    withheld(advisories, policy, project, page[0], None)  # builds the per-project index once, as a running gateway has
    total = 0.0
    for _ in range(rounds):
        osv._parsed.cache_clear()  # each page as if its versions were never seen: the cold cost
        osv._normalised.cache_clear()
        start = time.perf_counter()
        for dist in page:
            withheld(advisories, policy, project, dist, None)
        total += time.perf_counter() - start
    return total / rounds * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--files", type=int, default=200, help="files on the page matched")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        zip_path = work / "all.zip"
        generate(zip_path, args.records)
        size_mb = zip_path.stat().st_size / 1e6
        imports = [import_once(zip_path, work / f"run{i}") for i in range(args.repeat)]
        store_file = store_path(work / "run0" / "gw" / "gateway")
        store_mb = store_file.stat().st_size / 1e6
        advisories = load(store_file).advisories
        hot = max(len(v) for v in advisories.projects().values())
        match = [matching_ms(store_file, args.files) for _ in range(args.repeat)]
    measured = {"import seconds": statistics.median(s for s, _ in imports),
                "import peak RSS MB": statistics.median(m for _, m in imports),
                "matching ms per page": statistics.median(match)}
    lines = [f"# OSV advisories at the gateway ({args.records} generated records, zip {size_mb:.1f} MB, store {store_mb:.1f} MB)",
             "",
             f"Command: `python bench/advisories.py --records {args.records} --files {args.files} --repeat {args.repeat}`; "
             f"medians of {args.repeat}. The matched page has {args.files} files of the project most advisories name ({hot}). "
             f"Load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (a shared machine slows "
             "every figure alike).",
             "", "| measure | tufproxy | goal | ratio (tufproxy / goal) |", "|---|---|---|---|"]
    lines += [f"| {k} | {v:.3f} | {GOALS[k]:g} | {v / GOALS[k]:.2f} |" for k, v in measured.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
