"""rest's CPU per KV write it watches: what each pai_job_status and pai_schedule write
costs rest's job index (services/rest/job_index.py), apart from any HTTP request. Prints JSON.

Starts nats-server and rest alone (as benchmarks/api_load.py does, `--stored` jobs in
the buckets), then writes `--writes` launcher statuses (JobRecord documents, as the
launcher writes them, in batches of `--batch`) and as many scheduler entries, and
reads rest's and nats-server's CPU time (utime+stime) before and after. The CPU rest
spends idle over the same time is measured first and taken off.

    python benchmarks/rest_watch_load.py [--stored 1000] [--writes 20000] [--batch 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.api_load import USERS, nats_with_stored_jobs, running_rest
from benchmarks.feeding import cpu_seconds
from benchmarks.jobs import trivial_job
from libs.common import ids
from libs.common.bus import Bus
from libs.common.messages import JobState
from libs.common.protocol import parse_job
from libs.common.records import JobRecord, encode_job_record
from libs.common.schedule import ScheduleEntry
from libs.common.subjects import Bucket

SETTLE_SECONDS = 1.0


async def write_all(bus: Bus, stored: int, writes: int, batch: int) -> None:
    spec = parse_job(trivial_job("template"), content_type="text/yaml", user="user0").spec
    states = [JobState.WAITING, JobState.RUNNING, JobState.SUCCEEDED]
    for start in range(0, writes, batch):
        statuses, entries = {}, {}
        for n in range(start, min(writes, start + batch)):
            job = n % stored
            user, name = USERS[job % len(USERS)], f"stored-{job}"
            jid, key = ids.job_id(user, name), ids.job_key(ids.job_id(user, name))
            record = JobRecord(job=jid, name=name, user=user, vc="default", spec=spec, state=states[n % 3],
                               createdTime=time.time())
            statuses[key] = encode_job_record(record)
            entries[key] = msgspec.json.encode(ScheduleEntry(job=jid, vc="default", attempt=1, spec=spec,
                                                             reason=f"waiting {n}", updatedAt=time.time()))
        await bus.kv_write_many(Bucket.JOB_STATUS, statuses)
        await bus.kv_write_many(Bucket.SCHEDULE, entries)


async def run(args) -> dict:
    async with nats_with_stored_jobs(args.stored, "watch-load") as stored, \
            await_closing(await Bus.connect(stored.nats.url, name="watch-writer",
                                            **stored.nats.login("platform"))) as bus:
        with running_rest(stored) as rest:
            await asyncio.sleep(2.0)  # the index loaded
            pid, nats_pid = rest.proc.pid, stored.nats.pid
            idle_before = cpu_seconds(pid)
            await asyncio.sleep(SETTLE_SECONDS)
            idle = cpu_seconds(pid) - idle_before
            before, nats_before, began = cpu_seconds(pid), cpu_seconds(nats_pid), time.perf_counter()
            await write_all(bus, args.stored, args.writes, args.batch)
            wrote = time.perf_counter() - began
            await asyncio.sleep(SETTLE_SECONDS)
            rest_cpu = cpu_seconds(pid) - before - idle * (wrote + SETTLE_SECONDS) / SETTLE_SECONDS
            nats_cpu = cpu_seconds(nats_pid) - nats_before
    deliveries = 2 * args.writes
    return {
        "benchmark": "rest_watch_load", "stored_jobs": args.stored, "kv_writes": deliveries, "batch": args.batch,
        "write_seconds": round(wrote, 2),
        "rest_cpu_us_per_write": round(rest_cpu * 1e6 / deliveries, 1),
        "nats_cpu_us_per_write": round(nats_cpu * 1e6 / deliveries, 1),
    }


class await_closing:
    def __init__(self, bus: Bus):
        self.bus = bus

    async def __aenter__(self) -> Bus:
        return self.bus

    async def __aexit__(self, *_) -> None:
        await self.bus.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stored", type=int, default=1000)
    parser.add_argument("--writes", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=50)
    print(json.dumps(asyncio.run(run(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
