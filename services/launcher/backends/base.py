"""The interface every launcher backend implements (local processes, Kubernetes Pods).

The launcher's shell drives a backend; the backend never decides anything about
the job's lifecycle, it only starts, watches and stops task instances and reports
what it saw.

Contracts:
- `start` is idempotent per `TaskKey`: a key that was ever started is never
  started a second time, even across launcher restarts (the backend keeps its own
  durable record: a directory per task, or the Pod itself).
- Every started task produces exactly one `TaskFinished` through `events()`
  eventually, also when it ended while the launcher was down (reported after
  `recover()`), until `forget(key)` is called.
- `kill` is safe to call for unknown or finished tasks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import msgspec

from libs.common.messages import TaskPlacement


class TaskKey(msgspec.Struct, frozen=True, kw_only=True, order=True):
    job: str
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
    vc: str
    user: str
    placement: TaskPlacement
    commands: list[str]  # shell lines, run in order, stop at the first failure
    env: dict[str, str]  # PAI_* and CUDA_VISIBLE_DEVICES, computed by the launcher core
    cpu: int = 1
    memoryMB: int = 1024
    gpu: int = 0
    ports: dict[str, list[int]] = {}  # label -> ports given to this instance
    dockerImageUri: str | None = None
    imagePullSecret: str | None = None


class TaskRunning(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    key: TaskKey
    node: str = ""
    detail: str = ""


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


class Backend(Protocol):
    name: str

    async def recover(self) -> list[TaskKey]:
        """Re-adopt what survived a restart; returns the keys still known.

        Tasks that ended while the launcher was down are reported via `events()`.
        """
        ...

    async def start(self, launch: TaskLaunch) -> None: ...

    async def kill(self, key: TaskKey, *, grace_seconds: float, reason: str) -> None: ...

    def events(self) -> AsyncIterator[BackendEvent]: ...

    async def read_log(self, key: TaskKey, *, tail_bytes: int | None = None) -> bytes: ...

    async def forget(self, key: TaskKey) -> None:
        """The exit is recorded durably; drop the backend's bookkeeping for it."""
        ...

    async def close(self) -> None: ...
