"""A service's freed memory goes back to the machine (libs/common/heap.py).

Run in a child process of its own, so that what the test suite's own process holds
does not blur the figures: the child fragments its heap as a burst of jobs does
(records of a few KiB, most of them freed, every 64th kept), then trims."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from libs.common import heap

CHILD = r"""
import json
from libs.common import heap

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

records = [bytes(2048) + i.to_bytes(4, "little") for i in range(100_000)]  # ~200 MiB from malloc
kept = records[::64]  # what outlives the burst, spread over the whole heap
del records
before = rss_kib()
trimmed = heap.return_freed_memory()
print(json.dumps({"before": before, "after": rss_kib(), "trimmed": trimmed, "kept": len(kept)}))
"""


@pytest.mark.skipif(heap._malloc_trim is None, reason="this C library has no malloc_trim (not glibc)")
def test_memory_freed_in_the_middle_of_the_heap_leaves_the_process_once_trimmed() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60)
    figures = json.loads(out.stdout)
    assert figures["trimmed"] is True
    # Freed but resident before the trim (the kept records pin the heap's top), returned after it.
    assert figures["before"] > 150 * 1024, figures
    assert figures["after"] < figures["before"] - 100 * 1024, figures


async def test_the_periodic_trim_ends_when_the_service_stops() -> None:
    stopping = asyncio.Event()
    task = asyncio.ensure_future(heap.trim_periodically(stopping, every=0.01))
    await asyncio.sleep(0.05)  # a few trims
    assert not task.done()
    stopping.set()
    await asyncio.wait_for(task, 5)
