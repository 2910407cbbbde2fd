"""Sampling this machine: psutil for the host, NVML through a fake module shaped like
pynvml (and the real one where a GPU and driver exist)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from types import SimpleNamespace as Obj

import pynvml
import pytest

from services.monitor.core import GpuProcess
from services.monitor.sampler import NodeSampler, NvmlGpus, default_node_name, existing_ancestor

GIB = 1024**3


class FakeNvml:
    """The part of pynvml the sampler calls, answering for made-up GPUs."""

    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def __init__(self, gpus: list[dict] | None = None, *, init_error: int | None = None):
        self.gpus = gpus or []
        self.init_error = init_error
        self.count_error: int | None = None
        self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlDeviceGetCount(self):
        if self.count_error is not None:
            raise pynvml.NVMLError(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self._answer(self.gpus[index], "handle", index)

    def _answer(self, gpu: dict, what: str, default=None):
        value = gpu.get(what, default)
        if isinstance(value, pynvml.NVMLError):
            raise value
        return value

    def nvmlDeviceGetUUID(self, handle):
        return self._answer(self.gpus[handle], "uuid")

    def nvmlDeviceGetMinorNumber(self, handle):
        return self._answer(self.gpus[handle], "minor", handle)

    def nvmlDeviceGetName(self, handle):
        return self._answer(self.gpus[handle], "name", "NVIDIA A100-SXM4-40GB")

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self._answer(self.gpus[handle], "util")

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self._answer(self.gpus[handle], "memory")

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._answer(self.gpus[handle], "temperature")

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self._answer(self.gpus[handle], "compute", [])

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return self._answer(self.gpus[handle], "graphics", [])


def gpu(index: int, **overrides) -> dict:
    answers = dict(
        uuid=f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        util=Obj(gpu=50 + index, memory=10 + index),
        memory=Obj(total=40 * GIB, used=index * GIB, free=(40 - index) * GIB),
        temperature=40 + index,
        compute=[Obj(pid=1000 + index, usedGpuMemory=index * GIB)],
    )
    answers.update(overrides)
    return answers


def not_supported() -> pynvml.NVMLError:
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def sampler_logs(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "pai.monitor.sampler"]


def test_a_machine_without_the_driver_has_no_gpus_and_says_why_once_at_info(caplog):
    caplog.set_level(logging.INFO, logger="pai.monitor.sampler")
    gpus = NvmlGpus(FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    gpus.open()
    assert [gpus.sample() for _ in range(3)] == [[], [], []]
    assert gpus.note == "NVML not available: NVML Shared Library Not Found"
    assert [(r.levelno, r.getMessage()) for r in sampler_logs(caplog)] == [
        (logging.INFO, "no GPU metrics on this node (NVML not available: NVML Shared Library Not Found)")
    ]
    gpus.close()


def test_gpus_are_read_with_their_processes():
    nvml = FakeNvml([gpu(0), gpu(1, compute=[], graphics=[Obj(pid=77, usedGpuMemory=None)])])
    gpus = NvmlGpus(nvml)
    gpus.open()
    first, second = gpus.sample()
    assert (first.index, first.uuid, first.utilizationGpuPercent, first.memoryTotalBytes) == (
        0,
        "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
        50.0,
        40 * GIB,
    )
    assert first.processes == [GpuProcess(pid=1000, usedMemoryBytes=0)]
    assert (second.minorNumber, second.temperatureCelsius, second.memoryUsedBytes) == (1, 41.0, GIB)
    assert second.processes == [GpuProcess(pid=77, usedMemoryBytes=None)]
    assert gpus.note == ""
    gpus.close()
    assert nvml.shutdowns == 1


@pytest.mark.parametrize(
    "answers, check",
    [
        pytest.param(
            dict(temperature=not_supported()),
            lambda s: s.temperatureCelsius is None and s.errors == ["temperature: Not Supported"],
            id="unsupported-temperature",
        ),
        pytest.param(
            dict(compute=not_supported(), graphics=not_supported()),
            lambda s: s.processes == [] and len(s.errors) == 2,
            id="process-list-not-supported",
        ),
        pytest.param(
            dict(handle=pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)),
            lambda s: s.index == 0 and s.uuid == "" and s.errors == ["device: GPU is lost"],
            id="gpu-fell-off-the-bus",
        ),
    ],
)
def test_a_failing_query_leaves_that_reading_unknown_and_keeps_the_others(answers, check):
    gpus = NvmlGpus(FakeNvml([gpu(0, **answers)]))
    gpus.open()
    (sample,) = gpus.sample()
    assert check(sample), sample


def test_nvml_failing_after_start_is_logged_once_and_recovers(caplog):
    caplog.set_level(logging.INFO, logger="pai.monitor.sampler")
    nvml = FakeNvml([gpu(0)])
    gpus = NvmlGpus(nvml)
    gpus.open()
    nvml.count_error = pynvml.NVML_ERROR_UNKNOWN
    assert gpus.sample() == [] and gpus.sample() == []
    assert gpus.note.startswith("NVML failed: ")
    nvml.count_error = None
    assert len(gpus.sample()) == 1 and gpus.note == ""
    warnings = [r for r in sampler_logs(caplog) if r.levelno >= logging.WARNING]
    assert len(warnings) == 1


def test_close_without_open_driver_does_not_shut_nvml_down():
    nvml = FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    gpus = NvmlGpus(nvml)
    gpus.open()
    gpus.close()
    assert nvml.shutdowns == 0


def test_node_sample_of_this_machine_without_gpus(tmp_path: Path):
    data_dir = tmp_path / "not" / "created" / "yet"
    sampler = NodeSampler(
        "node-a",
        data_dir,
        gpus=NvmlGpus(FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)),
        clock=lambda: 1234.5,
    )
    sampler.open()
    sample = sampler.sample()
    sampler.close()
    assert (sample.node, sample.at) == ("node-a", 1234.5)
    assert sample.cpuCount >= 1 and 0.0 <= sample.cpuPercent <= 100.0
    assert 0 < sample.memoryUsedBytes <= sample.memoryTotalBytes
    assert sample.load1 >= 0.0
    assert sample.diskPath == str(tmp_path) and 0 < sample.diskUsedBytes <= sample.diskTotalBytes
    assert sample.gpus == [] and sample.gpuNote.startswith("NVML not available")


def test_node_sample_with_gpus_has_no_note(tmp_path: Path):
    sampler = NodeSampler("node-b", tmp_path, gpus=NvmlGpus(FakeNvml([gpu(0), gpu(1)])))
    sampler.open()
    sample = sampler.sample()
    assert [g.index for g in sample.gpus] == [0, 1] and sample.gpuNote == ""


def test_nvml_answering_with_no_gpu_says_so(tmp_path: Path):
    sampler = NodeSampler("node-c", tmp_path, gpus=NvmlGpus(FakeNvml([])))
    sampler.open()
    assert sampler.sample().gpuNote == "NVML reports no GPU"


@pytest.mark.parametrize(
    "relative, expected",
    [
        pytest.param("", "", id="existing"),
        pytest.param("a/b/c", "", id="missing-parents"),
        pytest.param("sub", "sub", id="existing-child"),
    ],
)
def test_disk_is_measured_on_the_nearest_existing_directory(tmp_path: Path, relative, expected):
    (tmp_path / "sub").mkdir()
    assert existing_ancestor(tmp_path / relative) == (tmp_path / expected if expected else tmp_path)


@pytest.mark.parametrize(
    "env_value, expected",
    [pytest.param("gpu-node-7", "gpu-node-7", id="kubernetes-node-name"), pytest.param(None, None, id="host-name")],
)
def test_samples_are_stored_under_the_node_name(monkeypatch, env_value, expected):
    if env_value is None:
        monkeypatch.delenv("NODE_NAME", raising=False)
    else:
        monkeypatch.setenv("NODE_NAME", env_value)
    assert default_node_name() == (expected or socket.gethostname())


def test_real_nvml_where_a_gpu_is_present(tmp_path: Path):
    """The real pynvml path; runs only on machines with an NVIDIA driver."""
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVIDIA driver here: {exc}")
    sampler = NodeSampler("gpu-node", tmp_path)
    sampler.open()
    try:
        sample = sampler.sample()
    finally:
        sampler.close()
    assert len(sample.gpus) == count
    for g in sample.gpus:
        assert g.uuid.startswith(("GPU-", "MIG-"))
        assert g.memoryTotalBytes and g.memoryTotalBytes > 0
        assert g.utilizationGpuPercent is None or 0 <= g.utilizationGpuPercent <= 100
