"""The node agent's GPU and task collection: NVML through an injected fake pynvml
module (several GPUs, ECC, a process of a task and one of no task), and the real
pynvml on a machine without a GPU (zero GPUs, no error)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace as Obj

import pynvml
import pytest
from prometheus_client import REGISTRY

from services.monitor import metrics
from services.monitor.core.series import node_series
from services.monitor.core.tasks import ProcessReading, TaskIdentity, identify, parse_environ, pod_uid_from_cgroup, task_usage
from services.monitor.sampler import NodeSampler, NvmlGpus, TaskProcesses

GIB = 1024**3


class FakePynvml:
    """A module-shaped stand-in for pynvml: the calls the agent makes, for made-up boards."""

    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED

    def __init__(self, boards: list[dict]):
        self.boards = boards

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"

    def nvmlDeviceGetCount(self):
        return len(self.boards)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.boards[index]

    def nvmlDeviceGetUUID(self, board):
        return board["uuid"]

    def nvmlDeviceGetMinorNumber(self, board):
        return board["minor"]

    def nvmlDeviceGetName(self, board):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUtilizationRates(self, board):
        return Obj(gpu=board["util"], memory=board["util"] // 2)

    def nvmlDeviceGetMemoryInfo(self, board):
        return Obj(used=board["used"], total=80 * GIB, free=80 * GIB - board["used"])

    def nvmlDeviceGetTemperature(self, board, sensor):
        return 61

    def nvmlDeviceGetPowerUsage(self, board):
        return 312_500  # milliwatts

    def nvmlDeviceGetPerformanceState(self, board):
        return board.get("pstate", 0)

    def nvmlDeviceGetTotalEccErrors(self, board, error_type, counter_type):
        ecc = board.get("ecc")
        if ecc is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return ecc[(error_type, counter_type)]

    def nvmlDeviceGetComputeRunningProcesses(self, board):
        return [Obj(pid=pid, usedGpuMemory=mem) for pid, mem in board["procs"]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, board):
        return []


TASK_PID, OTHER_TASK_PID, EXTERNAL_PID = 4242, 4343, 999

BOARDS = [
    # A healthy board held by task worker/0.
    {"uuid": "GPU-a", "minor": 0, "util": 90, "used": 20 * GIB, "procs": [(TASK_PID, 20 * GIB)],
     "ecc": {(0, 0): 3, (1, 0): 0, (0, 1): 10, (1, 1): 0}},
    # A board with an uncorrectable error, held by the same task.
    {"uuid": "GPU-b", "minor": 1, "util": 40, "used": 8 * GIB, "procs": [(TASK_PID, 8 * GIB)],
     "ecc": {(0, 0): 0, (1, 0): 2, (0, 1): 0, (1, 1): 5}, "pstate": 2},
    # A board someone uses outside PAI, next to another task; no ECC on this one.
    {"uuid": "GPU-c", "minor": 2, "util": 100, "used": 30 * GIB, "procs": [(EXTERNAL_PID, 10 * GIB), (OTHER_TASK_PID, 20 * GIB)]},
]

WORKER = TaskIdentity(key="alice.train.1.worker.0.0", username="alice", job_name="alice~train", role_name="worker",
                      task_index="0", virtual_cluster="vc1")
PS = TaskIdentity(key="bob.ps.1.ps.0.0", username="bob", job_name="bob~ps", role_name="ps", task_index="0", virtual_cluster="vc2")


class FakeTasks:
    def read(self):
        return [
            ProcessReading(pid=TASK_PID, task=WORKER, cpuPercent=150.0, rssBytes=3 * GIB),
            ProcessReading(pid=TASK_PID + 1, task=WORKER, cpuPercent=50.0, rssBytes=1 * GIB),  # its data loader
            ProcessReading(pid=OTHER_TASK_PID, task=PS, cpuPercent=10.0, rssBytes=GIB),
        ]


@pytest.fixture
def sample(tmp_path):
    gpus = NvmlGpus(FakePynvml(BOARDS))
    sampler = NodeSampler("gpu-node-7", tmp_path, gpus=gpus, tasks=FakeTasks())
    sampler.open()
    try:
        yield sampler.sample()
    finally:
        sampler.close()


def test_every_gpu_is_read_with_ecc_power_and_performance_state(sample):
    assert [g.uuid for g in sample.gpus] == ["GPU-a", "GPU-b", "GPU-c"]
    a, b, c = sample.gpus
    assert a.eccErrors == {"volatile_single": 3, "volatile_double": 0, "aggregated_single": 10, "aggregated_double": 0}
    assert b.eccErrors["volatile_double"] == 2 and b.performanceState == 2
    assert c.eccErrors == {} and not c.errors  # no ECC on the board is not an error
    assert a.powerWatts == pytest.approx(312.5)


def test_gpu_processes_are_attributed_to_tasks_and_the_rest_is_external(sample):
    worker, ps = sample.tasks  # sorted by key
    assert (worker.jobName, worker.roleName, worker.taskIndex, worker.virtualCluster) == ("alice~train", "worker", "0", "vc1")
    assert [g.minorNumber for g in worker.gpus] == ["0", "1"]
    assert worker.gpus[0].gpuPercent == 90 and worker.gpus[0].gpuMemPercent == pytest.approx(25.0)
    assert worker.memoryBytes == 4 * GIB
    assert worker.cpuPercent == pytest.approx(200.0 / sample.cpuCount, rel=1e-3)
    assert [(g.minorNumber, g.gpuMemPercent) for g in ps.gpus] == [("2", 25.0)]
    assert [(e.minorNumber, e.pid) for e in sample.externalGpuProcesses] == [("2", EXTERNAL_PID)]


def test_the_sample_becomes_openpai_named_series(sample):
    series = {(s.name, s.labels): s.value for s in node_series(sample)}
    worker = ("alice", "alice~train", "worker", "0", "vc1")
    assert series[("task_gpu_percent", (*worker, "1"))] == 40
    assert series[("task_gpu_mem_percent", (*worker, "0"))] == pytest.approx(25.0)
    assert series[("task_mem_usage_byte", worker)] == 4 * GIB
    assert ("task_cpu_percent", worker) in series
    assert series[("nvidiasmi_ecc_error_count", ("1", "GPU-b", "volatile_double"))] == 2
    assert series[("gpu_used_by_external_process_count", ("2", str(EXTERNAL_PID)))] == 1
    assert series[("nvidiasmi_utilization_gpu", ("2", "GPU-c"))] == 100
    assert series[("nvidiasmi_temperature", ("0", "GPU-a"))] == 61


def test_series_of_a_task_that_ended_are_removed_at_the_next_sample(sample):
    metrics.record_node_sample(sample)
    labels = {"username": "bob", "job_name": "bob~ps", "role_name": "ps", "task_index": "0", "virtual_cluster": "vc2"}
    assert REGISTRY.get_sample_value("task_mem_usage_byte", labels) == GIB
    metrics.record_node_sample(type(sample)(node=sample.node, at=sample.at + 5))
    assert REGISTRY.get_sample_value("task_mem_usage_byte", labels) is None
    external = {"minor_number": "2", "pid": str(EXTERNAL_PID)}
    assert REGISTRY.get_sample_value("gpu_used_by_external_process_count", external) is None


# --- which task a process belongs to -------------------------------------------------


def test_environment_names_the_task():
    raw = b"PATH=/bin\0PAI_TASK_KEY=alice.t.1.w.0.0\0PAI_USER_NAME=alice\0PAI_JOB_NAME=alice~t\0" \
          b"PAI_CURRENT_TASK_ROLE_NAME=w\0PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX=0\0PAI_VIRTUAL_CLUSTER=default\0junk"
    env = parse_environ(raw)
    assert "PATH" not in env
    assert identify(env) == TaskIdentity(key="alice.t.1.w.0.0", username="alice", job_name="alice~t", role_name="w",
                                         task_index="0", virtual_cluster="default")
    assert identify(parse_environ(b"HOME=/root\0")) is None


@pytest.mark.parametrize(
    "cgroup, uid",
    [
        pytest.param("12:pids:/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/abc123\n",
                     "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b", id="cgroup-v1"),
        pytest.param("0::/kubepods.slice/kubepods-besteffort.slice/"
                     "kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice/cri-containerd-1.scope\n",
                     "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b", id="cgroup-v2-systemd"),
        pytest.param("0::/user.slice/user-1000.slice/session-3.scope\n", None, id="not-a-pod"),
    ],
)
def test_a_kubernetes_pod_is_found_from_the_cgroup(cgroup, uid):
    assert pod_uid_from_cgroup(cgroup) == uid
    identity = identify({}, cgroup)
    assert (identity.key if identity else None) == (f"pod:{uid}" if uid else None)


def test_a_real_process_with_a_task_environment_is_found_with_its_cpu_and_memory():
    env = {**os.environ, "PAI_TASK_KEY": "carol.probe.1.main.0.0", "PAI_JOB_NAME": "carol~probe", "PAI_USER_NAME": "carol",
           "PAI_CURRENT_TASK_ROLE_NAME": "main", "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": "0",
           "PAI_VIRTUAL_CLUSTER": "default"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        reader = TaskProcesses()
        deadline = time.monotonic() + 10
        while not (found := [r for r in reader.read() if r.pid == child.pid]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert found, "the task's process was not found"
        assert found[0].task.job_name == "carol~probe" and found[0].rssBytes > 0
        usages, external = task_usage(found, [], cpu_count=2)
        assert [u.key for u in usages] == ["carol.probe.1.main.0.0"] and external == []
    finally:
        child.kill()
        child.wait()


# --- the real library on this machine ----------------------------------------------


def test_real_pynvml_without_a_gpu_gives_zero_gpus_and_no_error(tmp_path: Path):
    gpus = NvmlGpus()
    sampler = NodeSampler("here", tmp_path, gpus=gpus)
    sampler.open()
    try:
        sample = sampler.sample()
    finally:
        sampler.close()
    if sample.gpus:
        pytest.skip(f"this machine has {len(sample.gpus)} GPU(s): the no-GPU case needs a machine without")
    assert sample.gpus == [] and sample.externalGpuProcesses == []
    assert sample.gpuNote  # says why, e.g. "NVML not available: NVML Shared Library Not Found"
    assert all(not any(t.gpus) for t in sample.tasks)


def test_real_pynvml_with_gpus_reads_every_board(tmp_path: Path):
    sampler = NodeSampler("here", tmp_path)
    sampler.open()
    try:
        sample = sampler.sample()
    finally:
        sampler.close()
    if not sample.gpus:
        pytest.skip("no NVIDIA GPU or driver on this machine")
    for gpu in sample.gpus:
        assert gpu.uuid.startswith("GPU-") and gpu.memoryTotalBytes
        assert gpu.utilizationGpuPercent is not None and 0 <= gpu.utilizationGpuPercent <= 100
