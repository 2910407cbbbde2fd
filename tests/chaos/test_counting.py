"""The counting the chaos tier relies on: start logs read back into task attempts,
and a task attempt written twice counted as duplicated."""

from __future__ import annotations

import subprocess

import pytest

from tests.chaos.harness import read_starts, record_start
from tests.chaos.soak import recorded_task_attempts

pytestmark = pytest.mark.chaos


@pytest.mark.parametrize(
    ("lines", "duplicated"),
    [
        (["1 0"], 0),
        (["1 0", "1 0"], 1),
        (["1 0", "1 1"], 0),  # a task retry is a new task attempt
        (["1 0", "2 0"], 0),  # a job retry is a new job attempt
        (["1 0", "2 0", "1 0", "1 0"], 2),
    ],
    ids=["once", "same-attempt-twice", "task-retried", "job-retried", "two-repeats-among-retries"],
)
def test_duplicates_are_repeated_task_attempts(tmp_path, lines, duplicated):
    (tmp_path / "admin~train-v-2-worker-3.starts").write_text("".join(f"{line}\n" for line in lines))
    [(key, starts)] = read_starts(tmp_path).items()
    assert key == ("admin~train-v-2", "worker", 3)  # a job name with dashes stays whole
    assert starts.duplicated == duplicated


def test_the_start_command_appends_one_line_per_start_to_the_task_log(tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "PAI_JOB_NAME": "alice~etl-2",
        "PAI_CURRENT_TASK_ROLE_NAME": "worker",
        "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": "1",
        "PAI_JOB_ATTEMPT_ID": "1",
        "PAI_TASK_ATTEMPT_ID": "0",
    }
    for _ in range(2):
        subprocess.run(["bash", "-c", record_start(tmp_path)], env=env, check=True)
    starts = read_starts(tmp_path)[("alice~etl-2", "worker", 1)]
    assert starts.attempts == [(1, 0), (1, 0)]
    assert starts.duplicated == 1


def test_recorded_task_attempts_cover_earlier_and_current_ones():
    attempts = [
        {"attempt": 2, "taskRoles": {"main": {"taskStatuses": [{"taskIndex": 0, "taskAttempts": [{"taskAttempt": 0}]}]}}},
        {"attempt": 1, "taskRoles": {"main": {"taskStatuses": [{"taskIndex": 0, "taskAttempts": []}]}}},
    ]
    assert recorded_task_attempts(attempts) == {(2, "main", 0, 0), (2, "main", 0, 1), (1, "main", 0, 0)}
