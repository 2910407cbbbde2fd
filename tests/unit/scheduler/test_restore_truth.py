"""The scheduler's restore checked against the launcher's truth (core/truth.py):
stale placements free their cells, attempts the launcher runs keep theirs."""

from __future__ import annotations

import pytest

from libs.common.messages import ExitSpec, JobState, TaskPlacement
from libs.common.records import AttemptRecord, JobRecord as LauncherRecord, TaskRecord
from services.scheduler.core import Place, Restore, SchedulerCore, Submit, Wait
from services.scheduler.core.truth import AttemptTruth, LauncherTruth, Outcome, check_restore, truth_from_record
from tests.unit.scheduler.builders import Clock, Harness, cluster, spec

JOB = "alice~train"
SPEC = spec("train", vc="team", gpus=8)
TASKS = [TaskPlacement(role="worker", index=0, node="big", gpus=list(range(8)),
                       leafCells=[f"big/{i}" for i in range(8)])]


def truth(*attempts: AttemptTruth, finished: bool = False) -> dict[str, LauncherTruth]:
    current = max(a.attempt for a in attempts)
    return {JOB: LauncherTruth(job=JOB, spec=SPEC, finished=finished, current=current, attempts=list(attempts))}


def running(attempt: int) -> AttemptTruth:
    return AttemptTruth(attempt=attempt, released=False, holding=TASKS)


def released(attempt: int) -> AttemptTruth:
    return AttemptTruth(attempt=attempt, released=True)


def waiting(attempt: int) -> AttemptTruth:
    return AttemptTruth(attempt=attempt, released=False)


PLACED_1 = Restore(job=JOB, attempt=1, spec=SPEC, tasks=TASKS)
QUEUED_1 = Submit(job=JOB, attempt=1, spec=SPEC, at=5.0)

CASES = [
    # (id, scheduler's placed, scheduler's queued, launcher truth, expected (attempt, outcome) notes,
    #  expected restores, expected queued attempts)
    ("placed, launcher never saw it: kept", [PLACED_1], [], {}, [(1, Outcome.KEPT)], [1], []),
    ("placed, launcher runs it: kept", [PLACED_1], [], truth(running(1)), [(1, Outcome.KEPT)], [1], []),
    ("placed, launcher placed a later attempt not yet seen: kept", [PLACED_1], [],
     truth(waiting(1)), [(1, Outcome.KEPT)], [1], []),
    ("placed, job finished: released", [PLACED_1], [], truth(released(1), finished=True),
     [(1, Outcome.RELEASED)], [], []),
    ("placed, finished without a release (never placed): released", [PLACED_1], [],
     truth(waiting(1), finished=True), [(1, Outcome.RELEASED)], [], []),
    ("placed, released and retried, retry waits: requeued", [PLACED_1], [],
     truth(released(1), waiting(2)), [(1, Outcome.RELEASED), (2, Outcome.REQUEUED)], [], [2]),
    ("placed, released and retried, retry runs: adopted", [PLACED_1], [],
     truth(released(1), running(2)), [(1, Outcome.RELEASED), (2, Outcome.ADOPTED)], [2], []),
    ("bucket lost it, launcher runs it: adopted", [], [], truth(running(1)), [(1, Outcome.ADOPTED)], [1], []),
    ("bucket lost a finished job: nothing", [], [], truth(released(1), finished=True), [], [], []),
    ("bucket lost a waiting job: nothing to adopt", [], [], truth(waiting(1)), [], [], []),
    ("queued, launcher runs it: adopted", [], [QUEUED_1], truth(running(1)), [(1, Outcome.ADOPTED)], [1], []),
    ("queued, launcher waits for it: kept queued", [], [QUEUED_1], truth(waiting(1)), [], [], [1]),
    ("queued, job finished: dropped", [], [QUEUED_1], truth(released(1), finished=True),
     [(1, Outcome.DROPPED)], [], []),
    ("queued an older attempt, launcher waits for a later: requeued", [], [QUEUED_1],
     truth(released(1), waiting(2)), [(2, Outcome.REQUEUED)], [], [2]),
    ("queued, launcher never saw it: kept queued", [], [QUEUED_1], {}, [], [], [1]),
]


@pytest.mark.parametrize("placed, queued, launcher, notes, restores, submits", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_check_restore(placed, queued, launcher, notes, restores, submits):
    checked = check_restore(placed, queued, launcher)
    assert [(n.attempt, n.outcome) for n in checked.notes] == notes
    assert [r.attempt for r in checked.restores] == restores
    assert [s.attempt for s in checked.queued] == submits
    assert all(n.why for n in checked.notes)
    for restore in checked.restores:
        assert restore.tasks == TASKS  # adopted onto exactly the launcher's cells


def test_changed_jobs_are_the_ones_to_record_again():
    checked = check_restore([PLACED_1], [], truth(released(1), finished=True))
    assert checked.changed_jobs() == [JOB]
    assert check_restore([PLACED_1], [], truth(running(1))).changed_jobs() == []


def launcher_record(state: JobState, *attempts: AttemptRecord) -> LauncherRecord:
    return LauncherRecord(job=JOB, name="train", user="alice", vc="team", spec=SPEC, state=state,
                          createdTime=3.0, attempt=attempts[-1].attempt, attempts=list(attempts))


def placed_task(**extra) -> TaskRecord:
    return TaskRecord(role="worker", index=0, node="big", gpus=list(range(8)),
                      leafCells=[f"big/{i}" for i in range(8)], startRequested=True, **extra)


def test_truth_from_a_launcher_document():
    finished = launcher_record(
        JobState.FAILED,
        AttemptRecord(attempt=1, state=JobState.FAILED, completedTime=9.0, released=True,
                      tasks=[placed_task(completedTime=9.0, exitCode=1,
                                         exitSpec=ExitSpec(code=1, phrase="failed"))]),
    )
    said = truth_from_record(finished)
    assert (said.finished, said.current, said.attempts) == (True, 1, [AttemptTruth(attempt=1, released=True)])
    retrying = launcher_record(
        JobState.RUNNING,
        AttemptRecord(attempt=1, state=JobState.FAILED, completedTime=9.0, released=True, tasks=[placed_task()]),
        AttemptRecord(attempt=2, state=JobState.RUNNING, tasks=[placed_task(), TaskRecord(role="worker", index=1)]),
    )
    said = truth_from_record(retrying)
    assert (said.finished, said.current, said.submittedAt) == (False, 2, 3.0)
    assert said.attempt(2).holding == TASKS  # the unplaced task holds nothing


def fresh_core() -> SchedulerCore:
    return SchedulerCore(cluster("eight-gpu-node"), clock=Clock())


def placement_of_a_running_job() -> Restore:
    """Where the 8-GPU job really lands on this cluster."""
    harness = Harness("eight-gpu-node")
    harness.submit_spec(SPEC, attempt=1)
    return Restore(job=JOB, attempt=1, spec=SPEC, tasks=harness.placed[JOB])


def test_a_stale_placement_of_a_finished_job_frees_its_cells_for_a_waiting_job():
    other = spec("next", vc="team", gpus=8)
    waiting_job = Submit(job="alice~next", attempt=1, spec=other, at=10.0)
    stale = placement_of_a_running_job()

    # Without the launcher's word, the stale placement holds the node: the next job waits.
    core = fresh_core()
    decisions = core.handle(stale, waiting_job)
    assert [type(d) for d in decisions if d.job == "alice~next"] == [Wait]

    core = fresh_core()
    checked = check_restore([stale], [waiting_job], truth(released(1), finished=True))
    decisions = core.handle(*checked.restores, *checked.queued)
    core.validate_state()
    placed = [d for d in decisions if isinstance(d, Place)]
    assert [d.job for d in placed] == ["alice~next"]
    assert sorted(c for t in placed[0].tasks for c in t.leafCells) == sorted(c for t in stale.tasks for c in t.leafCells)
    assert core.entry(JOB) is None


def test_a_running_job_the_bucket_lost_keeps_its_cells():
    running_job = placement_of_a_running_job()
    waiting_job = Submit(job="alice~next", attempt=1, spec=spec("next", vc="team", gpus=8), at=10.0)
    launcher = {JOB: LauncherTruth(job=JOB, spec=SPEC, finished=False, current=1,
                                   attempts=[AttemptTruth(attempt=1, released=False, holding=running_job.tasks)])}
    core = fresh_core()
    checked = check_restore([], [waiting_job], launcher)
    decisions = core.handle(*checked.restores, *checked.queued)
    core.validate_state()
    assert not [d for d in decisions if isinstance(d, Place)]
    entry = core.entry(JOB)
    assert entry is not None and entry.placed and entry.tasks == running_job.tasks
