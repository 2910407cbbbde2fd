"""A local task's record file: its spec line, then its exit appended after a line
break (local_layout). What the backend learns from it after any crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.launcher.backends.local_layout import (
    LEGACY_EXIT,
    REPORTED,
    SPEC,
    ExitRecord,
    ShimRecord,
    ShimSpec,
    append_exit,
    encode,
    read_task_exit,
    read_task_spec,
    with_claim,
    write_file,
)

SPEC_LINE = with_claim(
    encode(ShimSpec(taskDir="/d", slug="alice.j.0.main.0.0", commands=["true"], env={}, cpu=1, memoryMB=64)),
    ShimRecord(shimPid=4242, shimStartTicks=17, detail="limits: none"),
)
BY_SHIM = encode(ExitRecord(exitCode=3, finishedAt=2.0))
BY_BACKEND = encode(ExitRecord(exitCode=-1, platformReason="Lost", finishedAt=9.0))


def written(task_dir: Path, *steps: tuple[str, bytes]) -> str:
    """The task dir after `steps`: ("spec", line) written as the claimer does,
    ("exit", record) appended as a shim or the backend does, ("raw", bytes) appended
    as they are (a writer cut short)."""
    task_dir.mkdir()
    for kind, data in steps:
        if kind == "spec":
            write_file(task_dir / SPEC, data)
        elif kind == "exit":
            append_exit(str(task_dir), data)
        else:
            with open(task_dir / SPEC, "ab") as file:
                file.write(data)
    return str(task_dir)


@pytest.mark.parametrize(("steps", "has_spec", "exit_code"), [
    ([("spec", SPEC_LINE)], True, None),
    ([("spec", SPEC_LINE), ("exit", BY_SHIM)], True, 3),
    # the claimer died before writing the spec; the backend declared the task lost
    ([("exit", BY_BACKEND)], False, -1),
    # the shim died in the middle of its append; the backend's record comes after
    ([("spec", SPEC_LINE), ("raw", b"\n" + BY_SHIM[:20]), ("exit", BY_BACKEND)], True, -1),
    ([("spec", SPEC_LINE), ("raw", b"\n" + BY_SHIM[:20])], True, None),
    # the claimer died in the middle of writing the spec
    ([("spec", SPEC_LINE[:30])], False, None),
    # a record is never replaced: the first whole one stands
    ([("spec", SPEC_LINE), ("exit", BY_SHIM), ("exit", BY_BACKEND)], True, 3),
], ids=["running", "ended", "lost-before-its-spec", "lost-mid-append", "mid-append", "spec-cut-short", "first-wins"])
def test_what_the_record_file_says(tmp_path: Path, steps, has_spec: bool, exit_code: int | None):
    task_dir = written(tmp_path / "task", *steps)

    spec, record = read_task_spec(task_dir, ShimSpec), read_task_exit(task_dir)

    assert (spec is not None, record and record.exitCode) == (has_spec, exit_code)
    if spec is not None:
        assert spec.shim == ShimRecord(shimPid=4242, shimStartTicks=17, detail="limits: none")


def test_no_record_file_is_nothing_recorded(tmp_path: Path):
    never_claimed = str(tmp_path / "never-claimed")
    assert (read_task_spec(never_claimed, ShimSpec), read_task_exit(never_claimed)) == (None, None)


def test_an_exit_left_in_the_previous_layouts_own_file_is_read(tmp_path: Path):
    task_dir = written(tmp_path / "task", ("spec", SPEC_LINE))
    write_file(Path(task_dir, LEGACY_EXIT), BY_SHIM)

    assert read_task_exit(task_dir) == ExitRecord(exitCode=3, finishedAt=2.0)


def test_the_exit_is_read_from_the_reported_file_once_the_launcher_recorded_it(tmp_path: Path):
    task_dir = written(tmp_path / "task", ("spec", SPEC_LINE), ("exit", BY_SHIM))
    Path(task_dir, SPEC).rename(Path(task_dir, REPORTED))

    assert read_task_exit(task_dir) is None
    assert read_task_exit(task_dir, REPORTED) == ExitRecord(exitCode=3, finishedAt=2.0)
