"""Figures the benchmark scripts share."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile `q` (0..100) of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]
