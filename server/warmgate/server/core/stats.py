"""Summary statistics shared by the server's reports and the benchmarks."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between the closest ranks.

    This is numpy's default ("linear") and statistics.quantiles(method="inclusive"): the
    percentile of two samples lies between them rather than jumping to one, so p99 of a short
    benchmark run does not collapse onto its maximum. NaN for no values.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = q / 100 * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
