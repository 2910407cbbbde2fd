"""A task's working directory: the bare one of an ended task, taken over, or a
new one (local_shim._provide_work_dir). What the new task finds there, and what
an ended task that used its directory keeps."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from services.launcher.backends import local_shim
from services.launcher.backends.local_layout import ShimSpec

AS_ROOT = os.geteuid() == 0
# When the shim runs as root, each task has a uid of its own; otherwise (uid
# None) tasks run as the shim's user and nothing changes owner.
OLD_OWNER = (0x70000001, 65534) if AS_ROOT else (None, None)
NEW_OWNER = (0x70000002, 65534) if AS_ROOT else (None, None)


def spec_for(work: Path, offered: Path | str = "") -> ShimSpec:
    return ShimSpec(
        taskPath="/unused", slug=work.name, workDir=str(work), takeOverWorkDir=str(offered),
        commands=["true"], env={}, cpu=1, memoryMB=0, uid=NEW_OWNER[0], gid=NEW_OWNER[1],
    )


def ended_dir(work_root: Path, how: Callable[[Path], None]) -> Path:
    """The working directory an ended task left, after `how` (what the task did)."""
    ended = work_root / "alice.ended.0.main.0.0"
    ended.mkdir(mode=0o700)
    if OLD_OWNER[0] is not None:
        os.chown(ended, *OLD_OWNER)
    how(ended)
    return ended


def nothing(_: Path) -> None:
    pass


def opened_to_all(path: Path) -> None:
    path.chmod(0o777)


def wrote_a_file(path: Path) -> None:
    (path / "model.ckpt").write_text("weights")


def made_a_subdir(path: Path) -> None:
    (path / "cache").mkdir()


def made_and_removed_a_file(path: Path) -> None:
    (path / "scratch").write_text("x")
    (path / "scratch").unlink()


def set_an_attribute(path: Path) -> None:
    try:
        os.setxattr(path, "user.note", b"left for the next task")
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            pytest.skip(f"{path.parent} does not keep user extended attributes")
        raise


@pytest.mark.parametrize(
    ("task_did", "taken_over"),
    [
        (nothing, True),
        (made_and_removed_a_file, True),  # bare again: nothing of it is left
        (opened_to_all, True),  # the new task gets it 0700 all the same
        (wrote_a_file, False),
        (made_a_subdir, False),
        (set_an_attribute, False),
    ],
    ids=["untouched", "emptied-again", "chmod-777", "wrote-a-file", "made-a-subdir", "extended-attribute"],
)
def test_an_ended_tasks_directory_is_taken_over_only_when_bare(tmp_path: Path, task_did, taken_over: bool):
    ended = ended_dir(tmp_path, task_did)
    before = os.stat(ended)
    work = tmp_path / "alice.next.0.main.0.0"

    local_shim._provide_work_dir(spec_for(work, offered=ended))

    now = os.stat(work)
    assert stat.S_ISDIR(now.st_mode) and stat.S_IMODE(now.st_mode) == 0o700
    assert list(work.iterdir()) == [] and [a for a in os.listxattr(work) if not a.startswith("security.")] == []
    if NEW_OWNER[0] is not None:
        assert (now.st_uid, now.st_gid) == NEW_OWNER
    assert (now.st_ino == before.st_ino) is taken_over
    if taken_over:
        assert not ended.exists()
    else:  # the ended task keeps its directory as it left it
        kept = os.stat(ended)
        assert (kept.st_ino, kept.st_uid, kept.st_gid, kept.st_mode) == (
            before.st_ino, before.st_uid, before.st_gid, before.st_mode
        )


def test_a_file_put_there_while_it_changes_hands_sends_it_back_to_its_task(tmp_path: Path, monkeypatch):
    # A process of the old task's user that outlived it adds a file after the
    # rename, before the directory is the new task's: the new task must not
    # get a directory another user prepared.
    ended = ended_dir(tmp_path, nothing)
    before = os.stat(ended)
    work = tmp_path / "alice.next.0.main.0.0"
    look = local_shim._bare_dir

    def filled_first(fd: int) -> bool:
        (work / "planted").write_text("yours?")
        return look(fd)

    monkeypatch.setattr(local_shim, "_bare_dir", filled_first)
    local_shim._provide_work_dir(spec_for(work, offered=ended))

    kept = os.stat(ended)
    assert (kept.st_ino, kept.st_uid, kept.st_gid, kept.st_mode) == (
        before.st_ino, before.st_uid, before.st_gid, before.st_mode
    )
    assert (ended / "planted").read_text() == "yours?"
    assert os.stat(work).st_ino != before.st_ino and list(work.iterdir()) == []


@pytest.mark.parametrize(
    "offered",
    ["", "gone", "elsewhere"],
    ids=["none-offered", "offered-one-removed-meanwhile", "offered-one-under-another-root"],
)
def test_without_a_bare_directory_to_take_over_a_new_one_is_made(tmp_path: Path, offered: str):
    (tmp_path / "roots" / "other").mkdir(parents=True)
    work_root = tmp_path / "roots" / "work"
    work_root.mkdir()
    elsewhere = ended_dir(tmp_path / "roots" / "other", nothing)
    path = {"": "", "gone": str(work_root / "alice.pruned.0.main.0.0"), "elsewhere": str(elsewhere)}[offered]
    work = work_root / "alice.next.0.main.0.0"

    local_shim._provide_work_dir(spec_for(work, offered=path))

    assert stat.S_IMODE(os.stat(work).st_mode) == 0o700 and list(work.iterdir()) == []
    assert elsewhere.is_dir()  # a directory outside the work root is never moved


@pytest.mark.parametrize(
    ("failure", "taken_over"),
    [(errno.EOPNOTSUPP, True), (errno.EIO, False)],
    ids=["filesystem-without-extended-attributes", "attributes-unreadable"],
)
def test_extended_attributes_that_cannot_be_listed(tmp_path: Path, monkeypatch, failure: int, taken_over: bool):
    # Where the filesystem keeps none, none can be left behind; where the look
    # itself fails, the directory goes back to its task unchanged.
    ended = ended_dir(tmp_path, nothing)
    before = os.stat(ended)
    work = tmp_path / "alice.next.0.main.0.0"

    def unlistable(_target):
        raise OSError(failure, os.strerror(failure))

    monkeypatch.setattr(local_shim.os, "listxattr", unlistable)
    local_shim._provide_work_dir(spec_for(work, offered=ended))

    assert (os.stat(work).st_ino == before.st_ino) is taken_over
    assert stat.S_IMODE(os.stat(work).st_mode) == 0o700
    if not taken_over:
        kept = os.stat(ended)
        assert (kept.st_ino, kept.st_uid, kept.st_gid, kept.st_mode) == (
            before.st_ino, before.st_uid, before.st_gid, before.st_mode
        )
