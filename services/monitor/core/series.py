"""A node sample as Prometheus series: which gauge gets which value under which labels.

Pure, so the mapping (names, labels, units, what is left out when NVML could
not read a value) is tested without a registry; `services.monitor.metrics`
applies the result to the real gauges.

Names follow OpenPAI's job-exporter (`nvidiasmi_*`) where it has one. The node's own
readings are `pai_node_*` (`pai_node_load1`): node_exporter's `node_*` names, which they
had before, clashed with node_exporter's own series of the same node. GPU series are
labelled with `minor_number` (what `/dev/nvidiaN` and OpenPAI's dashboards use) and
`uuid` (stable when a board is swapped or the index order changes).
"""

from __future__ import annotations

import msgspec

from services.monitor.core.samples import GpuSample, NodeSample, TaskUsage

GPU_LABELS = ("minor_number", "uuid")
ECC_LABELS = (*GPU_LABELS, "type")
# OpenPAI job-exporter's task labels (its job_instance_id is PAI's attempt, not shown).
TASK_LABELS = ("username", "job_name", "role_name", "task_index", "virtual_cluster")
TASK_GPU_LABELS = (*TASK_LABELS, "minor_number")
EXTERNAL_PROCESS_LABELS = ("minor_number", "pid")


class Series(msgspec.Struct, frozen=True):
    name: str
    labels: tuple[str, ...]  # values, in the order of the gauge's label names
    value: float


def node_series(sample: NodeSample) -> list[Series]:
    out = [
        Series("pai_node_cpu_percent", (), sample.cpuPercent),
        Series("pai_node_memory_used_bytes", (), float(sample.memoryUsedBytes)),
        Series("pai_node_memory_total_bytes", (), float(sample.memoryTotalBytes)),
        Series("pai_node_load1", (), sample.load1),
        Series("pai_node_load5", (), sample.load5),
        Series("pai_node_load15", (), sample.load15),
        Series("pai_node_data_disk_used_bytes", (), float(sample.diskUsedBytes)),
        Series("pai_node_data_disk_total_bytes", (), float(sample.diskTotalBytes)),
        Series("nvidiasmi_attached_gpus", (), float(len(sample.gpus))),
    ]
    for gpu in sample.gpus:
        out.extend(gpu_series(gpu))
    for task in sample.tasks:
        out.extend(task_series(task))
    for process in sample.externalGpuProcesses:
        out.append(Series("gpu_used_by_external_process_count", (process.minorNumber, str(process.pid)), 1.0))
    return out


def task_series(task: TaskUsage) -> list[Series]:
    labels = (task.username, task.jobName, task.roleName, task.taskIndex, task.virtualCluster)
    out = [
        Series("task_cpu_percent", labels, task.cpuPercent),
        Series("task_mem_usage_byte", labels, float(task.memoryBytes)),
    ]
    for gpu in task.gpus:
        if gpu.gpuPercent is not None:
            out.append(Series("task_gpu_percent", (*labels, gpu.minorNumber), gpu.gpuPercent))
        if gpu.gpuMemPercent is not None:
            out.append(Series("task_gpu_mem_percent", (*labels, gpu.minorNumber), gpu.gpuMemPercent))
    return out


def gpu_labels(gpu: GpuSample) -> tuple[str, str]:
    minor = gpu.minorNumber if gpu.minorNumber is not None else gpu.index
    return (str(minor), gpu.uuid)


def gpu_series(gpu: GpuSample) -> list[Series]:
    """The series of one GPU; a reading NVML could not give is left out (no series),
    so a dashboard shows a gap rather than a false 0."""
    labels = gpu_labels(gpu)
    readings = {
        "nvidiasmi_utilization_gpu": gpu.utilizationGpuPercent,
        "nvidiasmi_utilization_memory": gpu.utilizationMemoryPercent,
        "nvidiasmi_memory_used_bytes": gpu.memoryUsedBytes,
        "nvidiasmi_memory_total_bytes": gpu.memoryTotalBytes,
        "nvidiasmi_temperature": gpu.temperatureCelsius,
        "nvidiasmi_process_count": len(gpu.processes),
        "nvidiasmi_power_draw_watts": gpu.powerWatts,
        "nvidiasmi_performance_state": gpu.performanceState,
    }
    out = [Series(name, labels, float(value)) for name, value in readings.items() if value is not None]
    out.extend(
        Series("nvidiasmi_ecc_error_count", (*labels, kind), float(count)) for kind, count in sorted(gpu.eccErrors.items())
    )
    return out
