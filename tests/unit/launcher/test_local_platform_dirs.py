"""Which of the platform's directories a process task gets bound back into its
mount namespace (local_namespaces.plan, local._platform_dirs): those of the
TensorBoard the launcher gives it, and only where the task's own /tmp or
/dev/shm would hide them (PAI installed under /tmp), read-only."""

from __future__ import annotations

import sys

from services.launcher.backends import local, local_namespaces
from services.launcher.core.mounts import BindMount

UID, GID = 70000, 65534


def plan(*platform_dirs: str, work_dir: str = "/var/lib/pai/work/t") -> local_namespaces.MountPlan:
    return local_namespaces.plan(work_dir, UID, GID, 256, (), platform_dirs)


def test_only_the_platforms_directories_under_tmp_or_dev_shm_are_bound_back():
    assert plan("/tmp/pai/.venv", "/usr").platform == ("/tmp/pai/.venv",)
    assert plan("/dev/shm/pai/lib/python3.11/site-packages").platform == ("/dev/shm/pai/lib/python3.11/site-packages",)
    # Installed elsewhere: nothing to bind, and _spawn_as's vfork starts the task.
    elsewhere = plan("/opt/pai/.venv", "/usr", "/var/tmp/pai/.venv", "/tmpfoo/venv")
    assert elsewhere.platform == () and not elsewhere.in_python


def test_never_the_machines_tmp_itself_nor_a_path_that_climbs_out_of_it():
    assert plan("/tmp", "/tmp/", "/dev/shm", "/tmp/../etc", "tmp/venv").platform == ()


def test_one_directory_inside_another_comes_with_it():
    assert plan("/tmp/pai/.venv/lib/python3.11/site-packages", "/tmp/pai/.venv", "/tmp/pai/.venv").platform == (
        "/tmp/pai/.venv",)


def test_the_bound_back_directories_are_made_in_python_beside_the_working_directory():
    mounts = plan("/tmp/pai/.venv", work_dir="/tmp/pai/data/work/t")
    assert mounts.platform == ("/tmp/pai/.venv",) and mounts.in_python  # subprocess's fork: enter() binds them
    assert mounts.keep == "/tmp/pai/data/work/t"
    # _spawn_as takes the first five fields: the platform's binds are not among them.
    assert "/tmp/pai/.venv" not in repr(tuple(mounts)[:5])


def test_a_plan_with_storages_is_made_in_python_too():
    storage = BindMount(host_path="/srv/data", container_path="/mnt/data", read_only=True)
    assert local_namespaces.plan("/var/lib/pai/work/t", UID, GID, 256, (storage,)).in_python


def test_the_platforms_tensorboard_in_a_virtualenv_needs_the_virtualenv_and_its_interpreter():
    given = {"PAI_TENSORBOARD": "/tmp/pai/.venv/bin/tensorboard"}
    assert local._platform_dirs(given) == ("/tmp/pai/.venv", sys.base_prefix)


def test_the_system_python_over_the_platforms_packages_needs_those_packages():
    given = {"PAI_TENSORBOARD": "/usr/bin/python3 -m tensorboard.main",
             "PAI_TENSORBOARD_PYTHONPATH": "/tmp/pai/.venv/lib/python3.11/site-packages"}
    dirs = local._platform_dirs(given)
    assert dirs[0] == "/tmp/pai/.venv/lib/python3.11/site-packages"
    assert plan(*dirs).platform == ("/tmp/pai/.venv/lib/python3.11/site-packages",)


def test_no_platform_tensorboard_no_directories():
    assert local._platform_dirs({}) == ()
