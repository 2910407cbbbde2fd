"""Builders for launcher core tests: job specs, a settable clock, and a driver.

`Driver` plays the scheduler, the backend and the runtime around one
`LauncherCore`, keeping every action it got back so tests can assert on what a
user of the platform would see (job state, published events, tasks started).
"""

from __future__ import annotations

from collections.abc import Iterable

from libs.common import messages
from libs.common.messages import ExitSpec, JobState, Reaction, TaskPlacement
from libs.common.protocol.model import Completion, JobSpec, Resources, TaskRole
from libs.common.records import JobRecord, TaskRecord
from services.launcher.core import (
    Action,
    BackoffElapsed,
    KillTask,
    LauncherCore,
    Placed,
    PreemptRequested,
    Publish,
    SaveJob,
    StartTask,
    StartTimer,
    StopRequested,
    Submitted,
    Verdict,
)
from services.launcher.core.tasks import TaskFinished, TaskKey, TaskRunning

JOB = "alice~train"


class Clock:
    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def role(
    name: str = "worker",
    instances: int = 1,
    *,
    min_failed: int = 1,
    min_succeeded: int = -1,
    task_retry_count: int = 0,
    ports: dict[str, int] | None = None,
    gpu: int = 0,
) -> TaskRole:
    return TaskRole(
        name=name,
        instances=instances,
        completion=Completion(minFailedInstances=min_failed, minSucceededInstances=min_succeeded),
        taskRetryCount=task_retry_count,
        resources=Resources(gpu=gpu, ports=ports or {}),
        commands=[f"echo {name}"],
    )


def job_spec(*roles: TaskRole, job_retry_count: int = 0, gang: bool = True, vc: str = "default") -> JobSpec:
    user, _, name = JOB.partition("~")
    return JobSpec(
        name=name,
        user=user,
        virtualCluster=vc,
        jobRetryCount=job_retry_count,
        gangAllocation=gang,
        taskRoles=list(roles) or [role()],
    )


def exit_spec(reaction: Reaction, code: int = 1) -> ExitSpec:
    return ExitSpec(code=code, phrase=f"Code{code}", reaction=reaction)


def placement(task: TaskRecord, node: str | None = None) -> TaskPlacement:
    node = node or f"node-{task.index % 2}"
    return TaskPlacement(
        role=task.role, index=task.index, node=node, hostIp=f"10.0.0.{1 + task.index % 2}", gpus=[task.index]
    )


def kinds(actions: Iterable[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


def published(actions: Iterable[Action], kind: type[messages.Event] | None = None) -> list[messages.Event]:
    events = [a.event for a in actions if isinstance(a, Publish)]
    return [e for e in events if kind is None or isinstance(e, kind)]


def states_published(actions: Iterable[Action]) -> list[JobState]:
    return [e.state for e in published(actions, messages.JobStateChanged)]  # type: ignore[attr-defined]


class Driver:
    def __init__(self, spec: JobSpec | None = None, *, clock: Clock | None = None, **core_options: object):
        self.clock = clock or Clock()
        self.core = LauncherCore(self.clock, **core_options)  # type: ignore[arg-type]
        self.spec = spec or job_spec()
        self.log: list[Action] = []

    # --- plumbing ---------------------------------------------------------------------

    def handle(self, *events: object) -> list[Action]:
        actions = self.core.handle(*events)  # type: ignore[arg-type]
        self.log.extend(actions)
        self.core.validate_state()
        return actions

    @property
    def record(self) -> JobRecord:
        record = self.core.job(JOB)
        assert record is not None
        return record

    @property
    def state(self) -> JobState:
        return self.record.state

    def key(self, role: str = "worker", index: int = 0) -> TaskKey:
        record = self.record
        task = record.current.task(role, index)
        assert task is not None
        return TaskKey(job=JOB, attempt=record.attempt, role=role, index=index, taskAttempt=task.taskAttempt)

    def keys(self) -> list[TaskKey]:
        return [self.key(t.role, t.index) for t in self.record.current.tasks]

    # --- the outside world ------------------------------------------------------------

    def submit(self) -> list[Action]:
        return self.handle(Submitted(job=JOB, spec=self.spec, at=self.clock(), id="rest/submitted"))

    def place(
        self,
        tasks: Iterable[TaskRecord] | None = None,
        *,
        attempt: int | None = None,
        partial: bool = False,
        event_id: str | None = None,
    ) -> list[Action]:
        record = self.record
        chosen = list(tasks) if tasks is not None else list(record.current.tasks)
        number = attempt or record.attempt
        return self.handle(
            Placed(
                job=JOB,
                attempt=number,
                tasks=[placement(t) for t in chosen],
                partial=partial,
                id=event_id or f"scheduler/{number}/placed",
            )
        )

    def running(self, *keys: TaskKey) -> list[Action]:
        return self.handle(*(TaskRunning(key=k) for k in keys or self.keys()))

    def start(self) -> list[Action]:
        """Submit, place the whole job and see every task running."""
        return self.submit() + self.place() + self.running()

    def finish(self, role: str = "worker", index: int = 0, code: int = 0, **details: object) -> list[Action]:
        return self.handle(TaskFinished(key=self.key(role, index), exitCode=code, **details))  # type: ignore[arg-type]

    def verdict(
        self, role: str = "worker", index: int = 0, reaction: Reaction = Reaction.RETRY_TO_MAX, code: int = 1
    ) -> list[Action]:
        key = self.key(role, index)
        return self.handle(
            Verdict(key=key, exitCode=code, spec=exit_spec(reaction, code), diagnostics=["boom"], id=f"rt/{key.slug}")
        )

    def fail(
        self, role: str = "worker", index: int = 0, reaction: Reaction = Reaction.RETRY_TO_MAX, code: int = 1
    ) -> list[Action]:
        return self.finish(role, index, code) + self.verdict(role, index, reaction, code)

    def stop(self, by: str = "alice") -> list[Action]:
        return self.handle(StopRequested(job=JOB, by=by, id=f"rest/stop/{by}"))

    def preempt(self, by: str = "bob~urgent", attempt: int | None = None) -> list[Action]:
        number = attempt or self.record.attempt
        return self.handle(
            PreemptRequested(job=JOB, attempt=number, by=by, reason="needs the cells", id=f"s/{number}/preempt")
        )

    def backoff_elapsed(self, attempt: int | None = None) -> list[Action]:
        return self.handle(BackoffElapsed(job=JOB, attempt=attempt or self.record.attempt))

    def confirm_kills(self, actions: Iterable[Action], code: int = 143) -> list[Action]:
        """The backend reports every killed task as exited."""
        kills = [a.key for a in actions if isinstance(a, KillTask)]
        return self.handle(*(TaskFinished(key=k, exitCode=code, platformReason="Killed") for k in kills))


def started(actions: Iterable[Action]) -> list[TaskKey]:
    return [a.launch.key for a in actions if isinstance(a, StartTask)]


def killed(actions: Iterable[Action]) -> list[TaskKey]:
    return [a.key for a in actions if isinstance(a, KillTask)]


def timers(actions: Iterable[Action]) -> list[StartTimer]:
    return [a for a in actions if isinstance(a, StartTimer)]


def saved(actions: Iterable[Action]) -> list[JobRecord]:
    return [a.record for a in actions if isinstance(a, SaveJob)]
