"""The container mode's per-task parent cgroups (cgroup v1) leave no top directory behind."""

from __future__ import annotations

from pathlib import Path

from services.launcher.backends.local_containers import remove_empty_parent_roots


def hierarchies(root: Path, *paths: str) -> None:
    for hierarchy in ("memory", "cpu", "pids"):
        for path in paths:
            (root / hierarchy / path).mkdir(parents=True, exist_ok=True)


def left(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.glob("*/pai-containers-*")}


def test_empty_tops_of_every_owner_go_and_a_top_holding_a_task_parent_stays(tmp_path: Path):
    hierarchies(tmp_path, "pai-containers-aaa", "pai-containers-bbb/pai-job_worker_0", "other")
    remove_empty_parent_roots(tmp_path)
    assert left(tmp_path) == {f"{h}/pai-containers-bbb" for h in ("memory", "cpu", "pids")}
    assert (tmp_path / "memory" / "other").is_dir()  # not PAI's: untouched


def test_an_owner_removes_only_its_own_top(tmp_path: Path):
    hierarchies(tmp_path, "pai-containers-aaa", "pai-containers-bbb")
    remove_empty_parent_roots(tmp_path, "aaa")
    assert left(tmp_path) == {f"{h}/pai-containers-bbb" for h in ("memory", "cpu", "pids")}


def test_no_cgroup_root_is_no_error(tmp_path: Path):
    remove_empty_parent_roots(tmp_path / "absent")
