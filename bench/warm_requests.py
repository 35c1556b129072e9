"""Warm requests one after another on one keep-alive connection, as pip sends them: edge beside proxpi and devpi.

``bench/install.py``'s local index and setups.  Each contender is started
and warmed with one pip install; then, for ten of the installed projects,
its page (pip's Accept), the newest file's ``.metadata`` and the file
itself are asked in turn, ``--rounds`` times over, on one ``requests``
session.  Prints the median and 90th percentile of each kind, in
milliseconds: what a sequential client waits per request once everything
is warm (the client's own time included, alike for all).

    python bench/warm_requests.py [tufproxy | NAME=DIR ...] [proxpi] [devpi] [floor] [--rounds 15]

``NAME=DIR``: a tufproxy tree put first on ``PYTHONPATH`` for its servers
(``git archive <commit> proxy | tar -x -C DIR``), to set trees side by side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urljoin

import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from install import Devpi, Floor, Index, Proxpi, Setup, Tufproxy, fetch_corpus, install, load  # noqa: E402

KINDS: dict[str, type[Setup]] = {"tufproxy": Tufproxy, "proxpi": Proxpi, "devpi": Devpi, "floor": Floor}
PROJECTS = ("requests", "rich", "httpx", "pydantic", "click", "idna", "urllib3", "certifi", "h11", "anyio")
PIP_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html; q=0.1, text/html; q=0.01"


def urls(session: requests.Session, base: str) -> dict[str, list[str]]:
    """Each project's page, and its newest file's .metadata and file, as the page links them."""
    found: dict[str, list[str]] = {"page": [], "metadata": [], "file": []}
    for project in PROJECTS:
        page = f"{base}{project}/"
        answer = session.get(page, headers={"Accept": PIP_ACCEPT}, timeout=30)
        answer.raise_for_status()
        if not answer.headers["Content-Type"].startswith("application/vnd.pypi.simple.v1+json"):
            raise SystemExit(f"{page}: not a JSON page ({answer.headers['Content-Type']})")
        url = urljoin(page, answer.json()["files"][-1]["url"]).split("#")[0]
        found["page"].append(page)
        found["metadata"].append(url + ".metadata")
        found["file"].append(url)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("contenders", nargs="*", default=list(KINDS), help=f"any of {', '.join(KINDS)}")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--rtt-ms", type=float, default=40.0)
    args = ap.parse_args()
    for spec in args.contenders:
        if spec.partition("=")[0] not in KINDS and "=" not in spec:
            ap.error(f"not a contender: {spec} (NAME=DIR, or any of {', '.join(KINDS)})")
    projects = load(fetch_corpus(lambda s: print(s, file=sys.stderr)))
    index = Index(projects, args.rtt_ms / 1000)
    setups: dict[str, Setup] = {}
    asked: dict[str, tuple[requests.Session, dict[str, list[str]]]] = {}
    took: dict[tuple[str, str], list[float]] = {}
    status: dict[tuple[str, str], int] = {}
    with tempfile.TemporaryDirectory(prefix="bench-warm-req-") as tmp:
        work = Path(tmp)
        try:
            for spec in args.contenders:
                name, _, tree = spec.partition("=")
                served = Index(projects, 0.0) if name == "floor" else index
                # A tree: the servers of a tufproxy setup import it.
                setup = Tufproxy(served, work / name, env={"PYTHONPATH": tree}) if tree else KINDS[name](served, work / name)
                setups[name] = setup
                setup.fresh()
                install("pip", setup.url, work / "target", work)
                session = requests.Session()
                asked[name] = (session, urls(session, setup.url))
            # Round-robin, so that load drifting on a shared machine weighs on all alike.
            for _ in range(args.rounds):
                for name, (session, found) in asked.items():
                    for kind, kind_urls in found.items():
                        for url in kind_urls:
                            start = time.perf_counter()
                            answer = session.get(url, headers={"Accept": PIP_ACCEPT} if kind == "page" else {},
                                                 timeout=30)
                            _ = answer.content
                            took.setdefault((name, kind), []).append(time.perf_counter() - start)
                            status[(name, kind)] = answer.status_code
        finally:
            for setup in setups.values():
                setup.stop()
    print(f"warm requests in turn on one connection, {args.rounds} rounds of {len(PROJECTS)} projects; ms")
    for (name, kind), times in took.items():
        p90 = statistics.quantiles(times, n=10)[-1]
        note = "" if status[(name, kind)] == 200 else f"  (status {status[(name, kind)]})"
        print(f"{name:9} {kind:8} median {statistics.median(times) * 1e3:5.2f}  p90 {p90 * 1e3:5.2f}{note}")


if __name__ == "__main__":
    main()
