"""Air-gapped mirrors: ``tufproxy mirror sync`` and ``tufproxy mirror verify``.

:mod:`proxy.mirror.sync` copies a verified selection of a signed index into
a tree (:mod:`proxy.mirror.tree`) that stays verifiable offline, optionally
re-signed under the site's own keys; :mod:`proxy.mirror.verify` re-checks
such a tree after it has been carried across; :mod:`proxy.mirror.select`
decides what is taken; :mod:`proxy.cli.mirror` is the command line.
Rank 7, beside :mod:`proxy.gateway`, which it never imports.
"""

from proxy.mirror.progress import Counts, Progress
from proxy.mirror.select import (
    FileFilter,
    SelectionError,
    Wanted,
    parse_requirement,
    read_requirements,
)
from proxy.mirror.sync import MirrorError, SyncOptions, SyncResult, sync
from proxy.mirror.verify import VerifyReport, verify_tree

__all__ = [
    "Counts",
    "FileFilter",
    "MirrorError",
    "Progress",
    "SelectionError",
    "SyncOptions",
    "SyncResult",
    "VerifyReport",
    "Wanted",
    "parse_requirement",
    "read_requirements",
    "sync",
    "verify_tree",
]
