"""A mixed soak: thirty small jobs (some with three tasks) while every service is
kill -9'ed in a seeded random order, 1-2 s apart. In the end nothing is lost, no
task attempt ran twice, every start is one PAI recorded, and every job succeeded.

See `tests/chaos/soak.py` for why duplicates are counted per task attempt.
"""

from __future__ import annotations

import pytest

from cli.up import SERVICES
from tests.chaos.soak import run_soak

pytestmark = pytest.mark.chaos


# Kills of the scheduler and launcher wait out their leader lease (10 s) before the
# new process takes over; the soak takes about a minute on two cores.
@pytest.mark.timeout(300)
async def test_soak_with_every_service_killed_loses_and_repeats_nothing(platform, starts_dir):
    report = await run_soak(platform, starts_dir)
    print(report.summary())
    assert sorted(report.kills) == sorted(SERVICES)
    assert report.accepted == report.jobs
    assert report.lost == 0
    assert report.duplicated_task_attempts == 0
    assert report.unrecorded_starts == 0
    assert report.unstarted_tasks == 0
    assert report.failed == 0
