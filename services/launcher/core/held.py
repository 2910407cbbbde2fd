"""Task-running reports held back a moment for their task's end.

A task that ends at once (a trivial job's) then has its start and its end
applied in one transaction: one write of its job's record instead of two. Only
the running report waits: whatever else the backend reports (an end, which
releases cells, above all) is applied at once, so holding costs no job its
completion time. A held report goes out before any later report of its job,
so per job the core sees the backend's reports in the order they came.

Pure: the shell passes the time in (`now`, monotonic seconds) and applies what
`take` and `due` hand back.
"""

from __future__ import annotations

from collections.abc import Callable

from libs.common.ids import JobId
from services.launcher.core.events import LauncherEvent, Verdict
from services.launcher.core.tasks import TaskFinished, TaskKey, TaskRunning


def job_of(event: LauncherEvent) -> JobId:
    """The job a core event is about (a backend report and a verdict name it in their key)."""
    if isinstance(event, (TaskRunning, TaskFinished, Verdict)):
        return event.key.job
    return event.job


def _of_job(job: JobId) -> Callable[[TaskKey, float], bool]:
    return lambda key, _at: key.job == job


class HeldRunning:
    def __init__(self, seconds: float):
        self.seconds = seconds
        # Held reports in the order they came, each with the time it goes out.
        self._held: dict[TaskKey, tuple[TaskRunning, float]] = {}
        self._jobs: dict[JobId, int] = {}  # job -> how many of its reports are held

    def __len__(self) -> int:
        return len(self._held)

    def take(self, batch: list[LauncherEvent], *, now: float, hold: bool) -> list[LauncherEvent]:
        """What of `batch` to apply now, in order. With `hold` (the launcher is
        under load), a task seen running whose end is not in `batch` is held."""
        ended = {event.key for event in batch if isinstance(event, TaskFinished)} if hold else set()
        now_events: list[LauncherEvent] = []
        for event in batch:
            job = job_of(event)
            if job in self._jobs:
                now_events.extend(self._release(_of_job(job)))
            if hold and isinstance(event, TaskRunning) and event.key not in ended and event.key not in self._held:
                self._held[event.key] = (event, now + self.seconds)
                self._jobs[job] = self._jobs.get(job, 0) + 1
                continue
            now_events.append(event)
        return now_events

    def due(self, now: float) -> list[TaskRunning]:
        """The held reports whose moment has passed (their task has not ended meanwhile)."""
        return self._release(lambda _key, at: at <= now)

    def next_due(self) -> float | None:
        """When the next held report goes out; None when none is held."""
        return min((at for _event, at in self._held.values()), default=None)

    def _release(self, which: Callable[[TaskKey, float], bool]) -> list[TaskRunning]:
        released = [event for key, (event, at) in self._held.items() if which(key, at)]
        for event in released:
            del self._held[event.key]
            job = event.key.job
            self._jobs[job] -= 1
            if not self._jobs[job]:
                del self._jobs[job]
        return released
