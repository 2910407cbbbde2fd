"""The GPU tier: the node agent's GPU readings (services/monitor/sampler.NvmlGpus, what
the monitor exports as GPU metrics and the portal's node pages show) on a real GPU.

Every test here skips, saying why, on a machine where NVML finds no GPU (CI has none);
on one with a GPU they check what an operator reads off it. Runs alone too, without
the suite's conftest (the device machine's Python has none of the suite's services):

    python -m pytest --noconftest -q tests/gpu
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pynvml = pytest.importorskip("pynvml", reason="no pynvml (nvidia-ml-py): GPU tier not run")

from services.monitor.sampler import NvmlGpus  # noqa: E402
from tests.gpu.gpus import gpu_count  # noqa: E402

BUSY_SECONDS = 12.0
# A process that keeps the GPU busy: a large matrix product in a loop, on the first GPU.
BUSY = f"""
import time, torch
a = torch.randn(8192, 8192, device="cuda:0")
started = time.time()
while time.time() - started < {BUSY_SECONDS}:
    a @ a
torch.cuda.synchronize()
"""


@pytest.fixture
def gpus():
    if gpu_count() == 0:
        pytest.skip("no GPU: NVML reports none")
    sampler = NvmlGpus()
    sampler.open()
    yield sampler
    sampler.close()


def test_each_gpu_is_read_with_its_identity_memory_and_health(gpus):
    samples = gpus.sample()
    assert gpus.note == ""
    assert [s.index for s in samples] == list(range(gpu_count()))
    for s in samples:
        assert s.uuid.startswith("GPU-") and s.name, s
        assert 0 < s.memoryUsedBytes < s.memoryTotalBytes, s
        assert 0 <= s.utilizationGpuPercent <= 100 and s.temperatureCelsius > 0 and s.powerWatts > 0, s
        assert s.errors == [], s.errors


def test_a_busy_process_shows_in_the_utilisation_and_with_its_memory(gpus):
    torch = pytest.importorskip("torch", reason="no torch: nothing to keep the GPU busy with")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        seen = first = None
        deadline = time.monotonic() + BUSY_SECONDS
        while time.monotonic() < deadline and busy.poll() is None:
            first = gpus.sample()[0]
            listed = {p.pid: p.usedMemoryBytes for p in first.processes}
            if first.utilizationGpuPercent > 50 and listed.get(busy.pid):
                seen = first
                break
            time.sleep(0.2)
        assert seen is not None, f"never saw the busy process {busy.pid}: last reading {first}"
        assert seen.memoryUsedBytes >= dict((p.pid, p.usedMemoryBytes) for p in seen.processes)[busy.pid] > 0
    finally:
        busy.kill()
        busy.wait()
