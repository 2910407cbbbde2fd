"""What the tests of local_shim._fork_exec_as share: both ways a shim starts a task
as another user (the C extension _spawn_as, and subprocess's fork where it is not
built), and a working directory only that user may enter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.launcher.backends import local_shim

SPAWNERS = ["vfork", "fork"]


def use_spawner(name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Make the shim start tasks with `name` (one of SPAWNERS) for this test."""
    if name == "fork":
        monkeypatch.setattr(local_shim, "_spawn_as", None)
    elif local_shim._spawn_as is None:
        pytest.skip("the C extension _spawn_as is not built (setup.py build_ext --inplace)")
    return name


def task_work_dir(tmp_path: Path, uid: int, gid: int) -> Path:
    """tmp_path/work, 0700 and owned by uid:gid; tmp_path passable (0711) to reach it."""
    tmp_path.chmod(0o711)
    work = tmp_path / "work"
    work.mkdir(mode=0o700)
    os.chown(work, uid, gid)
    return work


def spawn_collected(
    argv: list[str], env: dict[str, str], work: Path, *, uid: int, gid: int, program: str = local_shim.BASH, **fields
) -> tuple[int, str, str]:
    """`local_shim._fork_exec_as` of a SpawnRequest for `argv` in `work` with its own output
    pipes (`fields`: the request's other fields), waited for: its exit status, stdout, stderr."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        pid = local_shim._fork_exec_as(local_shim.SpawnRequest(
            program=program, argv=argv, env=env, work_dir=str(work), out_w=out_w, err_w=err_w, uid=uid, gid=gid, **fields,
        ))
    finally:
        os.close(out_w)
        os.close(err_w)
    with os.fdopen(out_r) as out, os.fdopen(err_r) as err:
        stdout, stderr = out.read(), err.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), stdout, stderr
