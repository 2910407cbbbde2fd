"""Tasks that need no shell: one simple command, exec'd by the shim itself.

A task's commands run as `bash --noprofile --norc -e -c <commands>`. When they
are one simple command (`true`, `python3 train.py --epochs=3`), all bash does
is look the program up in PATH and exec it in its own place (bash execs the
last command of a -c string without forking). The shim does that itself and
saves bash's start, which costs more CPU than a trivial program does.

The program finds what bash would have given it: the same argv (its first
word as written), working directory, stdio, umask, signals, session and
bounds, and bash's environment: the task's, plus PWD (the physical working
directory), SHLVL=0 (bash raises it to 1 and lowers it again before it execs
its last command) and `_` (the path it execs). Only the order of the
environment's entries differs (bash lists them in its own order).

Whatever bash could do differently is left to bash (`simple_argv`,
`program_env`, `find_program` answer None):
- text: only words made of SAFE_CHARACTERS separated by spaces or tabs, so no
  quoting, expansion ($, globs, ~, braces), redirection, pipe, list, comment
  or line break; the first word no assignment (`X=1 cmd`);
- the first word a bash builtin or keyword (echo, printf, test, [, cd, exit,
  export, exec, time, ...: some have no program at all, the others take other
  options than their /usr/bin twins), except `true` and `false` alone, which
  answer the same either way;
- an environment name bash reads (BASH_ENV, SHELLOPTS, BASH_FUNC_*, PWD,
  SHLVL, ...): only the names the platform sets itself are allowed;
- a program not found in PATH, not a regular file, not executable by the
  task's user, a PATH entry that is relative or empty (bash would look in the
  working directory), or an exec that fails (a script without `#!`, which bash
  runs itself): bash runs the command, and so prints its own "command not
  found" (127) or "Permission denied" (126) in the task's log.
A task with secrets always runs under bash: its command line, secrets filled
in, would be readable by anyone in /proc/<pid>/cmdline.
"""

from __future__ import annotations

import os
import stat
import string
import time
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import NamedTuple

SAFE_CHARACTERS = frozenset(string.ascii_letters + string.digits + "_-./,:+=@%")
WORD_SEPARATORS = (" ", "\t")
# bash 5's builtins (`compgen -b`) and reserved words (`compgen -k`).
BASH_BUILTINS = frozenset(
    [
        ".",
        ":",
        "[",
        "alias",
        "bg",
        "bind",
        "break",
        "builtin",
        "caller",
        "cd",
        "command",
        "compgen",
        "complete",
        "compopt",
        "continue",
        "declare",
        "dirs",
        "disown",
        "echo",
        "enable",
        "eval",
        "exec",
        "exit",
        "export",
        "false",
        "fc",
        "fg",
        "getopts",
        "hash",
        "help",
        "history",
        "jobs",
        "kill",
        "let",
        "local",
        "logout",
        "mapfile",
        "popd",
        "printf",
        "pushd",
        "pwd",
        "read",
        "readarray",
        "readonly",
        "return",
        "set",
        "shift",
        "shopt",
        "source",
        "suspend",
        "test",
        "times",
        "trap",
        "true",
        "type",
        "typeset",
        "ulimit",
        "umask",
        "unalias",
        "unset",
        "wait",
    ]
)
BASH_KEYWORDS = frozenset(
    [
        "if",
        "then",
        "else",
        "elif",
        "fi",
        "case",
        "esac",
        "for",
        "select",
        "while",
        "until",
        "do",
        "done",
        "in",
        "function",
        "time",
        "{",
        "}",
        "!",
        "[[",
        "]]",
        "coproc",
    ]
)
# Builtins whose program twin does the same when given no argument.
SAME_WITHOUT_ARGUMENTS = frozenset({"true", "false"})
# The environment the local backend gives a task (local.INHERITED_ENV, LC_*,
# the launch's PAI_* and CUDA_VISIBLE_DEVICES): names bash passes on untouched.
PLATFORM_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "CUDA_VISIBLE_DEVICES",
    }
)
PLATFORM_ENV_PREFIXES = ("PAI_", "LC_")


class DirectRun(NamedTuple):
    """How to exec a task's program without bash."""

    program: str  # the path exec'd
    argv: list[str]
    env: dict[str, str]


def simple_argv(commands: Sequence[str]) -> list[str] | None:
    """The argv of `commands` when they are one simple command bash would only
    look up and exec; None when bash must run them."""
    if len(commands) != 1:
        return None
    text = commands[0]
    for separator in WORD_SEPARATORS[1:]:
        text = text.replace(separator, WORD_SEPARATORS[0])
    words = text.split(WORD_SEPARATORS[0])
    argv = [word for word in words if word]
    if not argv or not all(SAFE_CHARACTERS.issuperset(word) for word in argv):
        return None
    first = argv[0]
    if "=" in first or first.startswith("%"):
        return None  # an assignment, or a job spec
    if first in BASH_KEYWORDS:
        return None
    if first in BASH_BUILTINS and not (
        first in SAME_WITHOUT_ARGUMENTS and len(argv) == 1
    ):
        return None
    return argv


def program_env(
    env: Mapping[str, str], cwd: str, program: str
) -> dict[str, str] | None:
    """The environment bash would exec `program` with from `cwd`, or None when
    `env` holds a name bash might act on or change."""
    for name in env:
        if name not in PLATFORM_ENV_NAMES and not name.startswith(
            PLATFORM_ENV_PREFIXES
        ):
            return None
    return {**env, "PWD": cwd, "SHLVL": "0", "_": program}


# What a PATH lookup found: the first file named `word` in it and its stat, or
# None (not there, or bash's to look up).
_Found = tuple[str, os.stat_result] | None


class PathLookups:
    """A shim's recent PATH lookups, so that a burst of tasks running the same
    program costs one walk of PATH (a stat per directory), not one per task.

    A lookup is reused for LOOKUP_SECONDS: a program installed or removed in
    PATH meanwhile is seen as late as if the task had started that much
    earlier. (Removed: its exec fails and bash runs the command, which says
    what bash says.) Whether the task's user may run it is judged again for
    each task, from the stat kept."""

    LOOKUP_SECONDS = 1.0

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._found: dict[tuple[str, str], tuple[float, _Found]] = {}

    def find(self, word: str, path: str) -> _Found:
        key = (word, path)
        now = self._clock()
        kept = self._found.get(key)
        if kept is not None and now - kept[0] < self.LOOKUP_SECONDS:
            return kept[1]
        found = _look_up(word, path)
        self._found[key] = (now, found)
        return found


def find_program(
    word: str,
    path: str | None,
    work_dir: str,
    uid: int | None,
    gid: int | None,
    lookups: PathLookups | None = None,
) -> str | None:
    """The file bash would exec for `word` (looked up in `path` unless it holds a
    slash), when it surely is one the task's user may run; None: leave it to bash.

    `uid`/`gid` None: the task runs as this process's user. `lookups`: recent
    PATH lookups to reuse (None: look now)."""
    if "/" in word:
        info = _stat(word if word.startswith("/") else os.path.join(work_dir, word))
        return (
            word
            if info is not None and _runnable(word, info, work_dir, uid, gid)
            else None
        )
    if not path:
        return None  # bash would use its own default PATH
    found = _look_up(word, path) if lookups is None else lookups.find(word, path)
    if found is None:
        return None
    candidate, info = found
    # The first file found decides: bash would skip one its user may not run
    # and look further, which is bash's to do.
    return candidate if _runnable(candidate, info, work_dir, uid, gid) else None


def _look_up(word: str, path: str) -> _Found:
    """The first file (not directory) named `word` in the directories of `path`;
    None when there is none, or when one of the directories is relative or
    spelled with a trailing slash (bash's to look up)."""
    for directory in path.split(":"):
        if not directory.startswith("/") or directory.endswith("/"):
            return None  # the working directory, or a name bash might spell otherwise
        candidate = f"{directory}/{word}"
        info = _stat(candidate)
        if info is None or stat.S_ISDIR(info.st_mode):
            continue  # not there: bash looks further
        return candidate, info
    return None


def plan(
    commands: Sequence[str],
    env: Mapping[str, str],
    work_dir: str,
    uid: int | None,
    gid: int | None,
    lookups: PathLookups | None = None,
) -> DirectRun | None:
    """The direct run of a task, or None when bash must run it (`lookups`: see
    find_program)."""
    argv = simple_argv(commands)
    if argv is None:
        return None
    program = find_program(argv[0], env.get("PATH"), work_dir, uid, gid, lookups)
    if program is None:
        return None
    exported = program_env(env, physical_path(work_dir), program)
    if exported is None:
        return None
    # `_` is the path as bash spelled it; exec needs it from the working directory.
    path = program if program.startswith("/") else os.path.join(work_dir, program)
    return DirectRun(path, argv, exported)


def physical_path(work_dir: str) -> str:
    """The working directory as getcwd() names it there (bash's PWD). A task's
    directory was just made by the shim, so only its parent can hold links."""
    parent, _, name = work_dir.rpartition("/")
    if not parent or not name:  # "/x", "x" or a trailing slash: as os.path sees it
        parent, name = os.path.split(work_dir)
        return os.path.join(_real_parent(parent), name)
    return f"{_real_parent(parent)}/{name}"


@lru_cache(maxsize=16)
def _real_parent(parent: str) -> str:
    return os.path.realpath(parent)


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _runnable(
    path: str, info: os.stat_result, work_dir: str, uid: int | None, gid: int | None
) -> bool:
    """Whether the task's user may exec the regular file `path`, by its mode bits
    (an ACL or a noexec mount that says otherwise makes the exec fail, and bash
    then runs the command)."""
    if not stat.S_ISREG(info.st_mode):
        return False
    if uid is None or gid is None:
        return os.access(
            path if path.startswith("/") else os.path.join(work_dir, path), os.X_OK
        )
    if info.st_uid == uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid == gid:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)
