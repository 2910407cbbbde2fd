"""Job list latency from the history database: N finished jobs seeded through the
projection path (services/rest/history: project -> apply_batch, as rest's consumer
does; benchmarks/history_store.py's synthetic lifecycles), plus LIVE unfinished jobs
only in rest's live index (laid over every page, as just submitted). Lists the first
page and each filter through rest's own code (jobs_api._list_from_history) REPS times,
idle and then busy (the projection applying more jobs' events meanwhile); prints JSON
with p50/p99 in ms. `python benchmarks/job_list.py [jobs] [reps]` (default 100000, 200;
1000000 takes several minutes to seed)."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec  # noqa: E402

from libs.common import ids  # noqa: E402
from services.rest import jobs_api  # noqa: E402
from services.rest.history import store  # noqa: E402
from services.rest.history.projection import project_batch  # noqa: E402
from services.rest.job_index import JobIndex  # noqa: E402
from services.rest.records import SubmittedJob  # noqa: E402
from tests.fixtures import history_events as ev  # noqa: E402

BATCH = 512
LIVE = 500  # unfinished jobs in the live index only
TAGGED_EVERY = 100
QUERIES = {
    "first_page": {"limit": "20"},
    "first_page_total": {"limit": "20", "withTotalCount": "true"},
    "user": {"username": "user10", "limit": "20"},
    "vc": {"vc": "vc2", "limit": "20"},
    "state": {"state": "FAILED", "limit": "20"},
    "keyword": {"keyword": "job00123", "limit": "20"},
    "tags": {"tags": "gold", "limit": "20"},
    "user_state": {"username": "user10", "state": "FAILED", "limit": "20"},
    "page_100": {"offset": "2000", "limit": "20"},
    "order_name": {"order": "name,ASC", "limit": "20"},
}


def _events(first: int, count: int) -> list:
    events = []
    for i in range(first, first + count):
        events += ev.lifecycle(f"user{i % 50}~job{i:07d}", at=ev.T0 + i, exit_code=int(i % 10 == 0), vc=f"vc{i % 4}")
    return events


async def _apply(engine, events: list, seq0: int) -> int:
    numbered = list(enumerate(events, seq0 + 1))
    for at in range(0, len(numbered), BATCH):
        batch = numbered[at:at + BATCH]
        await store.apply_batch(engine, project_batch(batch), batch[-1][0], len(batch))
        await asyncio.sleep(0)
    return seq0 + len(numbered)


def _live_index(jobs: int) -> JobIndex:
    index = JobIndex()
    for i in range(LIVE):
        jid = f"user{i % 50}~live{i:05d}"
        user, name = ids.split_job_id(jid)
        sub = SubmittedJob(job=jid, user=user, name=name, vc=f"vc{i % 4}", spec=ev.spec(jid), config={},
                           submittedAt=ev.T0 + jobs + i)
        index.put_submission(ids.job_key(jid), msgspec.json.encode(sub))
    index.ready = True
    return index


async def _measure(engine, index: JobIndex, reps: int) -> dict:
    out = {}
    for name, params in QUERIES.items():
        query = jobs_api.parse_list_query(params)
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            await jobs_api._list_from_history(engine, index, query)
            times.append((time.perf_counter() - started) * 1000)
        times.sort()
        out[name] = {"p50_ms": round(statistics.median(times), 2),
                     "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 2)}
    return out


async def main(jobs: int, reps: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="pai-job-list-bench-"))
    engine = await store.open_store(store.dsn_for("", root))
    started = time.perf_counter()
    seq = 0
    for first in range(0, jobs, 10_000):
        seq = await _apply(engine, _events(first, min(10_000, jobs - first)), seq)
    for i in range(0, jobs, TAGGED_EVERY):
        await store.set_tags(engine, f"user{i % 50}~job{i:07d}", ["gold"])
    seeded_s = time.perf_counter() - started
    index = _live_index(jobs)
    idle = await _measure(engine, index, reps)
    # Busy: the projection applying another 5,000 jobs' events (25,000) while the lists run.
    more = _events(jobs, 5_000)
    writer = asyncio.ensure_future(_apply(engine, more, seq))
    busy = await _measure(engine, index, max(reps // 4, 20))
    busy_writer_done = writer.done()
    await writer
    await engine.dispose()
    return {"jobs_in_history": jobs, "live_overlay_jobs": LIVE, "seed_s": round(seeded_s, 1), "reps": reps,
            "backend": "sqlite", "idle": idle, "busy": busy, "busy_writer_outlasted_lists": not busy_writer_done}


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(asyncio.run(main(int(args[0]) if args else 100_000, int(args[1]) if len(args) > 1 else 200))))
