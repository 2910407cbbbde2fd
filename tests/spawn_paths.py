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
