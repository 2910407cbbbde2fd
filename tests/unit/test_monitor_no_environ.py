"""The Helm chart's node agent tells a task's processes by their Pod's cgroup alone
(monitor_read_task_environ: false): it never reads another process's environment,
which may hold a job's secrets. The local backend's agent still reads it (PAI_TASK_KEY)."""

from __future__ import annotations

from pathlib import Path

from libs.common.config import load_config
from services.monitor.sampler import TaskProcesses

POD = "0f5e1c2a-3b4d-4e5f-8a9b-0c1d2e3f4a5b"


def fake_proc(root: Path, pid: int) -> Path:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "environ").write_bytes(b"PAI_TASK_KEY=alice~job-1-main-0\0PAI_JOB_NAME=alice~job\0SECRET=hunter2\0")
    (root / str(pid) / "cgroup").write_text(f"0::/kubepods/burstable/pod{POD}/abcdef\n")
    return root


def test_without_environ_a_process_is_told_by_its_pods_cgroup(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", 4242)
    identity = TaskProcesses(proc, read_environ=False)._identify(4242)
    assert identity is not None and identity.key == f"pod:{POD}"
    assert identity.job_name == ""  # nothing came from the environment


def test_the_local_agent_still_reads_the_task_key_from_the_environment(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", 4242)
    identity = TaskProcesses(proc)._identify(4242)
    assert identity is not None and identity.key == "alice~job-1-main-0" and identity.job_name == "alice~job"


def test_the_setting_is_on_by_default_and_off_where_the_chart_says() -> None:
    assert load_config(env={}).monitor_read_task_environ is True
    assert load_config(env={"PAI_MONITOR_READ_TASK_ENVIRON": "false"}).monitor_read_task_environ is False
