"""The process a task that runs as another user finds itself in, read by the
kernel's own accounts of it (/proc/self), started the way the shim starts it
(local_shim._fork_exec_as): with the C extension _spawn_as (vfork + raw
system calls) and with the fallback where it is not built (subprocess's fork).
Both must give the same process. Needs root, as the platform does to switch
users (CI runs as root)."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.launcher.backends import local_procs, local_shim
from tests.spawn_paths import SPAWNERS, spawn_collected, task_work_dir, use_spawner

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")

UID = 0x70000124
GID = 0x70000125  # not the uid, and no group of the test's: each slot is told apart
CAT = "/bin/cat"


@pytest.fixture(params=SPAWNERS)
def spawner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return use_spawner(request.param, monkeypatch)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return task_work_dir(tmp_path, UID, GID)


def spawn(program: str, args: list[str], work: Path, **kwargs) -> str:
    """Start `program` as UID:GID as the shim does; its stdout (it must succeed)."""
    cgroup = kwargs.pop("cgroup", None)
    code, stdout, stderr = spawn_collected(
        [program, *args], {"PATH": "/usr/bin:/bin"}, work, uid=UID, gid=GID, program=program,
        cgroup_procs=[str(cgroup / "cgroup.procs")] if cgroup else None, **kwargs,
    )
    assert code == 0, stderr
    return stdout


def status_of(text: str) -> dict[str, str]:
    return {key: value.strip() for key, _, value in (line.partition(":") for line in text.splitlines())}


def signal_bits(mask: str) -> set[int]:
    bits = int(mask, 16)
    return {sig for sig in range(1, 65) if bits >> (sig - 1) & 1}


@pytest.fixture
def shim_signals() -> Iterator[None]:
    """The dispositions a shim has: handlers of its own (SIGTERM, SIGCHLD),
    Python's for SIGINT, SIGPIPE ignored by Python, SIGHUP ignored as under
    nohup (then caught by the shim: _catch_ignored_signals)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP)}
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    local_shim._catch_ignored_signals()
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_the_task_has_its_credentials_umask_session_and_signals_and_the_shim_keeps_its_own(
    spawner: str, work: Path, shim_signals: None
):
    shim = (os.getresuid(), os.getresgid(), os.getgroups())
    pid_and_status = spawn(CAT, ["/proc/self/stat", "/proc/self/status"], work)
    assert (os.getresuid(), os.getresgid(), os.getgroups()) == shim

    stat, _, status_text = pid_and_status.partition("\n")
    fields = stat.rpartition(")")[2].split()
    pid = int(stat.split()[0])
    assert int(fields[2]) == pid and int(fields[3]) == pid  # process group and session: its own
    status = status_of(status_text)
    assert status["Uid"].split() == [str(UID)] * 4  # real, effective, saved, file system
    assert status["Gid"].split() == [str(GID)] * 4
    assert status["Groups"] == ""
    assert int(status["Umask"], 8) == local_shim.TASK_UMASK
    reset = {signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD}
    assert reset & (signal_bits(status["SigIgn"]) | signal_bits(status["SigCgt"])) == set()
    assert signal_bits(status["SigBlk"]) == set()


def test_the_task_starts_in_its_directory_with_stdin_dev_null_and_only_its_stdio(spawner: str, work: Path):
    leaked = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(leaked, True)  # even one the shim left inheritable
    try:
        listing = spawn("/usr/bin/find", ["/proc/self/fd", "/proc/self/cwd", "-maxdepth", "1", "-printf", "%p %l\n"], work)
    finally:
        os.close(leaked)
    lines = dict(line.split(" ", 1) for line in listing.splitlines())
    # find's own fds (on the directory it started in, on the one it lists) are not the task's.
    fds = {
        path.removeprefix("/proc/self/fd/"): target
        for path, target in lines.items()
        if path.startswith("/proc/self/fd/") and target != str(work) and not target.endswith("/fd")
    }
    assert sorted(fds) == ["0", "1", "2"]
    assert fds["0"] == os.devnull
    assert lines["/proc/self/cwd"] == str(work)


def test_the_script_fd_is_the_only_other_fd_and_holds_the_script(spawner: str, work: Path):
    fd = local_shim._script_file("echo from-memory\n")
    try:
        in_task = local_shim._script_fd_in_task(fd, as_other_user=True)
        out = spawn("/bin/bash", ["--noprofile", "--norc", "-e", "-c",
                                  local_shim.script_loader(in_task) + "ls /proc/$$/fd\ntrue\n"], work, script_fd=fd)
    finally:
        os.close(fd)
    first, *fds = out.split()
    assert first == "from-memory"
    assert sorted(fds, key=int) == ["0", "1", "2"]  # the loader closed it


def test_the_data_limit_is_soft_and_hard_and_the_shims_own_is_unchanged(spawner: str, work: Path):
    shim = resource.getrlimit(resource.RLIMIT_DATA)
    limits = spawn(CAT, ["/proc/self/limits"], work, data_limit=64 << 20)
    assert resource.getrlimit(resource.RLIMIT_DATA) == shim
    line = next(line for line in limits.splitlines() if line.startswith("Max data size"))
    assert line.split()[3:5] == [str(64 << 20)] * 2


def test_without_a_data_limit_the_task_keeps_the_shims(spawner: str, work: Path):
    limits = spawn(CAT, ["/proc/self/limits"], work)
    line = next(line for line in limits.splitlines() if line.startswith("Max data size"))
    assert line.split()[3:5] == ["unlimited"] * 2


def _cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, kind, *_ = line.split()
        if kind == "cgroup2":
            return Path(where)
    return None


@pytest.fixture
def cgroup() -> Iterator[tuple[Path, str]]:
    """A real cgroup v2 directory under this process's own, and its name there."""
    mount = _cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup v2 hierarchy is mounted here")
    own = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
    name = f"{own.rstrip('/')}/pai-spawn-test-{os.getpid()}"
    path = mount / name.lstrip("/")
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup v2 directory here ({exc})")
    try:
        yield path, name
    finally:
        path.rmdir()


def test_the_task_joins_its_cgroup(spawner: str, work: Path, cgroup: tuple[Path, str]):
    path, name = cgroup
    own = spawn(CAT, ["/proc/self/cgroup"], work, cgroup=path)
    assert f"0::{name}" in own.splitlines()


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        pytest.param(lambda path: None, errno.ENOENT, id="missing"),
        pytest.param(lambda path: path.write_text("#!/bin/sh\n") or path.chmod(0o644), errno.EACCES,
                     id="not-executable"),
    ],
)
def test_a_program_that_cannot_be_exec_d_raises_with_its_errno_and_leaves_no_child(
    spawner: str, work: Path, make, expected: int
):
    bin_dir = Path(tempfile.mkdtemp(prefix="pai-spawn-"))  # pytest's temporary directories are root's alone
    bin_dir.chmod(0o755)
    program = bin_dir / "program"
    make(program)
    before = set(local_procs.children(os.getpid()))  # (a zombie is listed too)
    with pytest.raises(OSError) as raised:
        spawn(str(program), [], work)
    assert raised.value.errno == expected
    assert str(program) in str(raised.value) and f"as uid {UID}" in str(raised.value)
    assert set(local_procs.children(os.getpid())) <= before  # the failed child was reaped
    shutil.rmtree(bin_dir)
