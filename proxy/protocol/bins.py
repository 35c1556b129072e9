"""How many hash bins a repository needs: the one rule ``repo init``, ``gateway init`` and ``rebin`` use.

PEP 458 plans 16,384 bins for the public index's 2,273,481 targets and says
the count should double when the targets grow fourfold: the bin count grows
as the square root of the targets.  That is the balance between the two
costs a bin count sets: the snapshot every client downloads on each refresh
grows with the bins, and the bin-n a client downloads for a project grows
with the targets per bin.  So the rule is ``16384 * sqrt(targets / 2273481)``,
rounded to the nearest power of two (a bin count must be one: TAP 15).
"""

from __future__ import annotations

import math

PEP458_BINS = 16384
PEP458_TARGETS = 2_273_481
MIN_BINS = 2
MAX_BINS = 65536


def bins_problem(bins: int) -> str | None:
    """Why ``bins`` is not a valid bin count (one line), or None."""
    if bins < MIN_BINS or bins & (bins - 1) or bins > MAX_BINS:
        return f"--bins must be a power of two between {MIN_BINS} and {MAX_BINS}, not {bins}"
    return None


def bins_for_targets(targets: int) -> int:
    """The bin count for a repository expected to sign ``targets`` targets (PEP 458's square-root rule)."""
    if targets < 1:
        return MIN_BINS
    ideal = PEP458_BINS * math.sqrt(targets / PEP458_TARGETS)
    return max(MIN_BINS, min(MAX_BINS, 1 << round(math.log2(ideal))))
