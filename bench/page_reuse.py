"""What a write into the page cache costs in memory just freed, against memory the kernel has not used lately.

On a virtual machine with free page reporting (``dmesg``: "Free page reporting enabled") the guest hands
free memory back to its host, and the first touch of such a page again costs a fault in the host. A server
that has run for a while reuses its page cache's pages; a bench that starts each round on fresh memory pays
that cost on every byte it writes, and pays it unevenly between the setups it compares
(``bench/gateway_cold.py`` writes and deletes a file before each path for that reason).

Each round writes ``--mb`` MiB in 1 MiB + 64 KiB ``pwrite``s (as the fetch does), once into a new file right
after a file of that size was deleted, once into a new file with nothing deleted; seconds and system CPU.

    python bench/page_reuse.py [--mb 287] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def write(path: Path, nbytes: int, piece: bytes) -> tuple[float, float]:
    """Wall and system seconds to write ``nbytes`` into a new file at ``path``."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
    try:
        began, cpu = time.perf_counter(), os.times()
        for offset in range(0, nbytes, len(piece)):
            os.pwrite(fd, piece, offset)
        return time.perf_counter() - began, os.times().system - cpu.system
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=287)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    nbytes, piece = args.mb << 20, os.urandom(2**20 + 2**16)
    with tempfile.TemporaryDirectory(prefix="bench-page-reuse-", dir=Path(__file__).resolve().parent) as tmp:
        work = Path(tmp)
        write(work / "previous", nbytes, piece)
        print(f"{args.mb} MiB written into a new file, {args.rounds} rounds (wall s / system CPU s)")
        for r in range(args.rounds):
            (work / "previous").unlink()
            reused = write(work / "previous", nbytes, piece)
            untouched = write(work / f"kept-{r}", nbytes, piece)  # kept to the end: nothing freed for it
            print(f"round {r + 1}: after a delete {reused[0]:.3f} / {reused[1]:.2f}, "
                  f"nothing freed {untouched[0]:.3f} / {untouched[1]:.2f}")


if __name__ == "__main__":
    main()
