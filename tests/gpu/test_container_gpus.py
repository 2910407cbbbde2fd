"""The GPU tier, container mode: a task in its image sees only its own GPU.

The local backend (services/launcher/backends/local_containers.py) gives a container
its GPUs' device nodes alone, NVIDIA_VISIBLE_DEVICES naming them and
CUDA_VISIBLE_DEVICES counting them from 0 inside. Here a task placed on the machine's
last GPU runs in the container tier's image (tests/containers/build-images.sh) on
rootful podman and lists what it finds.

Skips, saying why, where there is no GPU (NVML finds none), no podman, not root, or the
image cannot be built; runs where a GPU and podman both are:

    python -m pytest --noconftest -q tests/gpu
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pynvml = pytest.importorskip("pynvml", reason="no pynvml (nvidia-ml-py): GPU tier not run")

from tests.gpu.gpus import gpu_count  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/pai-test-busybox:1"


def _podman_unavailable() -> str | None:
    if shutil.which("podman") is None:
        return "no podman here (make container-deps installs it as root on Debian)"
    if os.geteuid() != 0:
        return "the container mode runs rootful podman: run as root"
    from services.launcher.backends import engine

    built = subprocess.run(["sh", str(REPO / "tests/containers/build-images.sh")], env=engine.podman_env(),
                           capture_output=True, text=True)
    if built.returncode:
        return f"the test image could not be built: {built.stderr.strip()[-300:]}"
    return None


def test_a_container_task_sees_only_its_gpu(tmp_path: Path):
    count = gpu_count()
    if count == 0:
        pytest.skip("no GPU: NVML reports none")
    why = _podman_unavailable()
    if why:
        pytest.skip(why)
    gpu = count - 1  # the last: with several GPUs, not the one CUDA would pick by default
    if not os.path.exists(f"/dev/nvidia{gpu}"):
        pytest.skip(f"NVML reports GPU {gpu} but this host has no /dev/nvidia{gpu} to give a container")
    from libs.common.messages import TaskPlacement
    from services.launcher.backends.local import LocalBackend
    from services.launcher.core.tasks import TaskFinished, TaskKey, TaskLaunch

    async def run() -> tuple[TaskFinished, str]:
        backend = LocalBackend(tmp_path / "launcher", container_engine="auto", announce=False)
        key = TaskKey(job="alice~gpus", attempt=0, role="worker", index=0)
        try:
            await backend.recover()
            assert backend.containers is not None, "no container engine answered"
            await backend.start(TaskLaunch(
                key=key, vc="default", user="alice", gpu=1, memoryMB=256, dockerImageUri=IMAGE,
                placement=TaskPlacement(role="worker", index=0, node=backend.node_names[0], gpus=[gpu]),
                commands=['echo "nvidia=$NVIDIA_VISIBLE_DEVICES cuda=$CUDA_VISIBLE_DEVICES"',
                          "echo \"devices: $(ls /dev | grep -E '^nvidia[0-9]+$' | tr '\\n' ' ')\""],
                env={"CUDA_VISIBLE_DEVICES": str(gpu)},  # as the launcher core gives a process task
            ))
            async with asyncio.timeout(120):
                async for event in backend.events():
                    if isinstance(event, TaskFinished) and event.key == key:
                        return event, (await backend.read_log(key)).decode()
        finally:
            await backend.close()
        raise AssertionError("the backend's reports ended before the task did")

    finished, logs = asyncio.run(run())
    assert finished.exitCode == 0, (finished, logs)
    lines = logs.strip().splitlines()
    assert f"nvidia={gpu} cuda=0" in lines, logs  # its GPU, numbered from 0 inside
    devices = next(line for line in lines if line.startswith("devices:")).split()[1:]
    assert devices == [f"nvidia{gpu}"], logs  # its device node, no other GPU's
