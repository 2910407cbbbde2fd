"""NVML readings -> GPU samples and Prometheus series, with fake readings shaped
like pynvml's answers (no GPU needed)."""

from __future__ import annotations

from types import SimpleNamespace as Obj

import msgspec
import pytest
from hypothesis import given, strategies as st

from services.monitor.core import (
    GpuProcess,
    GpuSample,
    NodeSample,
    NvmlReading,
    decode_node_sample,
    encode_node_sample,
    gpu_sample,
    merge_processes,
    node_key,
    node_series,
)
from services.monitor.core.gpus import NVML_NOT_AVAILABLE

GIB = 1024**3
UUID = "GPU-6b1c9b8e-6f0e-4d8a-9a55-0c1d2e3f4a5b"


def proc(pid: int, used: int | None) -> Obj:
    return Obj(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)


def reading(**overrides) -> NvmlReading:
    fields = dict(
        index=0,
        uuid=UUID,
        minor_number=0,
        name="NVIDIA H100 80GB HBM3",
        utilization=Obj(gpu=87, memory=41),
        memory=Obj(total=80 * GIB, used=30 * GIB, free=50 * GIB),
        temperature=61,
        compute_processes=[proc(4242, 29 * GIB)],
        graphics_processes=[],
    )
    fields.update(overrides)
    return NvmlReading(**fields)


FULL = GpuSample(
    index=0,
    uuid=UUID,
    minorNumber=0,
    name="NVIDIA H100 80GB HBM3",
    utilizationGpuPercent=87.0,
    utilizationMemoryPercent=41.0,
    memoryUsedBytes=30 * GIB,
    memoryTotalBytes=80 * GIB,
    temperatureCelsius=61.0,
    processes=[GpuProcess(pid=4242, usedMemoryBytes=29 * GIB)],
)


def full(**changes) -> GpuSample:
    return msgspec.structs.replace(FULL, **changes)


CASES = [
    pytest.param(reading(), FULL, id="every-reading"),
    pytest.param(
        reading(uuid=UUID.encode(), name=b"Tesla V100-SXM2-16GB"),
        full(name="Tesla V100-SXM2-16GB"),
        id="old-bindings-answer-bytes",
    ),
    pytest.param(
        reading(
            utilization=None, temperature=None, errors=("utilization: Not Supported", "temperature: Not Supported")
        ),
        full(
            utilizationGpuPercent=None,
            utilizationMemoryPercent=None,
            temperatureCelsius=None,
            errors=["utilization: Not Supported", "temperature: Not Supported"],
        ),
        id="unsupported-queries-are-unknown-not-zero",
    ),
    pytest.param(
        reading(compute_processes=[proc(7, None), proc(8, NVML_NOT_AVAILABLE)]),
        full(processes=[GpuProcess(pid=7), GpuProcess(pid=8)]),
        id="process-memory-not-available",
    ),
    pytest.param(
        reading(compute_processes=[proc(9, 2 * GIB), proc(3, GIB)], graphics_processes=[proc(9, 2 * GIB)]),
        full(processes=[GpuProcess(pid=3, usedMemoryBytes=GIB), GpuProcess(pid=9, usedMemoryBytes=2 * GIB)]),
        id="compute-and-graphics-process-listed-once",
    ),
    pytest.param(
        reading(compute_processes=None, graphics_processes=None),
        full(processes=[]),
        id="process-queries-failed",
    ),
    pytest.param(
        NvmlReading(index=3, errors=("device: GPU is lost",)),
        GpuSample(index=3, uuid="", errors=["device: GPU is lost"]),
        id="lost-gpu-keeps-its-index-and-why",
    ),
]


@pytest.mark.parametrize("nvml_reading, expected", CASES)
def test_nvml_reading_becomes_a_gpu_sample(nvml_reading, expected):
    assert gpu_sample(nvml_reading) == expected


@given(
    st.lists(
        st.tuples(st.integers(1, 50), st.one_of(st.none(), st.integers(0, 2**40), st.just(NVML_NOT_AVAILABLE))),
        max_size=20,
    ),
    st.lists(st.tuples(st.integers(1, 50), st.one_of(st.none(), st.integers(0, 2**40))), max_size=20),
)
def test_each_process_is_listed_once_by_pid_with_its_largest_known_memory(compute, graphics):
    merged = merge_processes([proc(p, m) for p, m in compute], [proc(p, m) for p, m in graphics])
    pids = [p.pid for p in merged]
    assert pids == sorted(set(pids)) == sorted({p for p, _ in compute + graphics})
    for entry in merged:
        known = [m for p, m in compute + graphics if p == entry.pid and m is not None and m != NVML_NOT_AVAILABLE]
        assert entry.usedMemoryBytes == (max(known) if known else None)


def node_sample(gpus: list[GpuSample]) -> NodeSample:
    return NodeSample(
        node="10.0.0.7",
        at=100.0,
        cpuCount=8,
        cpuPercent=12.5,
        memoryUsedBytes=3 * GIB,
        memoryTotalBytes=16 * GIB,
        load1=0.5,
        diskPath="/var/lib/pai",
        diskUsedBytes=10 * GIB,
        diskTotalBytes=100 * GIB,
        gpus=gpus,
    )


def series_map(sample: NodeSample) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(s.name, s.labels): s.value for s in node_series(sample)}


def test_node_series_use_openpai_names_and_bytes():
    shown = series_map(node_sample([FULL]))
    labels = ("0", UUID)
    assert shown[("pai_node_cpu_percent", ())] == 12.5
    assert shown[("pai_node_memory_used_bytes", ())] == 3 * GIB
    assert shown[("pai_node_memory_total_bytes", ())] == 16 * GIB
    assert shown[("pai_node_data_disk_total_bytes", ())] == 100 * GIB
    assert shown[("nvidiasmi_attached_gpus", ())] == 1
    assert shown[("nvidiasmi_utilization_gpu", labels)] == 87
    assert shown[("nvidiasmi_utilization_memory", labels)] == 41
    assert shown[("nvidiasmi_memory_used_bytes", labels)] == 30 * GIB
    assert shown[("nvidiasmi_memory_total_bytes", labels)] == 80 * GIB
    assert shown[("nvidiasmi_temperature", labels)] == 61
    assert shown[("nvidiasmi_process_count", labels)] == 1


def test_a_node_without_gpus_has_node_series_and_zero_attached_gpus():
    shown = series_map(node_sample([]))
    assert shown[("nvidiasmi_attached_gpus", ())] == 0
    assert not [name for name, _ in shown if name.startswith("nvidiasmi_") and name != "nvidiasmi_attached_gpus"]


def test_unknown_gpu_readings_have_no_series_rather_than_zero():
    unknown = gpu_sample(reading(minor_number=None, index=2, utilization=None, temperature=None))
    names = {name: labels for name, labels in series_map(node_sample([unknown]))}
    assert "nvidiasmi_utilization_gpu" not in names
    assert "nvidiasmi_temperature" not in names
    assert names["nvidiasmi_memory_used_bytes"] == ("2", UUID)  # the index stands in for the minor number


def test_node_sample_round_trips_through_its_json():
    sample = node_sample([FULL])
    assert decode_node_sample(encode_node_sample(sample)) == sample


@pytest.mark.parametrize(
    "node, key",
    [
        pytest.param("worker-3", "worker-3", id="plain"),
        pytest.param("10.0.0.7", "10.0.0.7", id="ip-address-kept"),
        pytest.param("gpu node#1", "gpu_node_1", id="spaces-and-symbols-replaced"),
        pytest.param("", "_", id="empty"),
    ],
)
def test_node_key_is_a_valid_kv_key(node, key):
    assert node_key(node) == key
