"""The chaos soak: a stream of small jobs while services are killed one after another.

Shared by `test_soak.py` (which asserts that nothing is lost, run twice or failed)
and `benchmarks/chaos_soak.py` (which prints the same counts as JSON).

What "nothing runs twice" means here: the unit of work is a task attempt, the
pair (job attempt, task attempt) of one task instance. Every task writes that
pair into its start log when it starts, so a pair written twice is a task
attempt started twice: that is always a bug. A *new* attempt (a retry after a
platform failure) is allowed, but only as a new pair that PAI itself records:
every pair in the start logs must appear in the job's attempts as PAI reports
them (`GET /api/v2/jobs/{job}/job-attempts`). A start PAI did not record is
work done behind its back, counted as `unrecorded_starts`.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cli.client import ApiError
from cli.up import SERVICES
from tests.chaos.harness import (
    UNREACHABLE,
    chaos_job,
    is_final,
    kill,
    read_starts,
    start,
    wait_all_final,
)
from tests.integration.conftest import Api

DEFAULT_SEED = 20240611
DEFAULT_JOBS = 30
DEFAULT_KILLS = len(SERVICES)  # each service once, in a seeded random order


@dataclass(frozen=True)
class SoakJob:
    name: str
    roles: dict[str, int]
    vc: str
    seconds: float  # how long each task sleeps

    @property
    def job(self) -> str:
        return f"admin~{self.name}"


@dataclass
class SoakReport:
    jobs: int
    accepted: int = 0
    kills: list[str] = field(default_factory=list)
    lost: int = 0  # accepted, never final
    failed: int = 0  # final, but not SUCCEEDED
    duplicated_task_attempts: int = 0  # a (job attempt, task attempt) of one task started twice
    unrecorded_starts: int = 0  # a start PAI's job attempts do not list
    unstarted_tasks: int = 0  # a task of a SUCCEEDED job with no start at all
    new_job_attempts: int = 0  # attempts beyond the first (platform retries), all recorded
    wall_s: float = 0.0

    def summary(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items() if k != "kills") + f" kills={','.join(self.kills)}"

    def figures(self) -> dict:
        out = asdict(self)
        out["kills"] = len(self.kills)
        out["killed"] = self.kills
        return out


def plan_jobs(rng: random.Random, count: int, tag: str) -> list[SoakJob]:
    """Small jobs: most one task, some a ps and two workers; some in VC research."""
    jobs = []
    for n in range(count):
        roles = {"ps": 1, "worker": 2} if rng.random() < 0.3 else {"main": 1}
        vc = "research" if rng.random() < 0.25 else "default"
        jobs.append(SoakJob(name=f"soak-{n}-{tag}", roles=roles, vc=vc, seconds=rng.choice((0.5, 1.0, 2.0, 3.0))))
    return jobs


async def submit_until_answered(api: Api, body: str, give_up_at: float) -> bool:
    """Submit as a user would while rest may be down: retry until answered.

    A 409 on a retry means an earlier try was accepted before its answer was lost.
    """
    retried = False
    while time.monotonic() < give_up_at:
        try:
            await api.submit(body)
            return True
        except ApiError as exc:
            if exc.status == 409 and retried:
                return True
            if exc.status < 500:
                raise
        except UNREACHABLE:
            pass
        retried = True
        await asyncio.sleep(0.2)
    return False


async def submit_all(api: Api, jobs: list[SoakJob], starts_dir: Path, rng: random.Random) -> list[SoakJob]:
    accepted = []
    give_up_at = time.monotonic() + 120
    for job in jobs:
        body = chaos_job(job.name, starts_dir, [f"sleep {job.seconds}"], roles=job.roles, vc=job.vc)
        if await submit_until_answered(api, body, give_up_at):
            accepted.append(job)
        await asyncio.sleep(rng.uniform(0.4, 1.4))  # spread over the kills
    return accepted


async def kill_services(api: Api, kills: int, rng: random.Random) -> list[str]:
    """kill -9 a service every 1-2 s, starting it again at once (as `pai up`'s
    supervisor would); the next kill comes once it is back."""
    order = []
    while len(order) < kills:
        order += rng.sample(SERVICES, len(SERVICES))
    killed = []
    for service in order[:kills]:
        await asyncio.sleep(rng.uniform(1.0, 2.0))
        await kill(api, service)
        killed.append(service)
        await start(api, service)
    return killed


async def job_attempts(api: Api, job: str) -> list[dict]:
    return await api.client.request("GET", f"/api/v2/jobs/{job}/job-attempts")


def recorded_task_attempts(attempts: list[dict]) -> set[tuple[int, str, int, int]]:
    """(job attempt, role, index, task attempt) of every task attempt PAI lists.

    A task's earlier attempts are listed in `taskAttempts`; its current one is
    the next number (task attempts count from 0, one more per retry).
    """
    recorded = set()
    for attempt in attempts:
        for role, tasks in attempt["taskRoles"].items():
            for task in tasks:
                earlier = [summary["taskAttempt"] for summary in task["taskAttempts"]]
                for task_attempt in [*earlier, len(earlier)]:
                    recorded.add((attempt["attemptIndex"], role, task["taskIndex"], task_attempt))
    return recorded


async def run_soak(api: Api, starts_dir: Path, *, jobs: int = DEFAULT_JOBS, kills: int = DEFAULT_KILLS,
                   seed: int = DEFAULT_SEED, settle_seconds: float = 90.0) -> SoakReport:
    rng = random.Random(seed)
    began = time.monotonic()
    planned = plan_jobs(rng, jobs, tag=f"{seed:x}"[-6:])
    report = SoakReport(jobs=len(planned))
    accepted, report.kills = await asyncio.gather(
        submit_all(api, planned, starts_dir, random.Random(rng.random())),
        kill_services(api, kills, random.Random(rng.random())),
    )
    report.accepted = len(accepted)
    final = await wait_all_final(api, [job.job for job in accepted], timeout=settle_seconds)
    report.wall_s = round(time.monotonic() - began, 2)

    starts = read_starts(starts_dir)
    for job in accepted:
        detail = final[job.job]
        if not is_final(detail):
            report.lost += 1
            continue
        if detail["jobStatus"]["state"] != "SUCCEEDED":
            report.failed += 1
        attempts = await job_attempts(api, job.job)
        report.new_job_attempts += len(attempts) - 1
        recorded = recorded_task_attempts(attempts)
        for role, instances in job.roles.items():
            for index in range(instances):
                task = starts.get((job.job, role, index))
                if task is None:
                    if detail["jobStatus"]["state"] == "SUCCEEDED":
                        report.unstarted_tasks += 1
                    continue
                report.duplicated_task_attempts += task.duplicated
                report.unrecorded_starts += sum(
                    (job_attempt, role, index, task_attempt) not in recorded
                    for job_attempt, task_attempt in set(task.attempts)
                )
    return report
