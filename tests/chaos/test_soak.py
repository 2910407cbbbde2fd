"""The chaos suite's short form: a hundred jobs of mixed shapes (gangs, failing,
retried, stopped, preempted) submitted while kill -9 hits every service and
nats-server, a dozen times, under `pai up`'s own supervisor. In the end nothing
is lost, no task attempt ran twice, no task process is left behind, every start
is one PAI recorded, and every job ended as its shape says it must.

`benchmarks/chaos.py` runs the same soak at full size; see `tests/chaos/soak.py`
for the shapes and why duplicates are counted per task attempt.
"""

from __future__ import annotations

import pytest

from cli.up import SERVICES
from tests.chaos.soak import NATS, run_soak

# A long scenario: `make test-slow` runs it, `make test` (CI) does not.
pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@pytest.mark.timeout(600)
async def test_soak_with_every_service_and_nats_killed_loses_repeats_and_leaves_nothing(platform, starts_dir):
    report = await run_soak(platform, starts_dir, jobs=100, kills=12, nats_kills=2)
    print(report.summary())
    assert set(report.kills) == {*SERVICES, NATS} and report.kills.count(NATS) >= 2
    assert report.accepted == report.jobs
    assert report.not_recovered == 0
    assert report.lost == 0
    assert report.duplicated_task_attempts == 0
    assert report.unrecorded_starts == 0
    assert report.unstarted_tasks == 0
    assert report.orphaned_processes == 0
    assert report.wrong_final_state == 0, report.wrong
