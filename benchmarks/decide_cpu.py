"""CPU per job of the launcher's and the scheduler's deciding code, in-process (no NATS).

- `launcher`: one-task jobs through `LauncherCore` in batches (submitted, then
  placed, then the task's running and finished reports together), each
  transaction's records encoded as the shell stores them and its events given
  their subject and encoding as the bus publishes them;
- `scheduler`: one-task jobs submitted to `SchedulerShell.handle_batch` in
  batches on the e2e benchmark's slots64 cluster (64 one-CPU cells), its KV
  writes and publications answered at once; each batch's placements are
  released `--release-after` batches later, so a queue forms as in a burst.
  The jobs are those of `--users` users in turn (default 50): fair share keeps the
  tags of users who queue beside each other, a user alone costs no re-tags.

What neither counts: NATS (the bus's publishes, writes, fetches and acks), the
local backend, the event loop's own work. `--young N` sets the collector's
youngest-generation threshold as the services' `main()` does (CPython's
default: 700), to see what it is worth.

    python benchmarks/decide_cpu.py [--jobs 3000] [--batch 16] [--runs 5] [--young 700] [--users 50]

Prints JSON: microseconds of CPU per job, each run sorted, and the median.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.e2e_throughput import slots64_cluster_file  # noqa: E402
from benchmarks.launcher_consume import job_events  # noqa: E402
from libs.common import ids  # noqa: E402
from libs.common.config import Config  # noqa: E402
from libs.common.messages import JobPlaced, JobReleased, encode, subject_of  # noqa: E402
from libs.common.records import encode_job_record  # noqa: E402
from services.launcher.core import LauncherCore, Publish, SaveJob, StartTask, from_message  # noqa: E402
from services.launcher.core.tasks import TaskFinished, TaskRunning  # noqa: E402
from services.scheduler.cluster import load_cluster_config  # noqa: E402
from services.scheduler.core import SchedulerCore  # noqa: E402
from services.scheduler.service import SchedulerShell  # noqa: E402


def launcher_us_per_job(jobs: int, batch: int) -> float:
    core = LauncherCore(time.time, kill_grace_seconds=10.0)
    per_job = [job_events(i, "decide", time.time()) for i in range(jobs)]

    def apply(events: list) -> list:
        actions = core.handle(*events)
        for action in actions:  # what the shell's _execute and the bus do with them, less the I/O
            if isinstance(action, SaveJob):
                ids.job_key(action.record.job), encode_job_record(action.record)
            elif isinstance(action, Publish):
                subject_of(action.event), encode(action.event)
        return actions

    began = time.process_time()
    for first in range(0, jobs, batch):
        chunk = per_job[first:first + batch]
        apply([from_message(submitted) for submitted, _ in chunk])
        started = apply([from_message(placed) for _, placed in chunk])
        keys = [action.launch.key for action in started if isinstance(action, StartTask)]
        apply([TaskRunning(key=k, node="node-0", detail="", at=time.time()) for k in keys]
              + [TaskFinished(key=k, exitCode=0) for k in keys])
    return (time.process_time() - began) / jobs * 1e6


class _AnsweredBus:
    """Stands in for the bus: every write and publication succeeds at once."""

    def __init__(self) -> None:
        self.placed: list[JobPlaced] = []

    async def kv_write_many(self, bucket, writes, gone_after=None) -> None:
        pass

    async def publish_many(self, events) -> None:
        self.placed.extend(e for e in events if isinstance(e, JobPlaced))


class _Context:
    def __init__(self) -> None:
        self.bus = _AnsweredBus()
        self.config = Config()  # the defaults: the shell reads its purge markers' lifetime there


async def scheduler_us_per_job(jobs: int, batch: int, release_after: int, users: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = load_cluster_config(str(slots64_cluster_file(Path(tmp) / "cluster.yaml")))
    ctx = _Context()
    shell = SchedulerShell(ctx, SchedulerCore(cluster, clock=time.time))  # type: ignore[arg-type]
    submitted = [submission for i in range(jobs) for submission in job_events(i, "decide", time.time(), users)[:1]]

    def released(placed: list[JobPlaced]) -> list[JobReleased]:
        return [JobReleased(id=f"{p.job}/1/released", job=p.job, vc=p.vc, attempt=p.attempt) for p in placed]

    running: list[list[JobPlaced]] = []
    began = time.process_time()
    for first in range(0, jobs, batch):
        await shell.handle_batch(submitted[first:first + batch])
        running.append(ctx.bus.placed)
        ctx.bus.placed = []
        if len(running) > release_after and (ended := released(running.pop(0))):
            await shell.handle_batch(ended)
    ctx.bus.placed = [p for placed in running for p in placed]
    while ctx.bus.placed:
        ended, ctx.bus.placed = released(ctx.bus.placed), []
        await shell.handle_batch(ended)
    return (time.process_time() - began) / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--release-after", type=int, default=8, help="batches a placed job runs (scheduler)")
    parser.add_argument("--users", type=int, default=50, help="users whose jobs the scheduler gets, in turn")
    parser.add_argument("--young", type=int, default=None, help="gc threshold of the youngest generation")
    args = parser.parse_args()
    if args.young is not None:
        gc.set_threshold(args.young, *gc.get_threshold()[1:])
    result: dict = {"benchmark": "decide_cpu", "jobs": args.jobs, "batch": args.batch, "users": args.users,
                    "gc_threshold": list(gc.get_threshold())}
    for name, measure in (
        ("launcher", lambda: launcher_us_per_job(args.jobs, args.batch)),
        ("scheduler", lambda: asyncio.run(scheduler_us_per_job(args.jobs, args.batch, args.release_after, args.users))),
    ):
        runs = sorted(round(measure(), 1) for _ in range(args.runs))
        result[name] = {"us_per_job_median": statistics.median(runs), "runs": runs}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
