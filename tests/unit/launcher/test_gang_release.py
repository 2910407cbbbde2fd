"""gangReleaseEnable (HiveD): true, PAI's default, releases a job's cells with its attempt's
`job.released`; false releases each task's cells as soon as the task has ended for good in its
attempt (succeeded, or failed with no task retry left), while the attempt goes on."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from libs.common import messages
from libs.common.messages import Reaction
from tests.unit.launcher.builders import Driver, job_spec, published, role


def released_tasks(actions) -> list[tuple[int, list[tuple[str, int]], bool]]:
    return [(e.attempt, [(t.role, t.index) for t in e.tasks], e.requeue)
            for e in published(actions, messages.JobReleased)]


# (what happens, gangReleaseEnable of worker, the steps: (role, index, exit code, reaction),
#  the releases published: (attempt, tasks, requeue); tasks [] = the attempt's whole release)
CASES = [
    ("default: nothing until the attempt ends", True, [("worker", 0, 0, None)], []),
    ("per task: a succeeded task's cells at once", False, [("worker", 0, 0, None)], [(1, [("worker", 0)], False)]),
    ("per task: a failed task with no retry, the job tolerates it", False, [("worker", 1, 3, Reaction.NEVER_RETRY)],
     [(1, [("worker", 1)], False)]),
    ("per task: a task retried in place keeps its cells", False, [("worker", 0, 3, Reaction.RETRY_TO_MAX)], []),
    ("per task: the last task ends the attempt: its own release, then the attempt's", False,
     [("worker", 0, 0, None), ("worker", 1, 0, None), ("ps", 0, 0, None)],
     [(1, [("worker", 0)], False), (1, [("worker", 1)], False), (1, [], False)]),
]


@pytest.mark.parametrize(("gang_release", "steps", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_cells_go_back_per_task_only_for_a_role_that_asks(gang_release, steps, expected) -> None:
    worker = replace(role("worker", 2, min_failed=-1, task_retry_count=1), gangReleaseEnable=gang_release)
    driver = Driver(job_spec(role("ps", 1), worker, gang=False))  # without a gang, a task may retry in place
    driver.start()
    actions = []
    for name, index, code, reaction in steps:
        actions += driver.finish(name, index, code)
        if reaction is not None:
            actions += driver.verdict(name, index, reaction, code)
    assert released_tasks(actions) == expected


def test_a_per_task_release_is_saved_with_the_record_before_it_is_published() -> None:
    worker = replace(role("worker", 2), gangReleaseEnable=False)
    driver = Driver(job_spec(worker))
    driver.start()
    driver.finish("worker", 0, 0)
    [event] = [e for e in driver.record.outbox if isinstance(e, messages.JobReleased)]
    assert event.id == "alice~train/1/released/task/worker/0" and [(t.role, t.index) for t in event.tasks] == [("worker", 0)]
