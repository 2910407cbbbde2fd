"""What the GPU tier's tests ask NVML first: how many GPUs, or skip saying why."""

from __future__ import annotations

import pytest

pynvml = pytest.importorskip("pynvml", reason="no pynvml (nvidia-ml-py): GPU tier not run")


def gpu_count() -> int:
    """The GPUs NVML sees; the test skips, saying so, where NVML cannot start."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no GPU: NVML not available ({exc})")
    try:
        return pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
