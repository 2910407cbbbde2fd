"""The chaos soak: a stream of jobs of mixed shapes while services and NATS are
killed one after another under `pai up`'s own supervisor.

Shared by `test_soak.py` (the short form, which asserts that nothing is lost, run
twice, orphaned or ended in the wrong state) and `benchmarks/chaos.py` (the same
run at full size, printing the counts and recovery times as JSON).

What "nothing runs twice" means here: the unit of work is a task attempt, the
pair (job attempt, task attempt) of one task instance. Every task writes that
pair into its start log when it starts, so a pair written twice is a task
attempt started twice: that is always a bug. A *new* attempt (a retry after a
platform failure, a preemption) is allowed, but only as a new pair that PAI
itself records: every pair in the start logs must appear in the job's attempts
as PAI reports them (`GET /api/v2/jobs/{job}/job-attempts`). A start PAI did not
record is work done behind its back, counted as `unrecorded_starts`.

Job shapes, each with the final state a user expects whatever was killed:

| shape | what it does | expected |
|---|---|---|
| single | one task sleeps | SUCCEEDED |
| gang | a ps and two workers, started together | SUCCEEDED |
| failing | exits 1, no retries | FAILED |
| retried | fails its first attempt, `jobRetryCount: 2` | SUCCEEDED (2 attempts) |
| stopped | sleeps long; the soak stops it | STOPPED |
| victim / preemptor | test-priority jobs fill VC research; a prod job needing all of it preempts them | SUCCEEDED |
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from cli.client import ApiError
from cli.up import SERVICES
from tests.chaos.harness import (
    UNREACHABLE,
    chaos_job,
    is_final,
    read_starts,
    wait_all_final,
)
from tests.integration.conftest import Api, supervised

DEFAULT_SEED = 20240611
DEFAULT_JOBS = 100
DEFAULT_KILLS = 12
DEFAULT_NATS_KILLS = 2
NATS = "nats"
# Seconds between two kills, and how long a killed part may take to come back
# before the soak counts it as not recovered.
KILL_GAP_SECONDS = (1.0, 2.0)
RECOVERY_TIMEOUT_SECONDS = 60.0
STOPPED_TASK_SLEEP_SECONDS = 600

SHAPE_WEIGHTS = {"single": 40, "gang": 20, "failing": 10, "retried": 10, "stopped": 8, "victim": 9, "preemptor": 3}
EXPECTED_STATE = {
    "single": "SUCCEEDED",
    "gang": "SUCCEEDED",
    "failing": "FAILED",
    "retried": "SUCCEEDED",
    "stopped": "STOPPED",
    "victim": "SUCCEEDED",
    "preemptor": "SUCCEEDED",
}


@dataclass(frozen=True)
class SoakJob:
    name: str
    shape: str
    roles: dict[str, int]
    vc: str
    seconds: float  # how long each task sleeps

    @property
    def job(self) -> str:
        return f"admin~{self.name}"

    def body(self, starts_dir: Path) -> str:
        sleep = f"sleep {self.seconds}"
        match self.shape:
            case "failing":
                return chaos_job(self.name, starts_dir, [sleep, "exit 1"], roles=self.roles, vc=self.vc)
            case "retried":
                tried = f"{starts_dir}/{self.job}.tried"
                first_fails = f"if [ ! -e {tried} ]; then touch {tried}; exit 1; fi"
                body = chaos_job(self.name, starts_dir, [sleep, first_fails], roles=self.roles, vc=self.vc)
                return body.replace("jobRetryCount: 0", "jobRetryCount: 2")
            case "stopped":
                return chaos_job(self.name, starts_dir, [f"sleep {STOPPED_TASK_SLEEP_SECONDS}"], roles=self.roles, vc=self.vc)
            case "victim":
                return chaos_job(self.name, starts_dir, [sleep], cpu=4, roles=self.roles, vc=self.vc)
            case "preemptor":
                body = chaos_job(self.name, starts_dir, [sleep], cpu=8, roles=self.roles, vc=self.vc)
                return body + "extras:\n  hivedScheduler:\n    jobPriorityClass: prod\n"
        return chaos_job(self.name, starts_dir, [sleep], roles=self.roles, vc=self.vc)


@dataclass
class SoakReport:
    jobs: int
    accepted: int = 0
    kills: list[str] = field(default_factory=list)
    lost: int = 0  # accepted, never final
    wrong_final_state: int = 0  # final, but not in the state its shape expects
    duplicated_task_attempts: int = 0  # a (job attempt, task attempt) of one task started twice
    unrecorded_starts: int = 0  # a start PAI's job attempts do not list
    unstarted_tasks: int = 0  # a task of a SUCCEEDED job with no start at all
    orphaned_processes: int = 0  # task processes still alive once their job is final
    new_job_attempts: int = 0  # attempts beyond the first (retries, preemptions), all recorded
    not_recovered: int = 0  # a killed part that did not come back in RECOVERY_TIMEOUT_SECONDS
    recovery_s: dict[str, list[float]] = field(default_factory=dict)  # per part: kill -> ready again
    shapes: dict[str, int] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)  # "job: got STATE, expected STATE" (first few)
    unfinished: list[str] = field(default_factory=list)  # "job (shape): last STATE, why it waits" (lost ones)
    orphans: list[str] = field(default_factory=list)  # "job (shape, STATE): task key, pid: command"
    not_recovered_parts: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> str:
        skip = ("kills", "recovery_s", "wrong", "unfinished", "orphans")
        figures = " ".join(f"{k}={v}" for k, v in asdict(self).items() if k not in skip)
        return (f"{figures} kills={','.join(self.kills)} wrong={self.wrong[:5]} unfinished={self.unfinished[:5]} "
                f"orphans={self.orphans[:5]}")

    def figures(self) -> dict:
        out = asdict(self)
        out["wrong"], out["unfinished"], out["orphans"] = self.wrong[:20], self.unfinished[:20], self.orphans[:20]
        out["kills"] = len(self.kills)
        out["killed"] = dict(Counter(self.kills))
        out["recovery_s"] = {
            part: {"max": max(times), "median": sorted(times)[len(times) // 2]}
            for part, times in self.recovery_s.items()
        }
        out["longest_recovery_s"] = max((max(t) for t in self.recovery_s.values()), default=0.0)
        return out


def plan_jobs(rng: random.Random, count: int, tag: str) -> list[SoakJob]:
    shapes = list(SHAPE_WEIGHTS)
    weights = list(SHAPE_WEIGHTS.values())
    jobs = []
    for n in range(count):
        shape = rng.choices(shapes, weights)[0]
        roles = {"ps": 1, "worker": 2} if shape == "gang" else {"main": 1}
        vc = "research" if shape in ("victim", "preemptor") else ("research" if rng.random() < 0.15 else "default")
        seconds = rng.choice((0.2, 0.5, 1.0, 2.0)) if shape != "victim" else 3.0
        jobs.append(SoakJob(name=f"soak-{n}-{tag}", shape=shape, roles=roles, vc=vc, seconds=seconds))
    return jobs


async def until_answered(call, give_up_at: float, *, done_statuses: tuple[int, ...] = ()) -> bool:
    """Run an API call as a user would while rest or NATS may be down: retry until
    answered. A status in `done_statuses` on a retry means an earlier try already
    took effect before its answer was lost (e.g. 409 for a submit)."""
    retried = False
    while time.monotonic() < give_up_at:
        try:
            await call()
            return True
        except ApiError as exc:
            if exc.status in done_statuses and retried:
                return True
            if exc.status < 500 and exc.status != 429:
                raise
        except UNREACHABLE:
            pass
        retried = True
        await asyncio.sleep(0.2)
    return False


async def submit_all(api: Api, jobs: list[SoakJob], starts_dir: Path, spread_s: float, rng: random.Random) -> list[SoakJob]:
    """Submit every job, spread over `spread_s` (while the kills go on); stopped-shape
    jobs are stopped a moment later."""
    accepted, stops = [], []
    gap = spread_s / max(1, len(jobs))
    give_up_at = time.monotonic() + spread_s + 300
    for job in jobs:
        body = job.body(starts_dir)
        if await until_answered(lambda body=body: api.submit(body), give_up_at, done_statuses=(409,)):
            accepted.append(job)
            if job.shape == "stopped":
                stops.append(asyncio.ensure_future(_stop_later(api, job, rng.uniform(0.5, 3.0), give_up_at)))
        await asyncio.sleep(rng.uniform(0.5, 1.5) * gap)
    await asyncio.gather(*stops)
    return accepted


async def _stop_later(api: Api, job: SoakJob, delay: float, give_up_at: float) -> None:
    await asyncio.sleep(delay)
    await until_answered(lambda: api.stop(job.job), give_up_at)


def _kill_order(rng: random.Random, kills: int, nats_kills: int) -> list[str]:
    order = [NATS] * nats_kills
    while len(order) < kills:
        order += rng.sample(SERVICES, len(SERVICES))
    order = order[:kills]
    rng.shuffle(order)
    return order


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


async def _wait_recovered(api: Api, part: str) -> float | None:
    """Seconds until the killed part serves again: a service its /readyz, NATS the
    API (an answer from rest needs the bus)."""
    config = api.platform.config
    killed_at = time.monotonic()
    if part == NATS:
        url = f"{api.conn.url}/api/v2/jobs?limit=1"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api.conn.token}"})

        def check() -> bool:
            try:
                with urllib.request.urlopen(request, timeout=1) as resp:
                    return resp.status == 200
            except OSError:
                return False
    else:
        url = f"http://{config.host}:{config.port_of(part)}/readyz"

        def check() -> bool:
            return _ready(url)

    await asyncio.sleep(0.2)  # let the kill land before asking
    while time.monotonic() - killed_at < RECOVERY_TIMEOUT_SECONDS:
        if await asyncio.to_thread(check):
            return round(time.monotonic() - killed_at, 2)
        await asyncio.sleep(0.1)
    return None


async def kill_parts(api: Api, order: list[str], rng: random.Random, report: SoakReport) -> None:
    """kill -9 one part every 1-2 s once the previous one is back; the platform's
    own supervisor (running beside) starts each again."""
    for part in order:
        await asyncio.sleep(rng.uniform(*KILL_GAP_SECONDS))
        if part == NATS:
            os.kill(api.platform.nats.pid, signal.SIGKILL)
        else:
            os.kill(api.platform.procs[part].pid, signal.SIGKILL)
        report.kills.append(part)
        took = await _wait_recovered(api, part)
        if took is None:
            report.not_recovered += 1
            report.not_recovered_parts.append(part)
        else:
            report.recovery_s.setdefault(part, []).append(took)


async def job_attempts(api: Api, job: str) -> list[dict]:
    return await api.client.request("GET", f"/api/v2/jobs/{job}/job-attempts")


def recorded_task_attempts(attempts: list[dict]) -> set[tuple[int, str, int, int]]:
    """(job attempt, role, index, task attempt) of every task attempt PAI lists.

    A task's earlier attempts are listed in `taskAttempts`; its current one is
    the next number (task attempts count from 0, one more per retry).
    """
    recorded = set()
    for attempt in attempts:
        for role, shown in attempt["taskRoles"].items():
            for task in shown["taskStatuses"]:
                # A compacted older attempt of a big job lists its task briefly: `retries` only.
                earlier = [summary["taskAttempt"] for summary in task["taskAttempts"]] if "taskAttempts" in task \
                    else list(range(task["retries"]))
                for task_attempt in [*earlier, len(earlier)]:
                    recorded.add((attempt["attempt"], role, task["taskIndex"], task_attempt))
    return recorded


def live_task_processes() -> dict[str, list[str]]:
    """Live task processes per job id ("task key, pid, command line" each), found by
    the PAI_TASK_KEY the local backend gives each (one scan for the whole soak)."""
    per_job: dict[str, list[str]] = {}
    for proc in psutil.process_iter(["environ", "status", "cmdline"]):
        try:
            key = (proc.info.get("environ") or {}).get("PAI_TASK_KEY", "")
            if key and proc.info.get("status") != psutil.STATUS_ZOMBIE:
                user, name = key.split(".")[:2]
                command = " ".join(proc.info.get("cmdline") or [])[:120]
                per_job.setdefault(f"{user}~{name}", []).append(f"{key} pid {proc.pid}: {command}")
        except (psutil.Error, ValueError):
            continue
    return per_job


async def run_soak(api: Api, starts_dir: Path, *, jobs: int = DEFAULT_JOBS, kills: int = DEFAULT_KILLS,
                   nats_kills: int = DEFAULT_NATS_KILLS, seed: int = DEFAULT_SEED,
                   settle_seconds: float | None = None) -> SoakReport:
    rng = random.Random(seed)
    began = time.monotonic()
    planned = plan_jobs(rng, jobs, tag=f"{seed:x}"[-6:])
    report = SoakReport(jobs=len(planned), shapes=dict(Counter(job.shape for job in planned)))
    order = _kill_order(random.Random(rng.random()), kills, nats_kills)
    spread_s = kills * sum(KILL_GAP_SECONDS) / 2 + 5
    with supervised(api.platform):
        accepted, _ = await asyncio.gather(
            submit_all(api, planned, starts_dir, spread_s, random.Random(rng.random())),
            kill_parts(api, order, random.Random(rng.random()), report),
        )
        report.accepted = len(accepted)
        settle = settle_seconds if settle_seconds is not None else 60.0 + 0.5 * len(accepted)
        final = await wait_all_final(api, [job.job for job in accepted], timeout=settle)
    report.wall_s = round(time.monotonic() - began, 2)

    await asyncio.sleep(1.0)  # a task's last process may take a moment to be reaped
    alive = live_task_processes()
    starts = read_starts(starts_dir)
    for job in accepted:
        detail = final[job.job]
        if not is_final(detail):
            report.lost += 1
            if detail is None:
                report.unfinished.append(f"{job.job} ({job.shape}): never seen")
            else:
                status = detail["jobStatus"]
                report.unfinished.append(
                    f"{job.job} ({job.shape}): {status['state']} attempt {status.get('attempt')}, "
                    f"waiting: {status.get('waitingReason')}"
                )
            continue
        left = alive.get(job.job, [])
        report.orphaned_processes += len(left)
        report.orphans.extend(f"{job.job} ({job.shape}, {detail['jobStatus']['state']}): {p}" for p in left)
        state = detail["jobStatus"]["state"]
        if state != EXPECTED_STATE[job.shape]:
            report.wrong_final_state += 1
            report.wrong.append(f"{job.job} ({job.shape}): {state}, expected {EXPECTED_STATE[job.shape]}")
        attempts = await job_attempts(api, job.job)
        report.new_job_attempts += len(attempts) - 1
        recorded = recorded_task_attempts(attempts)
        for role, instances in job.roles.items():
            for index in range(instances):
                task = starts.get((job.job, role, index))
                if task is None:
                    if state == "SUCCEEDED":
                        report.unstarted_tasks += 1
                    continue
                report.duplicated_task_attempts += task.duplicated
                report.unrecorded_starts += sum(
                    (job_attempt, role, index, task_attempt) not in recorded
                    for job_attempt, task_attempt in set(task.attempts)
                )
    return report
