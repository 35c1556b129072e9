"""glibc's malloc thresholds (proxy.util.malloc): socket-read-sized blocks reuse their pages, the operator's
settings win."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"),
                                reason="glibc only")

# Blocks the size of asyncio's socket reads, a few alive at a time, as a body streams through; the page faults.
CHURN = textwrap.dedent("""
    import collections, resource, sys
    from proxy.util import malloc
    print(malloc.tune())
    ring = collections.deque(maxlen=3)
    for i in range(1500):
        ring.append(b"\\x01" * (200_000 + (i * 7919) % 60_000))
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
""")


def churn(**env: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CHURN], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], int(out[1])


def test_streamed_blocks_reuse_their_pages_and_the_operators_settings_win() -> None:
    tuned, faults = churn(GLIBC_TUNABLES="glibc.malloc.arena_max=4")  # another tunable: still set
    # The operator's own setting (here: the trim threshold alone) is left as it is, and costs the faults.
    kept, default_faults = churn(MALLOC_TRIM_THRESHOLD_="131072")
    assert churn(GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072")[0] == "False"
    assert (tuned, kept) == ("True", "False")
    # About 350 MB through 1,500 blocks: each one's pages faulted in afresh without the settings.
    assert faults * 5 < default_faults, (faults, default_faults)

