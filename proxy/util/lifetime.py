"""A child process that must not outlive its parent: ``PR_SET_PDEATHSIG`` on Linux.

Used by ``--workers`` processes (:mod:`proxy.serving.workers`) and by PEP 740
verification workers (:mod:`proxy.trust.provenance`): a parent killed with
SIGKILL runs no cleanup, and its children would otherwise go on alone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["die_with"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with(parent: int, exit_status: int = 1) -> None:
    """SIGTERM this process when ``parent`` dies (Linux); if it already has, exit with ``exit_status`` now."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(exit_status)
