"""Random event sequences, crashes included, keep the lifecycle's invariants.

A small simulated world plays scheduler, backend, runtime and timers around one
LauncherCore. The launcher may crash after saving a record but before doing the
rest of what it decided; it then restarts from the saved records only. Checked
after every step:

- `validate_state()` holds (ports unique per node, one live attempt per task,
  final jobs without live tasks, increasing attempts, legal history);
- no task attempt is ever started twice by the backend;
- an event id is never published with two different contents;
- every state change in the job's history and every release has been
  published, crashes notwithstanding.
"""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings, strategies as st

from libs.common import messages
from libs.common.messages import JobState, Reaction, TaskPlacement
from libs.common.protocol.model import JobSpec
from libs.common.records import decode_job_record, encode_job_record
from services.launcher.core import (
    Action,
    BackoffElapsed,
    ForgetTask,
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
from services.launcher.core.announcements import released_id, state_id
from services.launcher.core.tasks import TaskFinished, TaskKey, TaskRunning
from tests.unit.launcher.builders import JOB, Clock, exit_spec, job_spec, role

NODES = ["n0", "n1"]


class World:
    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.clock = Clock()
        self.core = self._new_core()
        self.store: dict[str, bytes] = {}
        self.backend_live: set[TaskKey] = set()
        self.backend_known: set[TaskKey] = set()
        self.ever_started: set[TaskKey] = set()
        self.pending_exits: list[TaskFinished] = []
        self.timers: list[StartTimer] = []
        self.delivered: list[object] = []
        self.published: dict[str, messages.Event] = {}

    def _new_core(self) -> LauncherCore:
        return LauncherCore(self.clock, port_range=(20000, 20010), backoff_base_seconds=5, backoff_max_seconds=20)

    @property
    def record(self):
        return self.core.job(JOB)

    # --- the launcher shell -----------------------------------------------------------

    def deliver(self, event: object, crash_after: int | None = None) -> None:
        actions = self.core.handle(event)  # type: ignore[arg-type]
        self.delivered.append(event)
        self.carry_out(actions, crash_after)
        if crash_after is not None:
            self.restart()
        self.core.validate_state()
        self.check()

    def carry_out(self, actions: list[Action], crash_after: int | None = None) -> None:
        saves = [a for a in actions if isinstance(a, SaveJob)]
        others = [a for a in actions if not isinstance(a, SaveJob)]
        assert actions[: len(saves)] == saves, "saves come first"
        for save in saves:
            self.store[save.record.job] = encode_job_record(save.record)
        for action in others[:crash_after]:
            match action:
                case StartTask(launch=launch):
                    assert launch.key not in self.ever_started, f"{launch.key} started twice"
                    self.ever_started.add(launch.key)
                    self.backend_live.add(launch.key)
                    self.backend_known.add(launch.key)
                case KillTask(key=key):
                    if key in self.backend_live:
                        self.backend_live.discard(key)
                        self.pending_exits.append(TaskFinished(key=key, exitCode=143, platformReason="Killed"))
                case ForgetTask(key=key):
                    self.backend_known.discard(key)
                case StartTimer():
                    self.timers.append(action)
                case Publish(event=event):
                    seen = self.published.setdefault(event.id, event)
                    assert seen == event, f"id {event.id} published with two contents"

    def restart(self) -> None:
        self.core = self._new_core()
        self.timers = []
        for data in self.store.values():
            self.core.load(decode_job_record(data))
        # The backend re-reports exits it was not told to forget.
        self.pending_exits = [e for e in self.pending_exits if e.key in self.backend_known]
        self.carry_out(self.core.recover(set(self.backend_known)))

    def check(self) -> None:
        record = self.record
        if record is None:
            return
        for step in record.history:
            assert state_id(JOB, step.attempt, step.to) in self.published, f"lost publication of {step}"
        for attempt in record.attempts:
            if attempt.released:
                assert released_id(JOB, attempt.attempt) in self.published


def placements(world: World, count: int) -> list[TaskPlacement]:
    record = world.record
    unplaced = [t for t in record.current.tasks if not t.placed]
    return [
        TaskPlacement(role=t.role, index=t.index, node=NODES[(t.index + i) % 2], hostIp="10.0.0.1", gpus=[t.index])
        for i, t in enumerate(unplaced[:count])
    ]


def pick(items: list, index: int):
    return items[index % len(items)] if items else None


PLACE = st.tuples(st.just("place"), st.integers(1, 4))
RUN = st.tuples(st.just("run"), st.integers(0, 7))
EXIT = st.tuples(st.just("exit"), st.integers(0, 7), st.sampled_from([0, 0, 1, 137]))
REPORT_KILL = st.tuples(st.just("report_kill"), st.integers(0, 7))
VERDICT = st.tuples(st.just("verdict"), st.integers(0, 7), st.sampled_from(list(Reaction)))
# Common moves appear several times so that jobs get far (placed, running, retried) before a stop.
MOVES = st.one_of(
    PLACE,
    PLACE,
    PLACE,
    RUN,
    RUN,
    RUN,
    EXIT,
    EXIT,
    EXIT,
    REPORT_KILL,
    REPORT_KILL,
    VERDICT,
    VERDICT,
    VERDICT,
    st.tuples(st.just("stop"), st.integers(0, 3)),  # acts on 0 only: a stop ends the story
    st.tuples(st.just("preempt"), st.integers(0, 1)),
    st.tuples(
        st.just("timer"),
    ),
    st.tuples(st.just("redeliver"), st.integers(0, 200)),
    st.tuples(st.just("crash"), st.integers(0, 3)),
)

SPECS = st.builds(
    lambda gang, roles, retries: job_spec(*roles, job_retry_count=retries, gang=gang),
    st.booleans(),
    st.lists(
        st.builds(
            role,
            st.sampled_from(["ps", "worker"]),
            st.integers(1, 3),
            min_failed=st.sampled_from([-1, 1, 2]),
            min_succeeded=st.sampled_from([-1, 1, 2]),
            task_retry_count=st.integers(0, 2),
            ports=st.sampled_from([{}, {"http": 1}, {"http": 1, "nccl": 2}]),
        ),
        min_size=1,
        max_size=2,
        unique_by=lambda r: r.name,
    ),
    st.integers(0, 2),
)


def play(world: World, move: tuple) -> None:
    record = world.record
    match move:
        case ("place", count):
            chosen = placements(world, count)
            if chosen:
                world.deliver(
                    Placed(job=JOB, attempt=record.attempt, tasks=chosen, partial=True, id=f"p{len(world.delivered)}")
                )
        case ("run", i):
            key = pick(sorted(world.backend_live), i)
            if key is not None:
                world.deliver(TaskRunning(key=key))
        case ("exit", i, code):
            key = pick(sorted(world.backend_live), i)
            if key is not None:
                world.backend_live.discard(key)
                world.deliver(TaskFinished(key=key, exitCode=code))
        case ("report_kill", i):
            if world.pending_exits:
                exit_event = world.pending_exits.pop(i % len(world.pending_exits))
                world.deliver(exit_event)
        case ("verdict", i, reaction):
            pending = [
                TaskKey(job=JOB, attempt=a.attempt, role=t.role, index=t.index, taskAttempt=t.taskAttempt)
                for a in record.attempts
                for t in a.tasks
                if t.verdictPending
            ]
            key = pick(pending, i)
            if key is not None:
                world.deliver(Verdict(key=key, exitCode=1, spec=exit_spec(reaction), id=f"v/{key.slug}"))
        case ("stop", 0):
            world.deliver(StopRequested(job=JOB, by="alice", id=f"stop{len(world.delivered)}"))
        case ("stop", _):
            pass
        case ("preempt", back):
            world.deliver(
                PreemptRequested(
                    job=JOB, attempt=max(1, record.attempt - back), by="bob~x", id=f"pre{len(world.delivered)}"
                )
            )
        case ("timer",):
            if world.timers:
                timer = world.timers.pop(0)
                world.clock.now = max(world.clock.now, timer.at)
                world.deliver(BackoffElapsed(job=timer.job, attempt=timer.attempt))
        case ("redeliver", i):
            event = pick(world.delivered, i)
            if event is not None:
                world.deliver(event)
        case ("crash", after):
            # Crash while carrying out the next event: only its saves and `after` actions happen.
            live = sorted(world.backend_live)
            if live:
                world.backend_live.discard(live[0])
                world.deliver(TaskFinished(key=live[0], exitCode=1), crash_after=after)
            else:
                world.restart()
                world.core.validate_state()
                world.check()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=SPECS, moves=st.lists(MOVES, min_size=20, max_size=60))
def test_random_event_sequences_keep_the_invariants(spec: JobSpec, moves: list[tuple]) -> None:
    world = World(spec)
    world.deliver(Submitted(job=JOB, spec=spec, at=world.clock(), id="submitted"))
    for move in moves:
        world.clock.advance(1.0)
        play(world, move)
    # Drain: report every kill; the job must not keep live tasks once final.
    while world.pending_exits:
        world.deliver(world.pending_exits.pop(0))
    record = world.record
    for key in world.backend_live:  # still running in the backend: the launcher must not have given up on it
        task = record.attempt_record(key.attempt).task(key.role, key.index)
        assert task.killReason is None, f"{key} was to be killed, but no kill reached the backend"
    if record.state.is_final:
        assert not any(t.live for t in record.current.tasks)
    assert msgspec.json.decode(encode_job_record(record), type=type(record)) == record
    if record.state == JobState.STOPPING:
        assert all(not t.live or t.killReason for t in record.current.tasks)
