"""The launcher core applies a batch of events as one transaction.

What the shell relies on: a batch decides what the same events one at a time
would (same records, same starts, same publications), writes each job once,
is all-or-nothing when an event cannot be applied yet, and can be undone when
its effects could not be carried out, so the events handed again order them
again.
"""

from __future__ import annotations

import asyncio

import pytest

from libs.common.errors import Transient
from libs.common.messages import JobState, Reaction, TaskPlacement
from libs.common.protocol.model import JobSpec, Resources, TaskRole
from services.launcher.core import (
    LauncherCore,
    Placed,
    Publish,
    SaveJob,
    StartTask,
    StopRequested,
    Submitted,
    Verdict,
)
from services.launcher.core.tasks import TaskFinished, TaskKey, TaskRunning
from tests.unit.launcher.builders import Clock, exit_spec


def spec(name: str, instances: int = 1) -> JobSpec:
    worker = TaskRole(name="worker", instances=instances, commands=["true"], resources=Resources(cpu=1, memoryMB=256))
    return JobSpec(name=name, user="alice", virtualCluster="default", taskRoles=[worker], jobRetryCount=1)


def job(name: str) -> str:
    return f"alice~{name}"


def key(name: str, index: int = 0, attempt: int = 1) -> TaskKey:
    return TaskKey(job=job(name), attempt=attempt, role="worker", index=index)


def submitted(name: str, instances: int = 1) -> Submitted:
    return Submitted(job=job(name), spec=spec(name, instances), at=1.0, id=f"{name}/submitted")


def placed(name: str, instances: int = 1, attempt: int = 1) -> Placed:
    tasks = [TaskPlacement(role="worker", index=i, node="node-0") for i in range(instances)]
    return Placed(job=job(name), attempt=attempt, tasks=tasks, id=f"{name}/{attempt}/placed")


def trivial_life(name: str) -> list[object]:
    """A one-task job from submission to success."""
    return [submitted(name), placed(name), TaskRunning(key=key(name)), TaskFinished(key=key(name), exitCode=0)]


def failing_then_retried(name: str) -> list[object]:
    return [
        submitted(name),
        placed(name),
        TaskRunning(key=key(name)),
        TaskFinished(key=key(name), exitCode=1),
        Verdict(key=key(name), exitCode=1, spec=exit_spec(Reaction.RETRY_TO_MAX), id=f"{name}/verdict"),
        placed(name, attempt=2),
        TaskRunning(key=key(name, attempt=2)),
    ]


def stopped_while_running(name: str) -> list[object]:
    return [
        submitted(name, 2),
        placed(name, 2),
        TaskRunning(key=key(name, 0)),
        StopRequested(job=job(name), by="alice", id=f"{name}/stop"),
        TaskRunning(key=key(name, 1)),
        TaskFinished(key=key(name, 0), exitCode=143),
        TaskFinished(key=key(name, 1), exitCode=143),
    ]


def interleaved(*lives: list[object]) -> list[object]:
    """Several jobs' events mixed, each job's in its own order."""
    mixed: list[object] = []
    for step in range(max(len(life) for life in lives)):
        mixed.extend(life[step] for life in lives if step < len(life))
    return mixed


SEQUENCES = {
    "one trivial job": trivial_life("a"),
    "three trivial jobs interleaved": interleaved(trivial_life("a"), trivial_life("b"), trivial_life("c")),
    "a failure retried, beside a success": interleaved(failing_then_retried("a"), trivial_life("b")),
    "a stop while running, beside a success": interleaved(stopped_while_running("a"), trivial_life("b")),
}


def chunks(events: list[object], size: int) -> list[list[object]]:
    return [events[i : i + size] for i in range(0, len(events), size)]


def run(batches: list[list[object]]) -> tuple[LauncherCore, list]:
    core = LauncherCore(Clock())
    actions: list = []
    for batch in batches:
        actions += core.handle(*batch)  # type: ignore[arg-type]
        core.validate_state()
    return core, actions


def without_outbox(core: LauncherCore) -> dict:
    """Each job's record, less the outbox (which holds one call's publications)."""
    from msgspec.structs import replace

    return {j: replace(core.job(j), outbox=[]) for j in core.job_ids()}


def publications(actions: list) -> list[str]:
    return [a.event.id for a in actions if isinstance(a, Publish)]


def starts(actions: list) -> list[str]:
    return [a.launch.key.slug for a in actions if isinstance(a, StartTask)]


@pytest.mark.parametrize("size", [2, 3, 5, 1000], ids=lambda s: f"batches-of-{s}")
@pytest.mark.parametrize("name", list(SEQUENCES))
def test_a_batch_decides_what_its_events_one_at_a_time_would(name, size):
    events = SEQUENCES[name]
    one_by_one, single_actions = run([[e] for e in events])
    batched, batch_actions = run(chunks(events, size))
    assert without_outbox(batched) == without_outbox(one_by_one)
    assert sorted(publications(batch_actions)) == sorted(publications(single_actions))
    assert sorted(starts(batch_actions)) == sorted(starts(single_actions))
    # Each job's own events keep their order.
    for j in one_by_one.job_ids():
        mine = [e for e in publications(single_actions) if e.startswith(j + "/") or f"/{j}/" in e]
        assert [e for e in publications(batch_actions) if e in mine] == mine


def test_a_batch_writes_each_job_once_with_every_publication_in_its_outbox():
    _core, actions = run([interleaved(trivial_life("a"), trivial_life("b"))])
    saves = [a for a in actions if isinstance(a, SaveJob)]
    assert sorted(s.record.job for s in saves) == [job("a"), job("b")]
    # Records come before any other effect, as the shell's contract says.
    assert all(isinstance(a, SaveJob) for a in actions[: len(saves)])
    for save in saves:
        assert save.record.state == JobState.SUCCEEDED
        kinds = [type(e).__name__ for e in save.record.outbox]
        assert kinds == ["JobStateChanged", "TaskStarted", "JobStateChanged", "TaskExited", "JobReleased", "JobStateChanged"]
        assert [e.id for e in save.record.outbox] == [
            a.event.id for a in actions if isinstance(a, Publish) and a.event.job == save.record.job]


def test_a_batch_with_an_event_the_core_cannot_use_yet_changes_nothing():
    core, _ = run([trivial_life("a")[:2]])
    before = {j: core.job(j) for j in core.job_ids()}
    batch = [TaskRunning(key=key("a")), submitted("b"), placed("ghost"), placed("b")]
    with pytest.raises(Transient, match="ghost"):
        core.handle(*batch)  # type: ignore[arg-type]
    assert {j: core.job(j) for j in core.job_ids()} == before
    core.validate_state()
    # Handed again one at a time (what the bus does), the others apply and only the unknown one waits.
    applied = []
    for event in batch:
        try:
            applied += core.handle(event)  # type: ignore[arg-type]
        except Transient:
            continue
    assert core.job(job("a")).state == JobState.RUNNING
    assert starts(applied) == [key("b").slug]
    assert core.job(job("ghost")) is None


def test_an_undone_batch_handed_again_orders_the_same_effects_again():
    core, _ = run([[submitted("a")]])
    batch = [placed("a"), submitted("b"), placed("b")]
    first = core.handle(*batch)  # type: ignore[arg-type]
    # Its records could not be written: the shell undoes it.
    core.undo_last()
    assert core.job(job("b")) is None
    assert core.job(job("a")).current.tasks[0].placed is False
    core.validate_state()
    again = core.handle(*batch)  # type: ignore[arg-type]
    assert again == first  # the clock did not move: the very same records, starts and publications
    assert starts(again) == [key("a").slug, key("b").slug]
    # Without the undo, the same events would have been answered as done.
    assert core.handle(*batch) == []  # type: ignore[arg-type]



# --- the shell's batches of backend events -------------------------------------------


async def backend_reports(*events: object, gap: float = 0.0):
    for event in events:
        yield event
        if gap:
            await asyncio.sleep(gap)


async def collect(events, **options) -> list[list[object]]:
    from services.launcher.service import event_batches

    return [batch async for batch in event_batches(events, 256, **options)]


async def test_backend_events_already_reported_go_together_and_none_is_lost():
    reported = [TaskRunning(key=key(n)) for n in "abcdef"]
    batches = await collect(backend_reports(*reported))
    assert [e for batch in batches for e in batch] == reported
    assert len(batches) < len(reported)


def test_under_load_a_task_seen_running_is_held_for_its_end_and_goes_with_it():
    from services.launcher.core.held import HeldRunning

    held = HeldRunning(0.02)
    other, running, finished = TaskRunning(key=key("b")), TaskRunning(key=key("a")), TaskFinished(key=key("a"), exitCode=0)
    assert held.take([other, running], now=0.0, hold=True) == []
    assert held.next_due() == 0.02
    # a's end comes within the moment: a's start and end go together, b waits on.
    assert held.take([finished], now=0.01, hold=True) == [running, finished]
    assert held.due(0.019) == []
    assert held.due(0.02) == [other]
    assert len(held) == 0 and held.next_due() is None


def test_a_task_ending_in_the_same_batch_is_not_held_and_ends_are_never_held():
    from services.launcher.core.held import HeldRunning

    held = HeldRunning(0.02)
    running, finished = TaskRunning(key=key("a")), TaskFinished(key=key("a"), exitCode=0)
    assert held.take([running, finished], now=0.0, hold=True) == [running, finished]
    ended_elsewhere = TaskFinished(key=key("c"), exitCode=1)
    assert held.take([ended_elsewhere], now=0.0, hold=True) == [ended_elsewhere]
    assert len(held) == 0


def test_without_load_nothing_is_held():
    from services.launcher.core.held import HeldRunning

    held = HeldRunning(0.02)
    running = TaskRunning(key=key("a"))
    assert held.take([running], now=0.0, hold=False) == [running]
    assert len(held) == 0


def test_a_held_report_goes_before_any_later_report_of_its_job():
    from services.launcher.core.held import HeldRunning

    held = HeldRunning(0.02)
    first, second = TaskRunning(key=key("g", 0)), TaskRunning(key=key("g", 1))
    assert held.take([first], now=0.0, hold=True) == []
    # Not under load any more, and a report of another task of the same job:
    # the held one goes first, so the core sees g's reports in their order.
    assert held.take([second], now=0.005, hold=False) == [first, second]
    # A held report of one job does not hold back another job's end.
    third, other_end = TaskRunning(key=key("g", 2)), TaskFinished(key=key("h"), exitCode=0)
    assert held.take([third, other_end], now=0.01, hold=True) == [other_end]
    assert held.due(1.0) == [third]
