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
from services.monitor.core.tasks import ProcessReading, TaskIdentity, identify, parse_environ, task_usage

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
            power_milliwatts=ask("power", _optional(nvml, "nvmlDeviceGetPowerUsage"), handle),
            performance_state=ask("performance state", _optional(nvml, "nvmlDeviceGetPerformanceState"), handle),
            ecc_errors=self._ecc(handle, errors),
            compute_processes=ask("compute processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle) or (),
            graphics_processes=ask("graphics processes", nvml.nvmlDeviceGetGraphicsRunningProcesses, handle) or (),
            errors=tuple(errors),
        )

    def _ecc(self, handle: Any, errors: list[str]) -> dict[str, Any]:
        """Uncorrected ECC counts the way OpenPAI labels them. Boards without ECC (or
        with it off) answer "Not Supported": that is no error, just no counts."""
        nvml = self._nvml
        query = getattr(nvml, "nvmlDeviceGetTotalEccErrors", None)
        if query is None:
            return {}
        counts: dict[str, Any] = {}
        for label, bit, counter in ECC_QUERIES:
            try:
                counts[label] = query(handle, bit, counter)
            except nvml.NVMLError as exc:
                if _not_supported(nvml, exc):
                    return {}
                errors.append(f"ecc {label}: {exc}")
        return counts

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


# OpenPAI's ECC type label -> (NVML memory error type, NVML counter type):
# NVML_MEMORY_ERROR_TYPE_CORRECTED/UNCORRECTED = 0/1, NVML_VOLATILE_ECC/AGGREGATE_ECC = 0/1.
ECC_QUERIES = (
    ("volatile_single", 0, 0),
    ("volatile_double", 1, 0),
    ("aggregated_single", 0, 1),
    ("aggregated_double", 1, 1),
)


def _optional(nvml: Any, name: str) -> Callable[..., Any]:
    """A query an older binding may lack: missing answers None, like "Not Supported"."""
    return getattr(nvml, name, None) or (lambda *_: None)


def _not_supported(nvml: Any, exc: Exception) -> bool:
    return getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)


class TaskProcesses:
    """Every live process of a PAI task on this machine (see core/tasks.py).

    A process is identified once, by pid and start time, from its environment
    (or, where that cannot be read, its cgroup naming a Kubernetes Pod); later
    samples only read its CPU and memory. psutil keeps each Process between
    calls, so its CPU percent covers the time since the previous sample.
    """

    def __init__(self, proc: Path = Path("/proc"), *, read_environ: bool = True):
        self._proc = proc
        # False: a process is told by its Pod's cgroup alone (Config.monitor_read_task_environ).
        self._read_environ = read_environ
        self._known: dict[tuple[int, float], TaskIdentity | None] = {}
        self._own_pid = os.getpid()

    def read(self) -> list[ProcessReading]:
        seen: dict[tuple[int, float], TaskIdentity | None] = {}
        out: list[ProcessReading] = []
        for process in psutil.process_iter():
            try:
                if process.pid == self._own_pid:
                    continue
                key = (process.pid, process.create_time())
                identity = self._known[key] if key in self._known else self._identify(process.pid)
                seen[key] = identity
                if identity is None:
                    continue
                out.append(
                    ProcessReading(
                        pid=process.pid,
                        task=identity,
                        cpuPercent=float(process.cpu_percent(interval=None)),
                        rssBytes=int(process.memory_info().rss),
                    )
                )
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        self._known = seen
        return out

    def _identify(self, pid: int) -> TaskIdentity | None:
        if not self._read_environ:
            try:
                return identify({}, (self._proc / str(pid) / "cgroup").read_text())
            except OSError:
                return None
        try:
            env = parse_environ((self._proc / str(pid) / "environ").read_bytes())
        except OSError:
            # Another user's process (the agent is not root): only its cgroup tells.
            try:
                return identify({}, (self._proc / str(pid) / "cgroup").read_text())
            except OSError:
                return None
        return identify(env)


class NodeSampler:
    def __init__(
        self,
        node: str,
        data_dir: Path,
        *,
        gpus: NvmlGpus | None = None,
        tasks: TaskProcesses | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.node = node
        self.data_dir = Path(data_dir)
        self.gpus = gpus or NvmlGpus()
        self.tasks = tasks or TaskProcesses()
        self._clock = clock
        self.agent = f"{socket.gethostname()}/{os.getpid()}"

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
        cpu_count = psutil.cpu_count() or 0
        tasks, external = task_usage(self.tasks.read(), gpus, cpu_count=cpu_count)
        return NodeSample(
            node=self.node,
            at=self._clock(),
            cpuCount=cpu_count,
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
            tasks=tasks,
            externalGpuProcesses=external,
            agent=self.agent,
        )


def existing_ancestor(path: Path) -> Path:
    """`path`, or its nearest existing parent: the data dir may not be created yet."""
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
