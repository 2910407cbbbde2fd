"""What this machine has: CPUs, memory, GPUs (NVML). No GPU is the normal case."""

from __future__ import annotations

import logging
import os
import socket

import msgspec
import psutil

log = logging.getLogger("pai.machine")


class MachineInfo(msgspec.Struct, frozen=True, kw_only=True):
    hostname: str
    cpus: int
    memory_mb: int
    gpus: int


def gpu_count() -> int:
    """GPUs visible through NVML; 0 without a driver or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no libnvidia-ml, no driver, no device: all mean "no GPU"
        log.debug("no GPU found through NVML: %s", exc)
        return 0


def detect() -> MachineInfo:
    return MachineInfo(
        hostname=socket.gethostname(),
        cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
        memory_mb=psutil.virtual_memory().total // (1024 * 1024),
        gpus=gpu_count(),
    )
