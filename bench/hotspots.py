"""Profile tufproxy under the bench's warm loads with py-spy; print the hot spots.

Starts the bench upstream and one tufproxy (from ``--tufproxy-src``), warms
its cache, then samples it with ``py-spy record`` while (1) wrk requests
every index page over 64 connections, (2) curl fetches the large wheel over
and over; then, each on a fresh cache, (3) one cold fetch of the large
wheel and (4) one cold ``pip download`` of the whole set.  Prints, per load, the functions with the most samples on
top of the stack (self) and anywhere on it (inclusive); the collapsed
stacks are kept in ``bench/.cache/profile-*.txt`` for flame graphs.

Usage: ``python bench/hotspots.py [--seconds 10] [--tufproxy-src DIR]``
(needs ``pip install py-spy`` and ptrace permission).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import contenders as C  # noqa: E402
import corpus as corpus_mod  # noqa: E402
import measure as M  # noqa: E402

TOP = 12


def _frame(name: str) -> str:
    """``func (path/to/file.py:line)`` -> ``func (file.py)``: lines split one function into many."""
    func, _, where = name.partition(" (")
    return f"{func} ({Path(where.rsplit(':', 1)[0]).name})" if where else func


def hot_spots(collapsed: Path) -> tuple[int, Counter[str], Counter[str]]:
    total = 0
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";")[1:]]  # first frame is the process/thread
        total += n
        if frames:
            own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    return total, own, incl


def record(pid: int, seconds: float, out: Path, load) -> None:  # type: ignore[no-untyped-def]
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy not found: pip install py-spy")
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "250",
                             "--format", "raw", "--output", str(out), "--subprocesses"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()
    worker = threading.Thread(target=load, args=(stop,))
    worker.start()
    try:
        _, err = proc.communicate(timeout=seconds + 60)
    finally:
        stop.set()
        worker.join()
    if proc.returncode != 0:
        raise SystemExit(f"py-spy failed: {err[-400:]}")


def show(title: str, collapsed: Path) -> None:
    total, own, incl = hot_spots(collapsed)
    print(f"\n== {title}: {total} samples ==")
    print("  self (on top of the stack):")
    for name, n in own.most_common(TOP):
        print(f"    {100 * n / total:5.1f}%  {name}")
    print("  inclusive (anywhere on the stack):")
    for name, n in incl.most_common(TOP + 8):
        print(f"    {100 * n / total:5.1f}%  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tufproxy-src", type=Path, default=HERE.parent, metavar="DIR")
    args = parser.parse_args()
    corp = corpus_mod.build(HERE / ".cache", log=print)
    with tempfile.TemporaryDirectory(prefix="tufproxy-profile-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        upstream = C.Upstream(corp.public_dir, work / "upstream")
        proxy = C.Tufproxy(upstream, corp, work / "tufproxy", args.tufproxy_src.resolve())
        try:
            proxy.fresh()
            assert proxy.pid is not None
            paths = [urlsplit(proxy.page_url(p)).path for p in corp.projects]
            for p in corp.projects:
                C.http_get(proxy.page_url(p))
            base = proxy.index_url.rsplit("/simple/", 1)[0]
            out = HERE / ".cache" / "profile-index.txt"

            def pages(stop: threading.Event) -> None:
                while not stop.is_set():
                    M.wrk_pages(base, paths, 64, 2, work)

            record(proxy.pid, args.seconds, out, pages)
            show("warm index pages, 64 connections", out)

            url = proxy.file_url(corpus_mod.LARGE_PROJECT, corp.large_file)
            M.curl_file(url, corp.large_size)
            out = HERE / ".cache" / "profile-file.txt"
            done: list[float] = []

            def files(stop: threading.Event) -> None:
                while not stop.is_set():
                    done.append(M.curl_file(url, corp.large_size))

            record(proxy.pid, args.seconds, out, files)
            show(f"warm large file, 1 client ({len(done)} downloads, median "
                 f"{corp.large_size / 1e6 / sorted(done)[len(done) // 2]:.0f} MB/s)", out)

            def once(fn):  # type: ignore[no-untyped-def]
                def load(stop: threading.Event) -> None:
                    done.append(fn())
                    stop.wait()
                return load

            done.clear()
            proxy.fresh()
            url = proxy.file_url(corpus_mod.LARGE_PROJECT, corp.large_file)
            out = HERE / ".cache" / "profile-file-cold.txt"
            record(proxy.pid, 4, out, once(lambda: M.curl_file(url, corp.large_size)))
            show(f"cold large file ({done[-1]:.2f} s)", out)

            proxy.fresh()
            out = HERE / ".cache" / "profile-pip-cold.txt"
            record(proxy.pid, 12, out, once(lambda: M.pip_download(proxy.index_url, corp.projects, corp.total_bytes)))
            show(f"cold pip download ({done[-1]:.2f} s)", out)
        finally:
            proxy.stop()
            upstream.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
