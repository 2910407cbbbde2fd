"""The launcher's CPU and NATS writes per job, on a real nats-server with real local tasks.

    python benchmarks/launcher_consume.py [--jobs 500] [--rate 0] [--repeat 1]

Starts a nats-server (PAI's users and permissions, store bootstrapped) and the
launcher as users run it (`python -m services.launcher`, local backend), feeds
it what rest and the scheduler publish for `jobs` trivial one-task jobs (each
job submitted, then placed; its task runs `true`), and waits until every job's
release is on the stream and the launcher's consumer has acked everything.

`--rate 0` publishes every job before the launcher starts (a backlog: the
largest batches); `--rate N` publishes N jobs a second while it runs, each
job's placement `--placement-lag` seconds after its submission (the
scheduler's hop; 0 puts both in the same batch more often than they would be).

Prints JSON per run: the launcher process's own CPU per job (user + system,
/proc; its fork server, shims and tasks are other processes, measured by
launch_throughput.py), its idle CPU subtracted; and what it wrote to NATS per
job: job records (puts to the job status bucket), events published, and the
launcher core's transactions (each one record write per job it changed and
one round of publications). With `--rate`, also how long from a placement
stored to the job's record RUNNING and SUCCEEDED (the launcher's and its
backend's share of the time a job holds its cells).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.feeding import (
    cpu_seconds,
    idle_cpu_share,
    platform_nats,
    publish_all,
    service_process,
)
from benchmarks.stats import percentile
from libs.common import ids
from libs.common.bus import STREAM, Bus, load_all
from libs.common.messages import (
    Event,
    JobPlaced,
    JobSubmitted,
    TaskPlacement,
)
from libs.common.protocol.model import JobSpec, Resources, TaskRole
from libs.common.records import JobRecord
from libs.common.subjects import Bucket, Durable, Kind, kind_filter

LAUNCHER_KINDS = (Kind.JOB_STATE, Kind.TASK_STARTED, Kind.TASK_EXITED, Kind.JOB_RELEASED)


def job_events(i: int, run: str, now: float, users: int = 50) -> list[Event]:
    """What rest and the scheduler publish for one trivial one-task job (the jobs of `users` users, in turn)."""
    user = f"u{i % users}"
    name = f"bench{run}-{i}"
    job = f"{user}~{name}"
    role = TaskRole(name="main", instances=1, commands=["true"], resources=Resources(cpu=1, memoryMB=256))
    spec = JobSpec(name=name, user=user, virtualCluster="default", taskRoles=[role])
    return [
        JobSubmitted(id=f"{job}/submitted", job=job, at=now, spec=spec),
        JobPlaced(id=f"{job}/1/placed", job=job, at=now, vc="default", attempt=1,
                  tasks=[TaskPlacement(role="main", index=0, node="node-0")]),
    ]


async def publish_paced(bus: Bus, jobs: list[list[Event]], rate: float, lag: float) -> dict[str, float]:
    """Each job's submission at its turn, its placement `lag` seconds later;
    when each placement was stored (wall clock), by job."""
    timeline = sorted(
        (n / rate + step * lag, n, step, event) for n, events in enumerate(jobs) for step, event in enumerate(events)
    )
    started = time.monotonic()
    placed_at: dict[str, float] = {}
    for at, _, _, event in timeline:
        if (wait := started + at - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        await publish_all(bus, [event])
        if isinstance(event, JobPlaced):
            placed_at[event.job] = time.time()
    return placed_at


async def latencies(bus: Bus, placed_at: dict[str, float]) -> dict:
    """From each placement stored to its job's record RUNNING and SUCCEEDED (the
    launcher's own timestamps): the launcher's and its backend's share of the
    time a job holds its cells."""
    records = await load_all(await bus.kv(Bucket.JOB_STATUS), JobRecord)
    to_running, to_done = [], []
    for job, at in placed_at.items():
        record = records.get(ids.job_key(job))
        if record is None or record.launchedTime is None or record.completedTime is None:
            continue
        to_running.append(1000 * (record.launchedTime - at))
        to_done.append(1000 * (record.completedTime - at))

    def summary(values: list[float]) -> dict:
        return {"p50_ms": round(percentile(values, 50) or 0, 1), "p99_ms": round(percentile(values, 99) or 0, 1)}

    return {"placed_to_running": summary(to_running), "placed_to_succeeded": summary(to_done)}


async def stored(bus: Bus, kind: Kind) -> int:
    info = await bus.js.stream_info(STREAM, subjects_filter=kind_filter(kind))
    return sum((info.state.subjects or {}).values())


async def record_writes(bus: Bus) -> int:
    """Puts ever made to the job status bucket (its stream's last sequence)."""
    info = await bus.js.stream_info(f"KV_{Bucket.JOB_STATUS.value}")
    return info.state.last_seq


async def wait_done(bus: Bus, jobs: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit("the launcher exited")
        if await stored(bus, Kind.JOB_RELEASED) >= jobs:
            info = await bus.js.consumer_info(STREAM, Durable.LAUNCHER.value)
            if not info.num_ack_pending and not info.num_pending:
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"the launcher did not finish {jobs} jobs in {timeout}s")
        await asyncio.sleep(0.1)


async def transactions(metrics_url: str) -> float:
    """Core transactions the launcher ran so far (its batch histogram's count)."""
    async with aiohttp.ClientSession() as http, http.get(metrics_url) as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith("pai_launcher_batch_events_count"):
            return float(line.split()[-1])
    return 0.0


async def measure(root: Path, jobs: int, rate: float, lag: float) -> dict:
    run = os.urandom(3).hex()
    per_job = [job_events(i, run, time.time()) for i in range(jobs)]
    async with platform_nats(root) as (nats, bus):
        if rate <= 0:
            await publish_all(bus, [e for job in per_job for e in job])
        async with service_process(nats, root, "launcher") as (proc, port):
            metrics_url = f"http://127.0.0.1:{port}/metrics"
            transactions0 = await transactions(metrics_url)
            if rate <= 0:
                writes0, cpu0, t0 = 0, cpu_seconds(proc.pid), time.monotonic()
                await wait_done(bus, jobs, proc, timeout=120 + jobs * 0.1)
                cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
                idle_share = await idle_cpu_share(proc.pid)
            else:
                await asyncio.sleep(1.0)
                idle_share = await idle_cpu_share(proc.pid)
                writes0, cpu0, t0 = await record_writes(bus), cpu_seconds(proc.pid), time.monotonic()
                placed_at = await publish_paced(bus, per_job, rate, lag)
                await wait_done(bus, jobs, proc, timeout=120 + jobs * 0.1)
                cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
            writes = await record_writes(bus) - writes0
            latency = await latencies(bus, placed_at) if rate > 0 else None
            transactions_run = await transactions(metrics_url) - transactions0
            published = {kind.value: await stored(bus, kind) for kind in LAUNCHER_KINDS}
    busy = max(0.0, (cpu1 - cpu0) - idle_share * (t1 - t0))
    return {
        "jobs": jobs,
        "rate_jobs_per_s": rate or "backlog",
        "placement_lag_s": lag if rate > 0 else None,
        "wall_s": round(t1 - t0, 3),
        "launcher_cpu_s": round(cpu1 - cpu0, 3),
        "idle_cpu_share": round(idle_share, 4),
        "launcher_cpu_ms_per_job": round(1000 * busy / jobs, 3),
        "record_writes_per_job": round(writes / jobs, 2),
        "core_transactions_per_job": round(transactions_run / jobs, 2),
        "events_published_per_job": round(sum(published.values()) / jobs, 2),
        "events_published_per_job_by_kind": {k: round(v / jobs, 2) for k, v in published.items()},
        "latency": latency,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rate", type=float, default=0.0, help="jobs/s published live; 0: a backlog first")
    parser.add_argument("--placement-lag", type=float, default=0.05, help="seconds from a submission to its placement")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    results = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="pai-launcher-bench-") as tmp:
            results.append(asyncio.run(measure(Path(tmp), args.jobs, args.rate, args.placement_lag)))
    per_job = sorted(r["launcher_cpu_ms_per_job"] for r in results)
    print(json.dumps({"benchmark": "launcher_consume", "load_average": [round(x, 2) for x in os.getloadavg()],
                      "runs": results, "launcher_cpu_ms_per_job_median": per_job[len(per_job) // 2]}, indent=2))


if __name__ == "__main__":
    main()
