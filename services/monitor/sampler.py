"""Sampling this machine: CPU, memory, load and data disk through psutil, GPUs through NVML.

A machine without GPUs, without the NVIDIA driver or without libnvidia-ml is a
normal node: the sample says so in `gpuNote` and the monitor logs it once at
info level. Only the NVML calls live here; turning their answers into a
`GpuSample` is `services.monitor.core.gpus`, tested without a GPU.

Every call here blocks (NVML can take tens of milliseconds per query on a busy
board); the service runs `NodeSampler.sample` in a worker thread.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import pynvml

from services.monitor.core.gpus import NvmlReading, gpu_sample
from services.monitor.core.samples import GpuSample, NodeSample

log = logging.getLogger("pai.monitor.sampler")


def default_node_name() -> str:
    """The name this machine's samples are stored under: `NODE_NAME` where set (the
    Kubernetes convention: `spec.nodeName` through the downward API, so the sample
    names the node and not the pod), else the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


class NvmlGpus:
    """The GPUs of this machine through NVML, opened once."""

    def __init__(self, nvml: ModuleType | Any = pynvml):
        self._nvml = nvml
        self._opened = False
        # Why there are no GPU readings ("" while NVML answers).
        self.note = ""

    def open(self) -> None:
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            self.note = f"NVML not available: {exc}"
            log.info("no GPU metrics on this node (%s)", self.note)
            return
        self._opened = True
        log.info("NVML %s, %d GPU(s)", self._ask_or(self._nvml.nvmlSystemGetDriverVersion, "?"), self._count())

    def close(self) -> None:
        if self._opened:
            self._opened = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.info("NVML shutdown: %s", exc)

    def sample(self) -> list[GpuSample]:
        if not self._opened:
            return []
        try:
            count = self._nvml.nvmlDeviceGetCount()
        except self._nvml.NVMLError as exc:
            self._note(f"NVML failed: {exc}")
            return []
        self._note("")
        if count == 0:
            self.note = "NVML reports no GPU"
        return [gpu_sample(self.read(index)) for index in range(count)]

    def read(self, index: int) -> NvmlReading:
        """Every reading of one GPU; a failing query leaves its field None and says why."""
        nvml = self._nvml
        errors: list[str] = []

        def ask(what: str, query: Callable[..., Any], *args: Any) -> Any:
            try:
                return query(*args)
            except nvml.NVMLError as exc:
                errors.append(f"{what}: {exc}")
                return None

        handle = ask("device", nvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            return NvmlReading(index=index, errors=tuple(errors))
        return NvmlReading(
            index=index,
            uuid=ask("uuid", nvml.nvmlDeviceGetUUID, handle),
            minor_number=ask("minor number", nvml.nvmlDeviceGetMinorNumber, handle),
            name=ask("name", nvml.nvmlDeviceGetName, handle),
            utilization=ask("utilization", nvml.nvmlDeviceGetUtilizationRates, handle),
            memory=ask("memory", nvml.nvmlDeviceGetMemoryInfo, handle),
            temperature=ask("temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
            compute_processes=ask("compute processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle) or (),
            graphics_processes=ask("graphics processes", nvml.nvmlDeviceGetGraphicsRunningProcesses, handle) or (),
            errors=tuple(errors),
        )

    def _count(self) -> int:
        return int(self._ask_or(self._nvml.nvmlDeviceGetCount, 0))

    def _ask_or(self, query: Callable[[], Any], default: Any) -> Any:
        try:
            return query()
        except self._nvml.NVMLError:
            return default

    def _note(self, note: str) -> None:
        if note and note != self.note:
            log.warning("GPU readings failed: %s", note)
        elif not note and self.note:
            log.info("GPU readings back")
        self.note = note


class NodeSampler:
    def __init__(
        self,
        node: str,
        data_dir: Path,
        *,
        gpus: NvmlGpus | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.node = node
        self.data_dir = Path(data_dir)
        self.gpus = gpus or NvmlGpus()
        self._clock = clock

    def open(self) -> None:
        # psutil measures CPU busy time between two calls; the first call only
        # starts the measurement, so make it now rather than report a 0.
        psutil.cpu_percent(interval=None)
        self.gpus.open()

    def close(self) -> None:
        self.gpus.close()

    def sample(self) -> NodeSample:
        memory = psutil.virtual_memory()
        load1, load5, load15 = psutil.getloadavg()
        disk_path = existing_ancestor(self.data_dir)
        disk = psutil.disk_usage(str(disk_path))
        gpus = self.gpus.sample()
        return NodeSample(
            node=self.node,
            at=self._clock(),
            cpuCount=psutil.cpu_count() or 0,
            cpuPercent=float(psutil.cpu_percent(interval=None)),
            # "Used" as people read it: what programs could not get back without swapping.
            memoryUsedBytes=int(memory.total - memory.available),
            memoryTotalBytes=int(memory.total),
            load1=float(load1),
            load5=float(load5),
            load15=float(load15),
            diskPath=str(disk_path),
            diskUsedBytes=int(disk.used),
            diskTotalBytes=int(disk.total),
            gpus=gpus,
            gpuNote=self.gpus.note if not gpus else "",
        )


def existing_ancestor(path: Path) -> Path:
    """`path`, or its nearest existing parent: the data dir may not be created yet."""
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
