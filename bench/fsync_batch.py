"""Making a signing batch durable: its files fsynced one after another, or side by side (issue 33).

A gateway batch writes tens of small files (pages, bin-n, the snapshot)
and must have them on disk before the timestamp that reaches them.  Each
fsync may wait for a journal commit of its own; concurrent ones join the
same commit.  "Side by side" is the signer's own
:meth:`proxy.util.atomic.Batch.flush`; "one by one" the loop it replaced.  On an idle disk the two ways cost about the same, so this
measures them while other writers fsync too (``--writers`` threads each
rewriting a 1 MiB file and fsyncing it in a loop: what a gateway and an
edge keeping wheels do meanwhile), in a directory on the disk under test.

    python bench/fsync_batch.py [--dir /tmp] [--files 40] [--rounds 15] [--writers 2]

Prints the median and slowest milliseconds per batch for each way, the
ways alternating round by round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from proxy.util.atomic import Batch, fsync_dir


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--writers", type=int, default=2)
    args = ap.parse_args()
    took: dict[str, list[float]] = {"one by one": [], "side by side": []}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-fsync-") as tmp:
        base = Path(tmp)
        stop = threading.Event()

        def writer(k: int) -> None:
            while not stop.is_set():
                with open(base / f"other-{k}", "wb") as f:
                    f.write(os.urandom(1 << 20))
                    f.flush()
                    os.fsync(f.fileno())

        others = [threading.Thread(target=writer, args=(k,), daemon=True) for k in range(args.writers)]
        for t in others:
            t.start()
        try:
            for r in range(args.rounds):
                for way in took:
                    paths = []
                    for i in range(args.files):
                        directory = base / f"d{i % 15}"
                        directory.mkdir(exist_ok=True)
                        path = directory / f"{way[:3]}-{r}-{i}"
                        path.write_bytes(os.urandom(2000))
                        paths.append(path)
                    batch = Batch()
                    for path in paths:
                        batch.add(path)
                    start = time.perf_counter()
                    if way == "side by side":
                        batch.flush()
                    else:
                        for path in dict.fromkeys(paths):
                            _fsync(path)
                        for directory in dict.fromkeys(p.parent for p in paths):
                            fsync_dir(directory)
                    took[way].append(time.perf_counter() - start)
        finally:
            stop.set()
            for t in others:
                t.join()
    print(f"{args.files} files of 2 KB in 15 directories, fsynced with {args.writers} other writer(s) fsyncing 1 MiB "
          f"files, {args.rounds} rounds (ms per batch)")
    for way, times in took.items():
        print(f"{way:13} median {statistics.median(times) * 1e3:6.1f}  slowest {max(times) * 1e3:6.1f}")


if __name__ == "__main__":
    main()
