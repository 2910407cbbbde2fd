"""The cluster monitor's CPU per job, consuming real events from a real nats-server.

    python benchmarks/monitor_consume.py [--jobs 2000] [--rate 0] [--repeat 1]

Starts a nats-server (PAI's users and permissions, store bootstrapped) and the
cluster monitor as users run it (`python -m services.monitor --cluster`),
feeds it the events of `jobs` trivial one-task jobs (submitted, placed, task
started, running, task exited 0, succeeded, released: what rest, the
scheduler and the launcher publish for one; the runtime gives no verdict for
an exit 0), waits until the
monitor's durable consumer has acked them all, and reads the monitor's CPU
time (user + system, /proc) around that.

`--rate 0` publishes every event before the monitor starts (a backlog: the
largest batches); `--rate N` publishes N jobs' events a second while the
monitor runs (batches as the traffic makes them). The monitor's idle CPU
(its periodic node-health ticks and alert evaluations), measured for a few
seconds before the feed, is subtracted over the feed's duration and reported.

Prints JSON: monitor CPU ms per job and per event, idle CPU share, events.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.feeding import (  # noqa: E402
    cpu_seconds,
    idle_cpu_share,
    platform_nats,
    publish_all,
    service_process,
)
from libs.common.bus import STREAM, Bus  # noqa: E402
from libs.common.ids import EventId, JobId, NodeName, UserName, VcName  # noqa: E402
from libs.common.messages import (  # noqa: E402
    Event,
    ExitSpec,
    JobPlaced,
    JobReleased,
    JobState,
    JobStateChanged,
    JobSubmitted,
    TaskExited,
    TaskPlacement,
    TaskStarted,
)
from libs.common.protocol.model import JobSpec  # noqa: E402
from libs.common.subjects import Durable  # noqa: E402


def job_events(i: int, run: str, now: float) -> list[Event]:
    """The events one trivial job of one task produces, in the order they happen."""
    user, vc, node = f"u{i % 50}", f"vc{i % 4}", f"node-{i % 16}"
    job = JobId(f"{user}~bench{run}-{i}")
    spec = JobSpec(name=f"bench{run}-{i}", user=user, virtualCluster=vc)
    ok = ExitSpec(code=0, phrase="Succeeded", reason="exited with 0")
    common = {"job": job, "vc": VcName(vc), "attempt": 1}
    task = {**common, "role": "main", "index": 0}
    return [
        JobSubmitted(id=EventId(f"{job}/submitted"), job=job, at=now, spec=spec),
        JobPlaced(id=EventId(f"{job}/1/placed"), at=now, **common,
                  tasks=[TaskPlacement(role="main", index=0, node=NodeName(node), gpus=[0])]),
        TaskStarted(id=EventId(f"{job}/1/main/0/0/started"), at=now, node=NodeName(node), **task),
        JobStateChanged(id=EventId(f"{job}/1/state/RUNNING"), at=now, user=UserName(user), state=JobState.RUNNING,
                        previous=JobState.WAITING, sinceSubmit=0.05, **common),
        TaskExited(id=EventId(f"{job}/1/main/0/0/exited"), at=now, exitCode=0, **task),
        JobStateChanged(id=EventId(f"{job}/1/state/SUCCEEDED"), at=now, user=UserName(user), state=JobState.SUCCEEDED,
                        previous=JobState.RUNNING, exitCode=0, exitSpec=ok, sinceSubmit=0.1, **common),
        JobReleased(id=EventId(f"{job}/1/released"), at=now, **common),
    ]


async def publish_paced(bus: Bus, jobs: list[list[Event]], rate: float) -> None:
    started = time.monotonic()
    for n, events in enumerate(jobs):
        due = started + n / rate
        if (wait := due - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        await publish_all(bus, events)


async def wait_consumed(bus: Bus, last_seq: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit("the monitor exited")
        info = await bus.js.consumer_info(STREAM, Durable.MONITOR.value)
        if info.ack_floor.stream_seq >= last_seq and not info.num_ack_pending:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the monitor did not ack everything in {timeout}s: {info}")
        await asyncio.sleep(0.1)


async def measure(root: Path, jobs: int, rate: float, profile: str = "") -> dict:
    run = os.urandom(3).hex()
    now = time.time()
    per_job = [job_events(i, run, now) for i in range(jobs)]
    events = [e for job in per_job for e in job]
    async with platform_nats(root) as (nats, bus):
        if rate <= 0:
            await publish_all(bus, events)
        async with service_process(nats, root, "monitor", "--cluster") as (proc, _port):
            spy = None
            try:
                if profile:  # py-spy samples the monitor while it consumes (figures then include its pauses)
                    spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(proc.pid),
                                            "--format", "raw", "--rate", "200", "--nonblocking", "-o", profile],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                if rate <= 0:
                    # The backlog is being consumed already: measure idle CPU afterwards.
                    cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
                    info = await bus.js.stream_info(STREAM)
                    await wait_consumed(bus, info.state.last_seq, proc, timeout=60 + jobs * 0.05)
                    cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
                    idle_share = await idle_cpu_share(proc.pid)
                else:
                    await asyncio.sleep(1.0)  # let the consumer settle into its first pull
                    idle_share = await idle_cpu_share(proc.pid)
                    cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
                    await publish_paced(bus, per_job, rate)
                    info = await bus.js.stream_info(STREAM)
                    await wait_consumed(bus, info.state.last_seq, proc, timeout=60 + jobs * 0.05)
                    cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
            finally:
                if spy is not None:
                    spy.send_signal(2)
                    spy.wait(timeout=30)
    busy = max(0.0, (cpu1 - cpu0) - idle_share * (t1 - t0))
    return {
        "jobs": jobs,
        "events": len(events),
        "rate_jobs_per_s": rate or "backlog",
        "wall_s": round(t1 - t0, 3),
        "monitor_cpu_s": round(cpu1 - cpu0, 3),
        "idle_cpu_share": round(idle_share, 4),
        "monitor_cpu_ms_per_job": round(1000 * busy / jobs, 3),
        "monitor_cpu_us_per_event": round(1e6 * busy / len(events), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=0.0, help="jobs/s published live; 0: a backlog first")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--profile", default="", help="py-spy raw (collapsed) profile of the monitor to this file")
    args = parser.parse_args()
    results = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="pai-monitor-bench-") as tmp:
            results.append(asyncio.run(measure(Path(tmp), args.jobs, args.rate, args.profile)))
    per_job = sorted(r["monitor_cpu_ms_per_job"] for r in results)
    print(json.dumps({"benchmark": "monitor_consume", "runs": results,
                      "monitor_cpu_ms_per_job_median": per_job[len(per_job) // 2]}, indent=2))


if __name__ == "__main__":
    main()
