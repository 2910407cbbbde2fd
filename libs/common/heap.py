"""Giving the memory a service freed back to the machine (glibc's `malloc_trim`).

Why: a burst of jobs swells every service's working set for a while (rest's live
index holds thousands of jobs until the history has them and the sweep archives
them; the monitor's alert views; the messages in flight), then it is freed. Python
frees objects larger than 512 bytes (records, event payloads, response bodies) to
glibc's malloc, which keeps freed memory in the middle of its heap resident until it
is asked to return it: only the very top of the heap shrinks by itself. Measured
(`benchmarks/service_rss.py`, 1k to 25k jobs in bursts): rest's RSS rose 75 MiB while
the Python objects it held stayed flat (tracemalloc: 59 MiB at 1k and at 4k jobs),
and one `malloc_trim(0)` returned 60 MiB of rest's and 54 MiB of the monitor's. So
each service trims its heap every TRIM_SECONDS: its RSS then follows what it holds
(live work), not the largest burst it has ever met.

The trim runs in a worker thread (ctypes releases the GIL for the call), so the
event loop goes on; allocations wait for the arena's lock meanwhile, a few ms on a
heap of hundreds of MiB. Where the C library is not glibc (musl), there is no such
call and nothing is done: those allocators return memory by themselves.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable

log = logging.getLogger("pai.heap")

# Often enough that a burst's memory leaves within a minute, rare enough to cost
# nothing measurable (each trim: a walk over the free chunks and madvise calls).
TRIM_SECONDS = 30.0


def _find_malloc_trim() -> Callable[[int], int] | None:
    # The C library the interpreter runs on (its symbols, as local_namespaces reads
    # mount and unshare): no search for a file, which slim images may not allow.
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _find_malloc_trim()


def return_freed_memory() -> bool:
    """Return the heap's free pages to the machine; False where the C library cannot."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


async def trim_periodically(stopping: asyncio.Event, every: float = TRIM_SECONDS) -> None:
    """Trim the heap every `every` seconds until `stopping` is set (a service's background task)."""
    if _malloc_trim is None:
        log.info("no malloc_trim in this C library: the heap is not trimmed")
        return
    while not stopping.is_set():
        try:
            await asyncio.wait_for(stopping.wait(), every)
        except TimeoutError:
            await asyncio.to_thread(return_freed_memory)
