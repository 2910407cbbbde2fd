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
- Optionally, `event_batches(most)`: the same reports as `events()`, in lists of
  every one already there (the shell takes them so; without it, the shell batches
  `events()` itself).

What a backend is told and what it reports (`TaskKey`, `TaskLaunch`, `TaskRunning`,
`TaskFinished`) are the launcher core's types (`services.launcher.core.tasks`): the
core decides, the backend carries out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from services.launcher.core.tasks import BackendEvent, TaskKey, TaskLaunch


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
