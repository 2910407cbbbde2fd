"""NVML readings -> `GpuSample`: the pure half of GPU collection.

The sampler asks NVML (pynvml) for raw values and wraps them, untouched, in an
`NvmlReading`; this module turns that into the stored sample. Keeping the
conversion here lets it be tested with fake readings on machines without GPUs,
while the NVML calls themselves run only where a driver exists.

pynvml's return values vary with driver and binding versions: strings may come
as bytes, a process's memory may be None or NVML's "not available" sentinel, and
any single query may fail with "Not Supported" on some boards. None of these is
an error of the node; they become missing fields.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from services.monitor.core.samples import GpuProcess, GpuSample

# NVML_VALUE_NOT_AVAILABLE for unsigned long long fields (all bits set).
NVML_NOT_AVAILABLE = 2**64 - 1


class NvmlReading(msgspec.Struct, frozen=True, kw_only=True):
    """What NVML answered for one GPU, as pynvml returned it.

    `utilization` has `.gpu` and `.memory` (percent), `memory` has `.used` and
    `.total` (bytes), each process `.pid` and `.usedGpuMemory` (bytes). A query
    that failed is None and its error text is in `errors`.
    """

    index: int
    uuid: Any = None
    minor_number: Any = None
    name: Any = None
    utilization: Any = None
    memory: Any = None
    temperature: Any = None
    power_milliwatts: Any = None
    performance_state: Any = None
    # OpenPAI's ECC type label -> the count NVML gave (None where it could not).
    ecc_errors: Any = None
    compute_processes: Any = ()
    graphics_processes: Any = ()
    errors: tuple[str, ...] = ()


def gpu_sample(reading: NvmlReading) -> GpuSample:
    util = reading.utilization
    memory = reading.memory
    return GpuSample(
        index=reading.index,
        uuid=_text(reading.uuid),
        minorNumber=_int_or_none(reading.minor_number),
        name=_text(reading.name),
        utilizationGpuPercent=_percent(getattr(util, "gpu", None)),
        utilizationMemoryPercent=_percent(getattr(util, "memory", None)),
        memoryUsedBytes=_bytes_or_none(getattr(memory, "used", None)),
        memoryTotalBytes=_bytes_or_none(getattr(memory, "total", None)),
        temperatureCelsius=None if reading.temperature is None else float(reading.temperature),
        powerWatts=None if reading.power_milliwatts is None else float(reading.power_milliwatts) / 1000.0,
        performanceState=_performance_state(reading.performance_state),
        eccErrors={kind: n for kind, count in (reading.ecc_errors or {}).items() if (n := _bytes_or_none(count)) is not None},
        processes=merge_processes(reading.compute_processes or (), reading.graphics_processes or ()),
        errors=list(reading.errors),
    )


def merge_processes(*lists: Iterable[Any]) -> list[GpuProcess]:
    """One entry per pid, ordered by pid.

    A process doing both compute and graphics appears in both NVML lists with
    the same memory; counting it twice would overstate what it holds.
    """
    by_pid: dict[int, int | None] = {}
    for process in (p for plist in lists for p in plist):
        pid = int(process.pid)
        used = _bytes_or_none(getattr(process, "usedGpuMemory", None))
        known = by_pid.get(pid)
        by_pid[pid] = used if known is None else max(known, used or 0)
    return [GpuProcess(pid=pid, usedMemoryBytes=used) for pid, used in sorted(by_pid.items())]


def _performance_state(value: Any) -> int | None:
    # P-states run from 0 (fastest) to 15; NVML says 32 (NVML_PSTATE_UNKNOWN) when it cannot tell.
    if value is None:
        return None
    value = int(value)
    return value if 0 <= value <= 15 else None


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _bytes_or_none(value: Any) -> int | None:
    if value is None:
        return None
    number = int(value)
    if number < 0 or number >= NVML_NOT_AVAILABLE:
        return None
    return number


def _percent(value: Any) -> float | None:
    if value is None:
        return None
    return min(100.0, max(0.0, float(value)))
