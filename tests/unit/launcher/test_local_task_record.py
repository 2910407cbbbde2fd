"""A local task's record: one file, `tasks/<slug>`, holding its spec line, then
its exit and the launcher's reported mark appended after line breaks
(local_layout). What the backend learns from it after any crash, and from the
directory a launcher before single-file records left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.launcher.backends.local_layout import (
    KILL,
    LEGACY_EXIT,
    LEGACY_REPORTED,
    LEGACY_SPEC,
    OUTPUT_LOG,
    SHIM_ERROR,
    STDERR_LOG,
    ExitRecord,
    ShimRecord,
    ShimSpec,
    TaskFiles,
    append_exit,
    claim,
    encode,
    is_record_name,
    mark_reported,
    read_task,
    read_task_exit,
    read_task_spec,
    remove_task_files,
    with_claim,
    write_and_close,
    write_file,
)

SLUG = "alice.j.0.main.0.0"
SPEC_LINE = with_claim(
    encode(ShimSpec(taskPath="/d", slug=SLUG, commands=["true"], env={}, cpu=1, memoryMB=64)),
    ShimRecord(shimPid=4242, shimStartTicks=17, detail="limits: none"),
)
BY_SHIM = encode(ExitRecord(exitCode=3, finishedAt=2.0))
BY_BACKEND = encode(ExitRecord(exitCode=-1, platformReason="Lost", finishedAt=9.0))


def written(path: Path, *steps: tuple[str, bytes]) -> TaskFiles:
    """The task's record after `steps`: ("spec", line) written as a claimer does,
    ("exit", record) appended as a shim or the backend does, ("reported", b"")
    marked as the launcher does, ("raw", bytes) appended as they are (a writer cut
    short)."""
    files = TaskFiles(str(path))
    for kind, data in steps:
        if kind == "spec":
            fd = claim(files.path)
            assert fd is not None
            write_and_close(fd, data)
        elif kind == "exit":
            append_exit(files, data)
        elif kind == "reported":
            mark_reported(files)
        else:
            with open(files.record, "ab") as file:
                file.write(data)
    return files


@pytest.mark.parametrize(("steps", "has_spec", "exit_code", "reported"), [
    ([("spec", SPEC_LINE)], True, None, False),
    ([("spec", SPEC_LINE), ("exit", BY_SHIM)], True, 3, False),
    ([("spec", SPEC_LINE), ("exit", BY_SHIM), ("reported", b"")], True, 3, True),
    # the claimer died before writing the spec; the backend declared the task lost
    ([("exit", BY_BACKEND)], False, -1, False),
    ([("spec", b"")], False, None, False),
    # the shim died in the middle of its append; the backend's record comes after
    ([("spec", SPEC_LINE), ("raw", b"\n" + BY_SHIM[:20]), ("exit", BY_BACKEND)], True, -1, False),
    ([("spec", SPEC_LINE), ("raw", b"\n" + BY_SHIM[:20])], True, None, False),
    # the claimer died in the middle of writing the spec
    ([("spec", SPEC_LINE[:30])], False, None, False),
    # a record is never replaced: the first whole one stands
    ([("spec", SPEC_LINE), ("exit", BY_SHIM), ("exit", BY_BACKEND)], True, 3, False),
    # the launcher died in the middle of its mark: not reported, so reported again
    ([("spec", SPEC_LINE), ("exit", BY_SHIM), ("raw", b"\n{\"repor")], True, 3, False),
], ids=["running", "ended", "reported", "lost-before-its-spec", "claimed-empty", "lost-mid-append", "mid-append",
        "spec-cut-short", "first-wins", "mark-cut-short"])
def test_what_the_record_says(tmp_path: Path, steps, has_spec: bool, exit_code: int | None, reported: bool):
    files = written(tmp_path / SLUG, *steps)

    spec, found = read_task_spec(files, ShimSpec), read_task(files)

    assert (spec is not None, found.exit and found.exit.exitCode, found.reported) == (has_spec, exit_code, reported)
    assert read_task_exit(files) == found.exit
    if spec is not None:
        assert spec.shim == ShimRecord(shimPid=4242, shimStartTicks=17, detail="limits: none")


def test_no_record_is_nothing_recorded(tmp_path: Path):
    never_claimed = TaskFiles(str(tmp_path / SLUG))
    assert TaskFiles.found(never_claimed.path) is None
    assert (read_task_spec(never_claimed, ShimSpec), read_task(never_claimed)) == (None, read_task(never_claimed))
    assert (read_task(never_claimed).exit, read_task(never_claimed).reported) == (None, False)
    mark_reported(never_claimed)  # nothing to mark, and nothing made
    assert TaskFiles.found(never_claimed.path) is None


def test_a_task_is_claimed_once_in_either_layout(tmp_path: Path):
    """A name taken by a record or by an old launcher's directory (its shims claim
    with mkdir) cannot be claimed again, and a record keeps an old shim's mkdir out."""
    record, directory = str(tmp_path / "a.j.0.r.0.0"), str(tmp_path / "a.j.0.r.0.1")
    first = claim(record)
    assert first is not None
    write_and_close(first, SPEC_LINE)
    os.mkdir(directory)

    assert (claim(record), claim(directory)) == (None, None)
    with pytest.raises(FileExistsError):
        os.mkdir(record)
    assert Path(record).read_bytes() == SPEC_LINE
    mark_reported(TaskFiles(record))
    assert claim(record) is None  # reported, the name stays taken


@pytest.mark.parametrize(("name", "is_record"), [
    (SLUG, True),
    (f"{SLUG}.{KILL}", False),
    (f"{SLUG}.{OUTPUT_LOG}", False),
    (f"{SLUG}.{OUTPUT_LOG}.1", False),
    (f"{SLUG}.{STDERR_LOG}.disk-full", False),
    (f"{SLUG}.{SHIM_ERROR}", False),
    (f".{SLUG}.{KILL}.4242.tmp", False),  # a stop order being written
])
def test_records_are_told_from_the_files_beside_them(name: str, is_record: bool):
    assert is_record_name(name) is is_record


def test_removing_a_task_removes_its_files_and_no_other_tasks(tmp_path: Path):
    files = written(tmp_path / SLUG, ("spec", SPEC_LINE), ("exit", BY_SHIM), ("reported", b""))
    beside = [files.beside(name) for name in (KILL, OUTPUT_LOG, f"{OUTPUT_LOG}.1", STDERR_LOG, SHIM_ERROR)]
    for path in beside:
        write_file(path, b"x")
    other = written(tmp_path / f"{SLUG}0", ("spec", SPEC_LINE))  # alice.j.0.main.0.00: attempt 0, another name

    assert remove_task_files(files) is True
    assert sorted(os.listdir(tmp_path)) == [f"{SLUG}0"]
    assert read_task_spec(other, ShimSpec) is not None
    assert remove_task_files(files) is False


# -- a task directory left by a launcher before single-file records ---------------------------


def legacy(path: Path, *, exit_in: str | None = None, reported: bool = False) -> TaskFiles:
    path.mkdir()
    write_file(path / LEGACY_SPEC, SPEC_LINE)
    if exit_in == "spec":
        append_exit(TaskFiles(str(path), in_dir=True), BY_SHIM)
    elif exit_in == "exit.json":
        write_file(path / LEGACY_EXIT, BY_SHIM)
    if reported:
        (path / LEGACY_SPEC).rename(path / LEGACY_REPORTED)
    return TaskFiles.found(str(path))


@pytest.mark.parametrize(("exit_in", "reported"), [
    (None, False), ("spec", False), ("exit.json", False), ("spec", True), ("exit.json", True),
])
def test_an_old_directory_is_read_where_it_is(tmp_path: Path, exit_in: str | None, reported: bool):
    files = legacy(tmp_path / SLUG, exit_in=exit_in, reported=reported)

    found = read_task(files)

    assert files.in_dir and files.beside(KILL) == f"{files.path}/{KILL}"
    assert read_task_spec(files, ShimSpec) is not None
    assert (found.exit, found.reported) == (ExitRecord(exitCode=3, finishedAt=2.0) if exit_in else None, reported)


def test_an_old_directory_is_marked_reported_and_removed_as_it_was(tmp_path: Path):
    files = legacy(tmp_path / SLUG, exit_in="spec")

    mark_reported(files)
    assert sorted(os.listdir(files.path)) == [LEGACY_REPORTED]
    assert read_task(files).reported is True
    assert remove_task_files(files) is True
    assert not os.path.exists(files.path)
