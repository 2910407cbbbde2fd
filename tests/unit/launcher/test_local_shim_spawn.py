"""How the shim starts a task as another user (local_shim._fork_exec_as): the
process a task's shell finds itself in, the same with the C extension
_spawn_as (vfork) and without it (subprocess's fork). Needs root, as the
platform does to switch users (CI runs as root)."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from services.launcher.backends import local_procs, local_shim
from services.launcher.backends.local_shim import (
    BASH,
    TASK_UMASK,
    _catch_ignored_signals,
    _script_fd_in_task,
)
from tests.spawn_paths import SPAWNERS, spawn_collected, task_work_dir, use_spawner

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")

UID = 0x70000123
GID = 65534


@pytest.fixture(autouse=True, params=SPAWNERS)
def spawner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test with _spawn_as and with the fallback the shim uses where it is not built."""
    return use_spawner(request.param, monkeypatch)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return task_work_dir(tmp_path, UID, GID)


def run(script: str, work: Path, *, script_fd: int | None = None, cgroup: Path | None = None) -> tuple[int, str, str]:
    """Start `script` as the task user the way the shim does; its exit status, stdout, stderr."""
    argv = [BASH, "--noprofile", "--norc", "-e", "-c", script, "pai-task-test"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "SHELL": BASH}
    procs = [str(cgroup / "cgroup.procs")] if cgroup is not None else None
    return spawn_collected(argv, env, work, uid=UID, gid=GID, script_fd=script_fd, cgroup_procs=procs)


def test_the_task_runs_as_its_user_with_no_group_in_a_session_of_its_own(work: Path):
    code, out, err = run('id -u; id -g; id -G; echo "$$ $(ps -o sid= -p $$) $(ps -o pgid= -p $$)"; umask; pwd', work)
    assert code == 0, err
    uid, gid, groups, session, umask, cwd = out.splitlines()
    assert (int(uid), int(gid), groups.split()) == (UID, GID, [str(GID)])
    pid, sid, pgid = session.split()
    assert pid == sid == pgid  # leads its own session and process group
    assert int(umask, 8) == TASK_UMASK
    assert cwd == str(work)


def test_the_task_inherits_no_fd_but_its_stdio_and_reads_stdin_from_dev_null(work: Path):
    leaked = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(leaked, True)  # even one the shim left inheritable
    try:
        code, out, err = run('ls /proc/$$/fd; readlink /proc/$$/fd/0; cat', work)
    finally:
        os.close(leaked)
    assert code == 0, err
    *fds, stdin = out.split()
    assert sorted(fds, key=int) == ["0", "1", "2"]
    assert stdin == os.devnull


def test_signals_the_shim_ignores_are_not_ignored_by_the_task(work: Path):
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGHUP)}
    for sig in before:
        signal.signal(sig, signal.SIG_IGN)  # as the fork server (SIGINT) and nohup (SIGHUP) leave them
    try:
        _catch_ignored_signals()
        assert all(signal.getsignal(sig) != signal.SIG_IGN for sig in before)  # the shim still survives them
        code, out, err = run("grep -E '^Sig(Ign|Blk)' /proc/$$/status", work)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert code == 0, err
    masks = dict(line.split(":") for line in out.splitlines())
    # bash -c ignores nothing itself; SIGPIPE and SIGXFSZ (ignored by Python) are reset too.
    # Signals glibc reserves for itself (32, 33: not in valid_signals) no program can set, so a
    # launcher started with one ignored passes that on; every other one must be at default.
    settable = {int(sig) for sig in signal.valid_signals()}
    ignored = int(masks["SigIgn"].strip(), 16)
    assert [sig for sig in range(1, 65) if ignored >> (sig - 1) & 1 and sig in settable] == []
    assert int(masks["SigBlk"].strip(), 16) == 0


def test_the_script_fd_reaches_the_task_and_nothing_else_does(work: Path):
    fd = local_shim._script_file("echo from-memory\n")
    try:
        # (not last: bash would exec ls in its own place, and list ls's fds)
        code, out, err = run(local_shim.script_loader(_script_fd_in_task(fd, True)) + "ls /proc/$$/fd\ntrue\n", work,
                             script_fd=fd)
    finally:
        os.close(fd)
    assert code == 0, err
    first, *fds = out.split()
    assert first == "from-memory"
    assert sorted(fds, key=int) == ["0", "1", "2"]  # the loader closed it


def test_a_task_that_cannot_start_raises_with_the_reason_and_leaves_no_child(work: Path):
    before = set(local_procs.children(os.getpid()))  # (a zombie is listed too)
    with pytest.raises(FileNotFoundError, match=f"as uid {UID}"):
        run("true", work / "missing")
    assert set(local_procs.children(os.getpid())) <= before  # the failed child was reaped


def test_a_task_with_a_cgroup_joins_it_before_dropping_root(work: Path, tmp_path: Path):
    # A stand-in for a cgroup directory: only root may write its cgroup.procs.
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir(mode=0o700)
    (cgroup / "cgroup.procs").touch(mode=0o600)
    code, out, err = run("echo $$; id -u; id -G", work, cgroup=cgroup)
    assert code == 0, err
    pid, uid, groups = out.splitlines()
    assert (cgroup / "cgroup.procs").read_text() == pid
    assert (int(uid), groups.split()) == (UID, [str(GID)])
    assert stat.S_IMODE((cgroup / "cgroup.procs").stat().st_mode) == 0o600


def test_a_program_started_without_bash_gets_its_data_limit_soft_and_hard(work: Path):
    script = "ulimit -S -d; ulimit -H -d; id -u; id -G"
    code, stdout, stderr = spawn_collected(["sh", "-c", script], {"PATH": "/usr/bin:/bin"}, work, uid=UID, gid=GID,
                                           program="/bin/sh", data_limit=64 << 20)
    assert code == 0, stderr
    soft, hard, uid, groups = stdout.splitlines()
    assert soft == hard == str(64 * 1024)  # KiB: what `ulimit -d` would have set
    assert (int(uid), groups.split()) == (UID, [str(GID)])
