"""Figures the benchmark scripts share."""

from __future__ import annotations

import time


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile `q` (0..100) of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def python_loop_seconds(iterations: int = 5_000_000, tries: int = 3) -> float:
    """CPU seconds a fixed loop of Python additions takes here, the fastest of
    `tries`: a yardstick for figures taken at different times. On a shared
    virtual machine the same code's CPU per job moves with it by a third or
    more from one hour to the next."""
    best = float("inf")
    for _ in range(tries):
        started = time.process_time()
        total = 0
        for number in range(iterations):
            total += number
        best = min(best, time.process_time() - started)
    return round(best, 3)
