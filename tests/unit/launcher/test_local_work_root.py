"""Where the local backend puts tasks' working directories: in the data dir unless a
directory above it bars the users tasks run as (then `python3 script.py`, which makes
the path absolute, could not open the task's own file)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.launcher.backends.local_layout import choose_work_root, make_own_dir


@pytest.fixture
def tree() -> Iterator[Path]:
    # Not pytest's tmp_path: its /tmp/pytest-of-<user> is 0700, barred itself.
    root = Path(tempfile.mkdtemp(prefix="pai-work-root-test-", dir="/tmp"))
    os.chmod(root, 0o755)
    (root / "open").mkdir(mode=0o755)
    (root / "barred").mkdir(mode=0o700)
    (root / "temp").mkdir()
    os.chmod(root / "open", 0o755)
    os.chmod(root / "barred", 0o700)
    os.chmod(root / "temp", 0o1777)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(("parent", "other_users", "moved"), [
    ("open", True, False),
    ("barred", True, True),  # e.g. /root or /tmp/pytest-of-root: tasks' users cannot pass
    ("barred", False, False),  # tasks run as the platform's own user: it passes anyway
], ids=["open-parent", "barred-parent", "same-user"])
def test_the_work_root_leaves_a_data_dir_tasks_cannot_reach(tree, parent, other_users, moved):
    if any(not os.stat(p).st_mode & 0o001 for p in tree.parents):
        pytest.skip("the test's own temporary directory is barred above it")
    data = tree / parent / "data"
    root = choose_work_root(data, tasks_are_other_users=other_users, temp_dirs=[tree / "temp"])
    if moved:
        assert root.parent == tree / "temp" and root.name.startswith("pai-work-")
        # The same data dir finds the same place again after a restart; another data dir another one.
        assert choose_work_root(data, tasks_are_other_users=True, temp_dirs=[tree / "temp"]) == root
        assert choose_work_root(tree / parent / "other", tasks_are_other_users=True, temp_dirs=[tree / "temp"]) != root
    else:
        assert root == data / "work"


def test_a_data_dir_made_anew_at_the_same_path_gets_a_work_root_of_its_own(tree):
    data = tree / "barred" / "data"
    first = choose_work_root(data, tasks_are_other_users=True, temp_dirs=[tree / "temp"])
    make_own_dir(first, 0o711)
    (first / "alice.job.1.worker.0.0").mkdir()  # a task's working directory, left behind
    shutil.rmtree(data)

    again = choose_work_root(data, tasks_are_other_users=True, temp_dirs=[tree / "temp"])

    assert again != first and again.parent == first.parent
    assert choose_work_root(data, tasks_are_other_users=True, temp_dirs=[tree / "temp"]) == again


def test_a_data_dir_tasks_used_before_its_name_was_kept_keeps_its_old_work_root(tree):
    data = tree / "barred" / "data"
    (data / "tasks").mkdir(parents=True)
    digest = hashlib.sha256(str(data).encode()).hexdigest()[:16]

    root = choose_work_root(data, tasks_are_other_users=True, temp_dirs=[tree / "temp"])

    assert root == tree / "temp" / f"pai-work-{digest}"


def test_with_no_temporary_directory_anyone_can_pass_the_data_dir_is_kept(tree):
    data = tree / "barred" / "data"
    assert choose_work_root(data, tasks_are_other_users=True, temp_dirs=[tree / "barred"]) == data / "work"


def test_an_own_directory_is_made_or_accepted(tree):
    path = tree / "temp" / "pai-work-x"
    make_own_dir(path, 0o711)
    make_own_dir(path, 0o711)  # a restart: ours already
    assert path.is_dir() and (path.stat().st_mode & 0o777) == 0o711


@pytest.mark.parametrize("planted", ["symlink", "file", "group-writable"])
def test_a_name_someone_else_made_first_is_refused(tree, planted):
    path = tree / "temp" / "pai-work-y"
    if planted == "symlink":
        path.symlink_to(tree / "open")
    elif planted == "file":
        path.write_text("")
    else:
        path.mkdir()
        os.chmod(path, 0o775)
    with pytest.raises(PermissionError, match="not a directory of this user's alone"):
        make_own_dir(path, 0o711)
