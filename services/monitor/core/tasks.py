"""Which PAI task a process belongs to, and what each task uses: the pure half.

A node agent sees processes (psutil) and GPU contexts (NVML pids); people want
to see tasks. Every process a PAI task starts carries the task's environment:

- local backend: `PAI_TASK_KEY` (the task's slug, also the mark the launcher
  sweeps a task's processes by) and the `PAI_*` variables of OpenPAI;
- Kubernetes: the same `PAI_*` variables in the container; where the
  environment cannot be read, `/proc/<pid>/cgroup` still names the Pod
  (`.../kubepods/<qos>/pod<uid>/<container>`), which is enough to tell a task's
  process from an external one.

A GPU process that belongs to no task is an *external* process (OpenPAI's
`gpu_used_by_external_process_count`): someone uses a GPU behind the
scheduler's back.

Labels are OpenPAI job-exporter's: `username`, `job_name` (the job id
`user~name`, as `PAI_JOB_NAME`), `role_name`, `task_index`, `virtual_cluster`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import msgspec

from services.monitor.core.samples import ExternalGpuProcess, GpuSample, TaskGpuUsage, TaskUsage

TASK_KEY_ENV = "PAI_TASK_KEY"
GPU_COUNT_ENV = "PAI_GPU_COUNT"  # the GPUs placed for the task, whether it uses them or not
_ENV_LABELS = {
    "username": "PAI_USER_NAME",
    "job_name": "PAI_JOB_NAME",
    "role_name": "PAI_CURRENT_TASK_ROLE_NAME",
    "task_index": "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX",
    "virtual_cluster": "PAI_VIRTUAL_CLUSTER",
}
# The environment variables a reader needs; everything else in /proc/<pid>/environ is dropped.
WANTED_ENV = frozenset({TASK_KEY_ENV, GPU_COUNT_ENV, *_ENV_LABELS.values()})

# cgroup v1 (`.../kubepods/burstable/pod<uid>/<id>`) and v2 with the systemd
# driver (`.../kubepods-burstable-pod<uid with _>.slice/...`).
_POD_UID = re.compile(
    r"kubepods[^\n]*?[/-]pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})")


class TaskIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """One task instance, as its processes name it."""

    key: str  # the local task slug, the Pod uid, or the job/role/index when neither is known
    username: str = ""
    job_name: str = ""
    role_name: str = ""
    task_index: str = ""
    virtual_cluster: str = ""
    gpu_count: int = 0  # GPUs placed for it (PAI_GPU_COUNT); 0 where not known

    def labels(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in _ENV_LABELS}


class ProcessReading(msgspec.Struct, frozen=True, kw_only=True):
    """One live process of a task at sample time."""

    pid: int
    task: TaskIdentity
    cpuPercent: float = 0.0  # of one core, as psutil counts (may exceed 100)
    rssBytes: int = 0


def parse_environ(raw: bytes) -> dict[str, str]:
    """`/proc/<pid>/environ` (NUL-separated `K=V`) -> the variables PAI reads."""
    out: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if not sep:
            continue
        key = name.decode("utf-8", "replace")
        if key in WANTED_ENV:
            out[key] = value.decode("utf-8", "replace")
    return out


def pod_uid_from_cgroup(text: str) -> str | None:
    """The uid of the Kubernetes Pod a process runs in, from `/proc/<pid>/cgroup`."""
    match = _POD_UID.search(text)
    return match.group(1).replace("_", "-").lower() if match else None


def identify(env: Mapping[str, str], cgroup: str = "") -> TaskIdentity | None:
    """The task a process belongs to, or None for a process of no task."""
    labels = {name: env.get(var, "") for name, var in _ENV_LABELS.items()}
    pod = pod_uid_from_cgroup(cgroup) if cgroup else None
    key = env.get(TASK_KEY_ENV) or (f"pod:{pod}" if pod else "")
    if not key and labels["job_name"] and labels["role_name"]:
        key = f"{labels['job_name']}/{labels['role_name']}/{labels['task_index']}"
    if not key:
        return None
    gpus = env.get(GPU_COUNT_ENV, "")
    return TaskIdentity(key=key, gpu_count=int(gpus) if gpus.isdigit() else 0, **labels)


def task_usage(
    processes: Iterable[ProcessReading],
    gpus: Iterable[GpuSample],
    *,
    cpu_count: int,
) -> tuple[list[TaskUsage], list[ExternalGpuProcess]]:
    """Per task: CPU (percent of the whole node, as OpenPAI), memory, and per GPU it
    holds a context on the card's busy percent and the share of the card's memory
    its processes hold. Also every (GPU minor number, pid) of a process of no task.

    A GPU pid that is not among `processes` is external: the task readers list
    every process of every task, so a pid they do not know belongs to none.
    """
    tasks: dict[str, TaskIdentity] = {}
    cpu: dict[str, float] = {}
    rss: dict[str, int] = {}
    of_pid: dict[int, str] = {}
    for reading in processes:
        key = reading.task.key
        tasks.setdefault(key, reading.task)
        cpu[key] = cpu.get(key, 0.0) + reading.cpuPercent
        rss[key] = rss.get(key, 0) + reading.rssBytes
        of_pid[reading.pid] = key
    gpu_use: dict[str, dict[str, TaskGpuUsage]] = {}
    external: list[ExternalGpuProcess] = []
    for gpu in gpus:
        minor = str(gpu.minorNumber if gpu.minorNumber is not None else gpu.index)
        held: dict[str, int] = {}
        for process in gpu.processes:
            owner = of_pid.get(process.pid)
            if owner is None:
                external.append(ExternalGpuProcess(minorNumber=minor, pid=process.pid))
                continue
            held[owner] = held.get(owner, 0) + (process.usedMemoryBytes or 0)
        for key, used in held.items():
            total = gpu.memoryTotalBytes or 0
            gpu_use.setdefault(key, {})[minor] = TaskGpuUsage(
                minorNumber=minor,
                gpuPercent=gpu.utilizationGpuPercent,
                gpuMemPercent=round(100.0 * used / total, 3) if total else None,
            )
    cores = max(1, cpu_count)
    usages = [
        TaskUsage(
            key=key,
            username=tasks[key].username,
            jobName=tasks[key].job_name,
            roleName=tasks[key].role_name,
            taskIndex=tasks[key].task_index,
            virtualCluster=tasks[key].virtual_cluster,
            gpuCount=tasks[key].gpu_count,
            cpuPercent=round(cpu[key] / cores, 3),
            memoryBytes=rss[key],
            gpus=[gpu_use[key][minor] for minor in sorted(gpu_use.get(key, {}))],
        )
        for key in sorted(tasks)
    ]
    return usages, sorted(external, key=lambda e: (e.minorNumber, e.pid))
