"""glibc's malloc, set for a process that streams bodies through 256 KiB socket reads.

asyncio reads a socket up to 256 KiB at a time, each read a new ``bytes``
object, freed once its bytes are hashed or copied on.  With glibc's
default (dynamic) thresholds such blocks are mapped afresh, or the heap's
top is given back to the kernel as soon as twice the last freed block is
free: a body's reads then land in new pages nearly every time, each one
faulted in and zeroed.  Measured: 40 fetches of an 8 MB file through the
one fetch-and-verify took 65,000-69,000 page faults and 0.37-0.39 s of
system time with the defaults, ~100 and 0.21-0.26 s with these settings.
Fixed thresholds keep such blocks on the heap, whose pages stay in use;
the price is at most ``TRIM_THRESHOLD`` bytes of free heap kept per arena.

Thresholds the operator set (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, or either in ``GLIBC_TUNABLES``) win; other C
libraries are left alone.
"""

from __future__ import annotations

import ctypes
import os

# mallopt's parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks below this come from the heap (a socket read, a 1 MiB batch buffer); larger ones are mapped.
MMAP_THRESHOLD = 2 * 2**20
# Free heap above this is given back to the kernel.
TRIM_THRESHOLD = 8 * 2**20


def _operator_set() -> bool:
    """Whether the operator set either threshold (the old variables, or glibc's tunables)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return True
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return "glibc.malloc.mmap_threshold" in tunables or "glibc.malloc.trim_threshold" in tunables


def tune() -> bool:
    """Set the thresholds for this process (and the workers it forks); whether they were set."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):  # not a name this platform knows
        libc = ""
    if not libc.startswith("glibc") or _operator_set():
        return False
    mallopt = ctypes.CDLL(None).mallopt
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
