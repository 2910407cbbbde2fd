"""What the launcher core orders a backend to run, and what a backend reports back.

The core owns these types: it builds a `TaskLaunch`, and learns of a task's life
only through `TaskRunning` and `TaskFinished` (fed to `LauncherCore.handle`). The
backends (`services.launcher.backends`) import them from here.
"""

from __future__ import annotations

import msgspec

from libs.common.ids import JobId, NodeName, UserName, VcName
from libs.common.messages import TaskPlacement
from libs.common.storages import Storage


class TaskKey(msgspec.Struct, frozen=True, kw_only=True, order=True):
    job: JobId
    attempt: int
    role: str
    index: int
    taskAttempt: int = 0

    @property
    def slug(self) -> str:
        """File- and label-safe name, unique per task attempt."""
        user, _, name = self.job.partition("~")
        return f"{user}.{name}.{self.attempt}.{self.role}.{self.index}.{self.taskAttempt}"


class TaskLaunch(msgspec.Struct, frozen=True, kw_only=True):
    key: TaskKey
    vc: VcName
    user: UserName
    placement: TaskPlacement
    commands: list[str]  # shell lines, run in order, stop at the first failure
    env: dict[str, str]  # PAI_* and CUDA_VISIBLE_DEVICES, computed by the launcher core
    cpu: int = 1
    memoryMB: int = 1024
    gpu: int = 0
    ports: dict[str, list[int]] = {}  # label -> ports given to this instance
    dockerImageUri: str | None = None
    imagePullSecret: str | None = None
    # The image prerequisite's registry credentials (username, password, registryuri);
    # the password may hold secret references, filled in by the shell at start.
    dockerImageAuth: dict[str, str] | None = None
    shmMB: int | None = None  # extraContainerOptions.shmMB; None: the backend's default
    hostNetwork: bool = False  # extraContainerOptions.hostNetwork: the job asks for its node's network
    # The job's storages (teamwise_storage), as declared when it was accepted;
    # core/mounts.py's bind_mounts turns them into a task's binds.
    storages: list[Storage] = []


class TaskRunning(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    key: TaskKey
    node: NodeName = NodeName("")
    detail: str = ""
    # What ran it: "container" (the job's image) or "process" (on the host); "" unknown.
    runtimeMode: str = ""
    # When the backend saw it running (wall clock); None: when the core applies it.
    # The shell may hold a report a moment (core/held.py): the task's and the
    # job's launch times stay when it started, not when its record was written.
    at: float | None = None


class TaskFinished(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    key: TaskKey
    exitCode: int
    signal: int | None = None
    platformReason: str = ""  # "OOMKilled", "Evicted", "Killed", "NodeLost", ...
    platformMessage: str = ""
    userLogTail: str = ""  # last 64 KiB at most
    logPath: str = ""
    memoryPeakMB: int | None = None


BackendEvent = TaskRunning | TaskFinished
