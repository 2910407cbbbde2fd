"""kill -9 rest right after (and during) submissions: a job rest answered 202 for
exists after the restart and runs exactly once; so does one whose answer was cut off."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from cli.client import ApiError
from tests.chaos.harness import (
    UNREACHABLE,
    assert_each_task_started_once,
    chaos_job,
    kill,
    start,
    states,
    wait_all_final,
)

pytestmark = pytest.mark.chaos


async def test_every_accepted_submission_survives_a_killed_rest_and_runs_once(platform, starts_dir):
    tag = uuid.uuid4().hex[:6]
    names = [f"rest-{n}-{tag}" for n in range(10)]
    # The first is answered before the kill; the rest are in flight when rest dies.
    await platform.submit(chaos_job(names[0], starts_dir, ["sleep 0.5"]))
    in_flight = [asyncio.ensure_future(platform.submit(chaos_job(name, starts_dir, ["sleep 0.5"]))) for name in names[1:]]
    await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
    await kill(platform, "rest")
    accepted, cut_off = [names[0]], []
    for name, request in zip(names[1:], in_flight, strict=True):
        try:
            await request
            accepted.append(name)
        except UNREACHABLE:
            cut_off.append(name)
    await start(platform, "rest")

    # A user whose request was cut off sends it again: it is accepted now, or it is
    # 409 because the first one got through before rest died; either way one job.
    for name in cut_off:
        try:
            await platform.submit(chaos_job(name, starts_dir, ["sleep 0.5"]))
        except ApiError as exc:
            assert exc.status == 409, exc

    jobs = {f"admin~{name}": {"main": 1} for name in names}
    final = await wait_all_final(platform, jobs, timeout=60)
    assert states(final) == dict.fromkeys(jobs, "SUCCEEDED")
    assert_each_task_started_once(starts_dir, jobs)
