"""The history database at a million jobs (issue 32): store size per job, seed rate,
the job list's p50/p99 for the first page and each filter and order idle and busy,
and rest's restart to its first list answer.

Seeding goes through the projection's own code: tests/fixtures/history_events
lifecycles (submitted, running, a task started and exited, finished; a tenth fail)
-> projection.project_batch -> store.apply_batch, as rest's consumer applies them,
only in bigger batches (BULK events per transaction instead of the consumer's 512:
the bulk loader of the issue). Tags are not events: every 100th job gets "gold"
written as store.set_tags writes it (jobs.tags and job_tags), many jobs per
transaction. LIVE unfinished jobs are only in rest's live index (laid over every
page, as just submitted). `--jobs 100000` gives the list at a tenth of the size.

Lists run through rest's own list code (jobs_api._list_from_history, the route's
path with its X-Total-Count total), REPS times each:
- idle: nothing else running;
- busy: the projection applying BUSY_RATE jobs/s of new lifecycles (5-6 events each,
  in the consumer's 512-event batches) in a process of its own with its niceness
  raised, as rest runs it (services/rest/history/projector.py; before 9c47655 it ran
  on rest's event loop, and so did this benchmark's writer until 2026-11-28: the
  lists then waited for its CPU work, not only for the database).

The benchmark's process collects its garbage as rest does (young collections every
20,000 allocations, `service.collect_young_less_often`; until 2026-11-28 CPython's
default, whose full collections made most of the deep offsets' p99).

Restart: a fresh interpreter runs rest's start-up path on the seeded database
(store.open_store: engine, migrations; then the first list page) and reports each
step; the first run after a new migration includes the migration itself.

    python benchmarks/history_scale.py [--jobs 1000000] [--db PATH] [--reps 200]

--db keeps the database between runs (seeded once: a database that already holds
--jobs jobs is used as it is); without it a temporary one is made and removed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from libs.common import ids, service  # noqa: E402
from services.rest import jobs_api  # noqa: E402
from services.rest.history import schema, store  # noqa: E402
from services.rest.history.projection import project_batch  # noqa: E402
from services.rest.job_index import JobIndex  # noqa: E402
from services.rest.records import SubmittedJob  # noqa: E402
from tests.fixtures import history_events as ev  # noqa: E402

BULK = 8192  # events per transaction while seeding
CONSUMER_BATCH = 512  # the consumer's batch (busy load)
CHUNK = 20_000  # jobs whose events are built at a time
LIVE = 500
TAGGED_EVERY = 100
BUSY_RATE = 100  # jobs/s while busy
USERS, VCS = 50, 4

QUERIES = {
    "first_page": {"limit": "20"},
    "first_page_total": {"limit": "20", "withTotalCount": "true"},
    "user": {"username": "user10", "limit": "20"},
    "vc": {"vc": "vc2", "limit": "20"},
    "state": {"state": "FAILED", "limit": "20"},
    "state_running": {"state": "RUNNING", "limit": "20"},
    "tags": {"tags": "gold", "limit": "20"},
    "tags_not": {"tagsNotContain": "gold", "limit": "20"},
    "keyword": {"keyword": "job00123", "limit": "20"},
    "keyword_user": {"keyword": "user10~", "limit": "20"},
    "user_state": {"username": "user10", "state": "FAILED", "limit": "20"},
    "page_100": {"offset": "2000", "limit": "20"},
    "offset_100k": {"offset": "100000", "limit": "20"},
    "oldest_first": {"order": "createdTime,ASC", "limit": "20"},
    "order_completed": {"order": "completedTime,DESC", "limit": "20"},
    "order_name": {"order": "name,ASC", "limit": "20"},
    "order_user": {"order": "username,ASC", "limit": "20"},
    "order_vc": {"order": "vc", "limit": "20"},
    "order_state": {"order": "state", "limit": "20"},
    "order_retries": {"order": "retries", "limit": "20"},
    "order_gpu": {"order": "totalGpuNumber", "limit": "20"},
    "order_tasks": {"order": "totalTaskNumber", "limit": "20"},
    "order_priority": {"order": "priority", "limit": "20"},
}
# Time range: the API's list has no time filter; the history query has one (JobFilter
# submitted_from/until): measured on query.list_jobs directly, with its total.
TIME_RANGE_S = 86_400  # the newest day of the seeded jobs


def _job(i: int) -> str:
    return f"user{i % USERS}~job{i:07d}"


def _events(first: int, count: int) -> list:
    events = []
    for i in range(first, first + count):
        events += ev.lifecycle(_job(i), at=ev.T0 + i, exit_code=int(i % 10 == 0), vc=f"vc{i % VCS}")
    return events


async def _apply(engine, events: list, seq0: int, batch_size: int) -> int:
    numbered = list(enumerate(events, seq0 + 1))
    for at in range(0, len(numbered), batch_size):
        batch = numbered[at:at + batch_size]
        await store.apply_batch(engine, project_batch(batch), batch[-1][0], len(batch))
        await asyncio.sleep(0)
    return seq0 + len(numbered)


async def _tag(engine, first: int, count: int) -> None:
    """store.set_tags' rows for the tagged jobs of [first, first + count), in one transaction."""
    tagged = [_job(i) for i in range(first, first + count) if i % TAGGED_EVERY == 0]
    if not tagged:
        return
    async with engine.begin() as connection:
        await connection.execute(sa.update(schema.jobs).where(schema.jobs.c.id == sa.bindparam("key"))
                                 .values(tags=json.dumps(["gold"])), [{"key": j} for j in tagged])
        await connection.execute(sa.insert(schema.job_tags), [{"job": j, "tag": "gold"} for j in tagged])


async def _jobs_in(engine) -> int:
    async with engine.connect() as connection:
        return (await connection.execute(sa.select(sa.func.count()).select_from(schema.jobs))).scalar_one()


async def seed(engine, jobs: int, have: int) -> dict:
    started = time.perf_counter()
    seq, _ = await store.progress(engine)
    events = 0
    for first in range(have, jobs, CHUNK):
        count = min(CHUNK, jobs - first)
        chunk = _events(first, count)
        events += len(chunk)
        seq = await _apply(engine, chunk, seq, BULK)
        await _tag(engine, first, count)
        if (first // CHUNK) % 10 == 9:
            print(f"seeded {first + count} jobs, {time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)
    took = time.perf_counter() - started
    return {"seeded_jobs": jobs - have, "seeded_events": events, "seed_s": round(took, 1),
            "seed_jobs_per_s": round((jobs - have) / took) if took else None,
            "seed_events_per_s": round(events / took) if took else None}


def _live_index(jobs: int) -> JobIndex:
    index = JobIndex()
    for i in range(LIVE):
        jid = f"user{i % USERS}~live{i:05d}"
        user, name = ids.split_job_id(jid)
        sub = SubmittedJob(job=jid, user=user, name=name, vc=f"vc{i % VCS}", spec=ev.spec(jid), config={},
                           submittedAt=ev.T0 + jobs + i)
        index.put_submission(ids.job_key(jid), msgspec.json.encode(sub))
    index.ready = True
    return index


def _stats(times: list[float], cpu: list[float]) -> dict:
    """Wall-clock p50/p99/max, and the process's CPU time per list (every thread: aiosqlite
    runs SQLite in its own), which a loaded machine inflates far less than wall time."""
    times.sort()
    return {"p50_ms": round(statistics.median(times), 2),
            "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 2),
            "max_ms": round(times[-1], 2), "cpu_p50_ms": round(statistics.median(cpu), 2)}


async def _measure(engine, index: JobIndex, reps: int, jobs: int, only: set[str] | None) -> dict:
    from services.rest.history import query as history_query

    out = {}
    for name, params in QUERIES.items():
        if only and name not in only:
            continue
        query = jobs_api.parse_list_query(params)
        await jobs_api._list_from_history(engine, index, query)  # SQLAlchemy compiles each statement once per process
        times, cpu = [], []
        for _ in range(reps):
            started, cpu_started = time.perf_counter(), time.process_time()
            await jobs_api._list_from_history(engine, index, query)
            times.append((time.perf_counter() - started) * 1000)
            cpu.append((time.process_time() - cpu_started) * 1000)
        out[name] = _stats(times, cpu)
    if not only or "time_range" in only:
        found = history_query.JobFilter(submitted_from=ev.T0 + jobs - TIME_RANGE_S, submitted_until=ev.T0 + jobs,
                                        limit=20)
        times, cpu = [], []
        for _ in range(reps):
            started, cpu_started = time.perf_counter(), time.process_time()
            await history_query.list_jobs(engine, found)
            times.append((time.perf_counter() - started) * 1000)
            cpu.append((time.process_time() - cpu_started) * 1000)
        out["time_range"] = _stats(times, cpu)
    return out


async def _busy_writer(engine, first: int, seq: int, stop) -> int:
    """BUSY_RATE jobs/s of lifecycles, applied in the consumer's batches, until `stop` is set."""
    i = first
    started = time.perf_counter()
    while not stop.is_set():
        due = int((time.perf_counter() - started) * BUSY_RATE)
        if i - first < due:
            count = due - (i - first)
            seq = await _apply(engine, _events(i, count), seq, CONSUMER_BATCH)
            i += count
        await asyncio.sleep(0.05)
    return i - first


def _busy_process(dsn: str, first: int, seq: int, stop, written) -> None:
    """The busy writer as rest runs its projection (services/rest/history/projector.py):
    a process of its own, its niceness raised by `history_projection_nice`, its own
    engine on the same database. Lists wait for the database, never for its CPU work."""
    from libs.common.config import Config

    os.nice(Config().history_projection_nice)

    async def run() -> None:
        engine = store.open_engine(dsn)
        written.value = await _busy_writer(engine, first, seq, stop)
        await engine.dispose()

    asyncio.run(run())


def _restart(dsn: str) -> dict:
    """rest's start-up path in a fresh interpreter: open_store (engine + migrations), first page."""
    code = f"""
import asyncio, json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from services.rest import jobs_api
from services.rest.history import store
from services.rest.job_index import JobIndex
imported = time.perf_counter()
async def main():
    engine = await store.open_store({dsn!r})
    opened = time.perf_counter()
    index = JobIndex(); index.ready = True
    total, page, _ = await jobs_api._list_from_history(engine, index, jobs_api.parse_list_query({{"limit": "20"}}))
    listed = time.perf_counter()
    await engine.dispose()
    print(json.dumps({{"import_s": round(imported - t0, 2), "open_and_migrate_s": round(opened - imported, 2),
                       "first_list_s": round(listed - opened, 3), "total_s": round(listed - t0, 2),
                       "listed_total": total}}))
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


async def main(args) -> dict:
    temporary = args.db is None
    path = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="pai-history-scale-")) / store.SQLITE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    dsn = f"sqlite+aiosqlite:///{path.resolve()}"
    out: dict = {"jobs": args.jobs, "backend": f"sqlite {__import__('sqlite3').sqlite_version}", "live_overlay": LIVE}
    try:
        if path.exists():
            out["restart_before"] = _restart(dsn)  # a new migration runs here, on the seeded database
        engine = await store.open_store(dsn)
        have = await _jobs_in(engine)
        if have > args.jobs:
            raise SystemExit(f"{path} holds {have} jobs, more than --jobs {args.jobs}")
        if have < args.jobs:
            out["seed"] = await seed(engine, args.jobs, have)
        async with engine.connect() as connection:
            await connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            pages = [(await connection.exec_driver_sql(f"PRAGMA {name}")).scalar_one()
                     for name in ("page_count", "freelist_count", "page_size")]
        # In use (free pages of deleted rows, e.g. a previous run's busy jobs, are not the history's).
        size = (pages[0] - pages[1]) * pages[2]
        out["store_bytes"] = size
        out["file_bytes"] = sum(p.stat().st_size for p in path.parent.iterdir() if p.name.startswith(path.name))
        out["bytes_per_job"] = round(size / args.jobs)
        if args.seed_only:
            await engine.dispose()
            return out
        only = set(args.only.split(",")) if args.only else None
        index = _live_index(args.jobs)
        out["idle"] = await _measure(engine, index, args.reps, args.jobs, only)
        if not args.idle_only:
            seq, _ = await store.progress(engine)
            spawn = multiprocessing.get_context("spawn")
            stop, written = spawn.Event(), spawn.Value("q", 0)
            writer = spawn.Process(target=_busy_process, args=(dsn, 10_000_000 + args.jobs, seq, stop, written))
            writer.start()
            started = time.perf_counter()
            out["busy"] = await _measure(engine, index, args.busy_reps or max(args.reps // 2, 20), args.jobs, only)
            stop.set()
            await asyncio.to_thread(writer.join, 120)
            out["busy_writer_jobs_per_s"] = round(written.value / (time.perf_counter() - started), 1)
            out["busy_writer"] = "a process of its own, niced as rest's projection"
            # Leave the database as seeded: the busy jobs go (their ids are past the seeded ones).
            async with engine.begin() as connection:
                busy = sa.and_(schema.jobs.c.id >= "user", schema.jobs.c.name >= "job1")
                for table in (schema.events, schema.tasks, schema.attempts, schema.job_tags):
                    await connection.execute(sa.delete(table).where(table.c.job.in_(
                        sa.select(schema.jobs.c.id).where(busy))))
                await connection.execute(sa.delete(schema.jobs).where(busy))
        await engine.dispose()
        if not args.no_restart:
            out["restart"] = _restart(dsn)
    finally:
        if temporary:
            shutil.rmtree(path.parent, ignore_errors=True)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--db", help="the SQLite file to keep between runs (seeded when it holds fewer jobs)")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--busy-reps", type=int, default=0)
    parser.add_argument("--only", help="comma-separated query names")
    parser.add_argument("--idle-only", action="store_true")
    parser.add_argument("--no-restart", action="store_true")
    parser.add_argument("--seed-only", action="store_true", help="seed (and size) the database, measure nothing")
    # The collector as rest runs it (services/rest/service.py): with CPython's default
    # young threshold the lists met full collections of this process's objects, 85 ms
    # of offset 100,000's p99 (35 ms at rest's setting, 33 with no collector at all).
    service.collect_young_less_often()
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=1))
    os._exit(0)
