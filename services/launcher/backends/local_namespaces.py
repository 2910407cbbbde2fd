"""A mount namespace of its own for each task that runs as another user.

What a task sees there (made by its child while still root, before it drops
to the task's uid and execs: _spawn_as, or `enter` where that is not built):
- /proc: a fresh proc mounted with `hidepid=2`, so the processes of other
  users (other jobs, the platform) are not there: no other tenant's command
  line, environment or status can be read. (A PID namespace would hide them
  too, but its first process ignores SIGTERM unless it handles it, which
  would break the graceful stop.)
- /dev/shm and /tmp: tmpfs of the task's own, owned by its uid, mode 1777,
  each at most its memoryMB (and what they hold is charged to its memory
  cgroup). No other task sees them, and they go away with the task's last
  process: nothing is left behind, world-readable or not.
- the job's storages (teamwise_storage: libs/common/storages.py), each bound
  at its mount path from its directory on the node (core/mounts.py), read-only
  where declared so. Only the Python steps (`enter`) bind them: a task with
  storages is forked by subprocess rather than _spawn_as (local_shim).
- Everything else as the machine has it. Mounts are made private first, so
  nothing mounted here reaches the machine's namespace.

A working directory under /tmp (a data dir under /tmp, or the work root
local_layout.choose_work_root puts under the temp dir) would be covered by
the task's /tmp: it is bound back at its own path there. So are the
platform's own directories a task runs from (its TensorBoard: the launcher
names them, local._platform_dirs) where they lie under /tmp or /dev/shm (PAI
installed under /tmp), but read-only, nosuid and nodev: a task reads and runs
the platform's virtualenv, never writes it. Like the storages, only `enter`
binds them: such a task is forked by subprocess rather than _spawn_as.

`probe` tells, once per process, whether this machine allows it (root, a
kernel with mount namespaces and a proc that takes hidepid); the backend says
plainly when it does not (local.py).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from typing import NamedTuple

from libs.common.storages import Storage
from services.launcher.core.mounts import BindMount, bind_mounts

CLONE_NEWNS = 0x00020000
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RDONLY = 1
MS_REMOUNT = 32
PROC_OPTIONS = "hidepid=2"
TMP = "/tmp"
SHM = "/dev/shm"
# A task's /dev/shm and /tmp when it has no memoryMB (specs of older launchers).
DEFAULT_TMPFS_MB = 1024


class MountPlan(NamedTuple):
    """What _spawn_as's `mounts` argument takes (see _spawn_as.c): the first five fields."""

    proc_options: str
    shm_options: str
    tmp_options: str
    keep: str | None  # a working directory under /tmp or /dev/shm, bound back in the task's own
    keep_dirs: list[str]  # its parents, made first in the task's /tmp
    # The job's storages (core/mounts.py), bound after the tmpfs mounts: in Python only.
    binds: tuple[BindMount, ...] = ()
    # The platform's directories under /tmp or /dev/shm that the task must see
    # (`hidden_platform_dirs`), bound back read-only at their own path: in Python only.
    platform: tuple[str, ...] = ()

    @property
    def in_python(self) -> bool:
        """Whether only `enter` makes this plan: _spawn_as.c makes its first five fields."""
        return bool(self.binds or self.platform)


class StorageUnavailable(OSError):
    """A storage a task cannot be given here; its launch fails with this message."""


def storage_binds(storages: list[Storage], task_gid: int | None) -> tuple[BindMount, ...]:
    """The binds of a task's storages, each source checked. A hostPath storage's
    directory missing on the node is made (root's, the tasks' group, 2770: every task
    that gets it may write there, no other user may enter); an NFS export or a claim
    is the admin's to mount there (StorageUnavailable names it when it is not)."""
    binds = tuple(bind_mounts(storages))
    for storage, bind in zip(storages, binds, strict=True):
        root_there = storage.type == "hostPath" or os.path.isdir(bind.host_path.removesuffix("/" + storage.subPath))
        if (storage.type == "hostPath" or storage.subPath) and root_there and not os.path.exists(bind.host_path):
            os.makedirs(bind.host_path, mode=0o700, exist_ok=True)
            if task_gid is not None:
                os.chown(bind.host_path, 0, task_gid)
            os.chmod(bind.host_path, 0o2770)
        if not os.path.isdir(bind.host_path):
            raise StorageUnavailable(f"storage {storage.name}: {bind.host_path} is not a directory on this node"
                                     + ("" if storage.type == "hostPath" else " (mount it there first)"))
    return binds


def _covered(path: str) -> str | None:
    """TMP or SHM when the task's own tmpfs there would hide `path`, else None."""
    return next((covered for covered in (TMP, SHM) if path.startswith(covered + "/")), None)


def _way_to(path: str, covered: str) -> list[str]:
    """The directories to make in the task's tmpfs at `covered` to reach `path`, outermost first."""
    parts = path[len(covered) + 1 :].split("/")
    return [f"{covered}/{'/'.join(parts[: i + 1])}" for i in range(len(parts))]


def hidden_platform_dirs(dirs: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Of the platform's directories a task needs (absolute paths), those its own /tmp
    or /dev/shm would hide, outermost only (one inside another comes with it). Never
    /tmp or /dev/shm themselves: the machine's would show again whole."""
    wanted = sorted({os.path.normpath(d) for d in dirs if os.path.isabs(d) and _covered(os.path.normpath(d))})
    kept: list[str] = []
    for path in wanted:  # sorted: a directory comes before what lies inside it
        if not any(path.startswith(outer + "/") for outer in kept):
            kept.append(path)
    return tuple(kept)


def plan(work_dir: str, uid: int, gid: int, memory_mb: int, binds: tuple[BindMount, ...] = (),
         platform_dirs: tuple[str, ...] | list[str] = ()) -> MountPlan:
    """`platform_dirs`: the platform's directories the task runs from (the launcher's
    word: local._platform_dirs); those under /tmp or /dev/shm are bound back read-only."""
    size = memory_mb if memory_mb > 0 else DEFAULT_TMPFS_MB
    tmpfs = f"size={size}m,mode=1777,uid={uid},gid={gid}"
    keep = None
    keep_dirs: list[str] = []
    covered = _covered(work_dir)  # a data dir there (a tmpfs for speed) would be hidden
    if covered is not None:
        keep = work_dir
        keep_dirs = _way_to(work_dir, covered)
    return MountPlan(PROC_OPTIONS, tmpfs, tmpfs, keep, keep_dirs, binds, hidden_platform_dirs(platform_dirs))


def describe(private: bool, why_not: str | None) -> str:
    if private:
        return "isolation: own mount namespace (/proc hidepid=2, private /dev/shm and /tmp)"
    return f"isolation: none ({why_not or 'not asked for'}: other tasks' processes, /dev/shm and /tmp are visible)"


_libc = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    return _libc


def _check(result: int, step: str) -> None:
    if result < 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{os.strerror(number)} ({step})")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None, step: str) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    _check(_c().mount(encode(source), encode(target), encode(fstype), flags, encode(data)), step)


def enter(mounts: MountPlan) -> None:
    """The steps of _spawn_as.c's enter_private_mounts, in Python: for a child
    forked without _spawn_as, still root. Leaves the child in `keep` if given."""
    libc = _c()
    _check(libc.unshare(CLONE_NEWNS), "unshare mount namespace")
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None, "make mounts private")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, mounts.proc_options, "mount /proc")
    keep = os.open(mounts.keep, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) if mounts.keep else -1
    # Storages' and the platform's directories, opened before /tmp and /dev/shm are
    # covered (they may be there).
    sources = [os.open(b.host_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for b in mounts.binds]
    platform = [os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for path in mounts.platform]
    # A read-only bind keeps what the machine's mount forbids (noexec), adds nosuid and nodev.
    platform_flags = [MS_NOEXEC if os.statvfs(path).f_flag & os.ST_NOEXEC else 0 for path in mounts.platform]
    _mount("tmpfs", SHM, "tmpfs", MS_NOSUID | MS_NODEV, mounts.shm_options, "mount /dev/shm")
    _mount("tmpfs", TMP, "tmpfs", MS_NOSUID | MS_NODEV, mounts.tmp_options, "mount /tmp")
    # The platform's first: a working directory inside one (however unlikely) stays writable.
    for path, source, flags in zip(mounts.platform, platform, platform_flags, strict=True):
        covered = _covered(path)
        assert covered is not None, "plan() keeps only the platform's directories under /tmp or /dev/shm"
        _make_dirs(_way_to(path, covered))
        _mount(f"/proc/self/fd/{source}", path, None, MS_BIND, None, f"bind the platform's {path}")
        os.close(source)
        _mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | flags, None,
               f"make the platform's {path} read-only")
    if keep >= 0:
        _make_dirs(mounts.keep_dirs)
        _mount(f"/proc/self/fd/{keep}", mounts.keep, None, MS_BIND, None, "bind the working directory")
        os.close(keep)
    for bind, source in zip(mounts.binds, sources, strict=True):
        os.makedirs(bind.container_path, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{source}", bind.container_path, None, MS_BIND | MS_REC, None,
               f"bind storage at {bind.container_path}")
        os.close(source)
        if bind.read_only:
            _mount(None, bind.container_path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC, None,
                   f"make storage at {bind.container_path} read-only")
    if mounts.keep:
        os.chdir(mounts.keep)


def _make_dirs(paths: list[str]) -> None:
    """Make each directory missing in the task's tmpfs, 0711 whatever the umask: the
    task passes through by the absolute path. One there already (a platform
    directory's way) is left as it is: it may lie in a read-only bind."""
    for path in paths:
        try:
            os.mkdir(path, 0o711)
        except FileExistsError:
            continue
        os.chmod(path, 0o711)


_PROBE = """
import sys
from services.launcher.backends import local_namespaces as n
n.enter(n.plan("/tmp", 65534, 65534, 16))
"""
_probed: dict[str, str | None] = {}


def probe() -> str | None:
    """None when tasks can get a mount namespace of their own here, else why
    not (in words). Asked once per process: a child tries the steps."""
    if "result" in _probed:
        return _probed["result"]
    if os.geteuid() != 0:
        why: str | None = "the launcher is not root"
    else:
        try:
            done = subprocess.run(
                [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=30,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            )
            lines = (done.stderr or "").strip().splitlines()
            why = None if done.returncode == 0 else f"the kernel refused it: {lines[-1] if lines else done.returncode}"
        except (OSError, subprocess.SubprocessError) as exc:
            why = f"the check failed: {exc}"
    _probed["result"] = why
    return why

