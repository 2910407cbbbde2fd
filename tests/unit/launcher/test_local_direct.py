"""Which task commands the shim execs without bash (local_direct), and what the
program is given then: the same as bash would give it."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from services.launcher.backends.local_direct import (
    PathLookups,
    find_program,
    plan,
    program_env,
    simple_argv,
)
from services.launcher.backends.local_shim import BASH


@pytest.mark.parametrize(
    ("commands", "argv"),
    [
        (["true"], ["true"]),
        (["false"], ["false"]),
        (["sleep 1"], ["sleep", "1"]),
        (
            ["  python3\ttrain.py  --epochs=3 --lr=0.1 "],
            ["python3", "train.py", "--epochs=3", "--lr=0.1"],
        ),
        (["/usr/bin/env"], ["/usr/bin/env"]),
        (
            ["./run.sh a,b x:y user@host 50% +1 -"],
            ["./run.sh", "a,b", "x:y", "user@host", "50%", "+1", "-"],
        ),
    ],
    ids=[
        "true",
        "false",
        "program-with-argument",
        "blanks-and-options",
        "absolute-path",
        "safe-punctuation",
    ],
)
def test_one_simple_command_is_its_argv(commands: list[str], argv: list[str]):
    assert simple_argv(commands) == argv


@pytest.mark.parametrize(
    "commands",
    [
        [],
        [""],
        ["   "],
        ["true", "true"],
        ["true\ntrue"],
        ["echo hi"],
        ["printf x"],
        ["test -f x"],
        ["[ -f x ]"],
        ["cd /tmp"],
        ["exit 3"],
        ["export A=1"],
        ["exec sleep 1"],
        ["kill 1"],
        ["pwd"],
        ["ulimit -d 1"],
        ["true --help"],
        ["false --version"],
        ["time sleep 1"],
        ["coproc sleep"],
        ["if"],
        ["A=1 env"],
        ["%1"],
        ["echo $HOME"],
        ["ls *"],
        ["ls ?"],
        ["ls ~"],
        ["ls a{b,c}"],
        ["ls 'a b'"],
        ['ls "a"'],
        ["ls a\\ b"],
        ["ls > out"],
        ["ls < in"],
        ["ls | wc"],
        ["ls; ls"],
        ["ls &"],
        ["ls && ls"],
        ["ls # comment"],
        ["ls (x)"],
        ["ls `x`"],
        ["ls !x"],
        ["ls [ab]"],
        ["ls\rx"],
        ["ls é"],
    ],
    ids=[
        "nothing",
        "empty",
        "blank",
        "two-commands",
        "two-lines",
        "echo-builtin",
        "printf-builtin",
        "test-builtin",
        "bracket-builtin",
        "cd-no-program",
        "exit-no-program",
        "export-no-program",
        "exec-builtin",
        "kill-builtin",
        "pwd-builtin",
        "ulimit-builtin",
        "true-with-argument",
        "false-with-argument",
        "time-keyword",
        "coproc-keyword",
        "if-keyword",
        "assignment",
        "job-spec",
        "variable",
        "glob-star",
        "glob-question",
        "tilde",
        "braces",
        "single-quotes",
        "double-quotes",
        "backslash",
        "redirect-out",
        "redirect-in",
        "pipe",
        "semicolon",
        "background",
        "and-list",
        "comment",
        "parentheses",
        "backquotes",
        "history-bang",
        "bracket-glob",
        "carriage-return",
        "non-ascii",
    ],
)
def test_anything_else_goes_to_bash(commands: list[str]):
    assert simple_argv(commands) is None


PLATFORM_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/w",
    "SHELL": BASH,
    "LC_ALL": "C.UTF-8",
    "PAI_JOB_NAME": "j",
    "PAI_HOST_IP_my-role_0": "10.0.0.1",
    "CUDA_VISIBLE_DEVICES": "",
}


def test_the_program_gets_the_tasks_environment_and_what_bash_adds():
    assert program_env(PLATFORM_ENV, "/w/t", "/usr/bin/env") == {
        **PLATFORM_ENV,
        "PWD": "/w/t",
        "SHLVL": "0",
        "_": "/usr/bin/env",
    }


@pytest.mark.parametrize(
    "name",
    [
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "BASH_FUNC_ls%%",
        "SHLVL",
        "PWD",
        "OLDPWD",
        "IFS",
        "EXECIGNORE",
        "OTHER",
    ],
)
def test_an_environment_name_bash_may_act_on_goes_to_bash(name: str):
    assert program_env({**PLATFORM_ENV, name: "x"}, "/w/t", "/usr/bin/env") is None


@pytest.fixture
def bin_dirs(tmp_path: Path) -> tuple[Path, Path]:
    first, second = tmp_path / "first", tmp_path / "second"
    for directory in (first, second):
        directory.mkdir()
    return first, second


def make(path: Path, mode: int) -> Path:
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def test_the_program_is_the_first_in_path_as_bash_finds_it(
    bin_dirs: tuple[Path, Path], tmp_path: Path
):
    first, second = bin_dirs
    make(second / "tool", 0o755)
    (first / "tool").mkdir()  # a directory is skipped, as bash does
    path = f"{first}:{second}"
    assert find_program("tool", path, str(tmp_path), None, None) == f"{second}/tool"
    assert (
        find_program("missing", path, str(tmp_path), None, None) is None
    )  # bash says "not found"


@pytest.mark.parametrize(
    "path",
    ["", "relative/bin", "{first}::{second}", "{first}/:{second}"],
    ids=["no-path", "relative-entry", "empty-entry-is-cwd", "trailing-slash"],
)
def test_a_path_bash_might_read_otherwise_goes_to_bash(
    bin_dirs: tuple[Path, Path], tmp_path: Path, path: str
):
    first, second = bin_dirs
    make(second / "tool", 0o755)
    assert (
        find_program(
            "tool", path.format(first=first, second=second), str(tmp_path), None, None
        )
        is None
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root may run any file with an x bit")
def test_a_file_its_user_may_not_run_goes_to_bash_even_with_another_later_in_path(
    bin_dirs: tuple[Path, Path], tmp_path: Path
):
    first, second = bin_dirs
    make(first / "tool", 0o644)
    make(second / "tool", 0o755)
    assert find_program("tool", f"{first}:{second}", str(tmp_path), None, None) is None


@pytest.mark.parametrize(
    ("owner", "group", "mode", "runnable"),
    [
        (1000, 1000, 0o700, True),  # the task's own file
        (1000, 1000, 0o070, False),  # its owner bits decide for its owner
        (0, 1000, 0o750, True),
        (0, 0, 0o755, True),
        (0, 0, 0o750, False),
        (0, 0, 0o744, False),
    ],
    ids=["owner-x", "owner-no-x", "group-x", "other-x", "other-no-x", "no-x-but-owner"],
)
@pytest.mark.skipif(os.geteuid() != 0, reason="files of other owners need root")
def test_for_a_task_of_another_user_its_permission_bits_decide(
    tmp_path: Path, owner: int, group: int, mode: int, runnable: bool
):
    program = make(tmp_path / "tool", mode)
    os.chown(program, owner, group)
    expected = str(program) if runnable else None
    assert find_program("tool", str(tmp_path), str(tmp_path), 1000, 1000) == expected


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_shim_reuses_a_path_lookup_for_a_moment_then_looks_again(
    bin_dirs: tuple[Path, Path], tmp_path: Path
):
    first, second = bin_dirs
    make(second / "tool", 0o755)
    clock = FakeClock()
    lookups = PathLookups(clock)
    path = f"{first}:{second}"
    assert find_program("tool", path, str(tmp_path), None, None, lookups) == f"{second}/tool"
    make(first / "tool", 0o755)  # installed earlier in PATH meanwhile
    clock.now += PathLookups.LOOKUP_SECONDS / 2
    assert find_program("tool", path, str(tmp_path), None, None, lookups) == f"{second}/tool"
    assert find_program("tool", path, str(tmp_path), None, None) == f"{first}/tool"  # without: now
    clock.now += PathLookups.LOOKUP_SECONDS
    assert find_program("tool", path, str(tmp_path), None, None, lookups) == f"{first}/tool"


def test_a_program_not_found_is_looked_for_again_after_a_moment(
    bin_dirs: tuple[Path, Path], tmp_path: Path
):
    first, second = bin_dirs
    clock = FakeClock()
    lookups = PathLookups(clock)
    path = f"{first}:{second}"
    assert find_program("tool", path, str(tmp_path), None, None, lookups) is None
    make(second / "tool", 0o755)
    assert find_program("tool", path, str(tmp_path), None, None, lookups) is None
    clock.now += PathLookups.LOOKUP_SECONDS
    assert find_program("tool", path, str(tmp_path), None, None, lookups) == f"{second}/tool"


@pytest.mark.skipif(os.geteuid() != 0, reason="files of other owners need root")
def test_a_reused_lookup_still_asks_whether_each_tasks_user_may_run_it(tmp_path: Path):
    program = make(tmp_path / "tool", 0o700)
    os.chown(program, 1000, 1000)
    lookups = PathLookups(FakeClock())
    assert find_program("tool", str(tmp_path), str(tmp_path), 1000, 1000, lookups) == str(program)
    assert find_program("tool", str(tmp_path), str(tmp_path), 1001, 1001, lookups) is None


def test_a_path_with_a_slash_is_taken_as_written_from_the_working_directory(
    tmp_path: Path,
):
    make(tmp_path / "run.sh", 0o755)
    assert find_program("./run.sh", "/usr/bin", str(tmp_path), None, None) == "./run.sh"
    assert find_program(str(tmp_path / "run.sh"), "/usr/bin", "/", None, None) == str(
        tmp_path / "run.sh"
    )
    assert find_program("./absent", "/usr/bin", str(tmp_path), None, None) is None
    assert (
        find_program(str(tmp_path), "/usr/bin", "/", None, None) is None
    )  # a directory


def test_plan_gives_what_bash_execs_for_a_real_program(tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    direct = plan(["env"], PLATFORM_ENV, str(work), None, None)

    assert direct is not None
    # What bash itself passes to the same program, from the same directory:
    bash_env = subprocess.run(
        [BASH, "--noprofile", "--norc", "-e", "-c", "env\n", "pai-task-x"],
        env=PLATFORM_ENV,
        cwd=work,
        capture_output=True,
        check=True,
    ).stdout
    direct_env = subprocess.run(
        direct.argv,
        executable=direct.program,
        env=direct.env,
        cwd=work,
        capture_output=True,
        check=True,
    ).stdout
    assert sorted(direct_env.splitlines()) == sorted(bash_env.splitlines())
    assert direct.argv == ["env"]


def test_a_task_that_needs_a_shell_has_no_plan(tmp_path: Path):
    assert plan(["echo hi"], PLATFORM_ENV, str(tmp_path), None, None) is None
    assert (
        plan(["no-such-program-in-pai"], PLATFORM_ENV, str(tmp_path), None, None)
        is None
    )
    assert (
        plan(["env"], {**PLATFORM_ENV, "BASH_ENV": "/x"}, str(tmp_path), None, None)
        is None
    )


def test_the_working_directory_is_named_as_getcwd_names_it(tmp_path: Path):
    real = tmp_path / "real"
    (real / "task").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    direct = plan(["true"], PLATFORM_ENV, str(tmp_path / "link" / "task"), None, None)
    assert direct is not None and direct.env["PWD"] == str(real / "task")
    assert stat.S_ISDIR(os.stat(direct.env["PWD"]).st_mode)
