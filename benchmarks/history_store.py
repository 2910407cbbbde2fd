"""History store size and apply rate: N synthetic jobs (each submitted, running, one
task started and exited, finished) through the projection path (services/rest/history:
project -> apply_batch, batches of 512 events as the consumer takes them) into the
embedded SQLite; prints JSON. `python benchmarks/history_store.py [jobs]`."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.rest.history import query, store  # noqa: E402
from services.rest.history.projection import project_batch  # noqa: E402
from tests.fixtures import history_events as ev  # noqa: E402

BATCH = 512


async def main(jobs: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="pai-history-bench-"))
    engine = await store.open_store(store.dsn_for("", root))
    events = []
    for i in range(jobs):
        events += ev.lifecycle(f"user{i % 50}~job{i:07d}", at=ev.T0 + i, exit_code=int(i % 10 == 0), vc=f"vc{i % 4}")
    numbered = list(enumerate(events, 1))
    started = time.perf_counter()
    for at in range(0, len(numbered), BATCH):
        batch = numbered[at:at + BATCH]
        await store.apply_batch(engine, project_batch(batch), batch[-1][0], len(batch))
    applied_s = time.perf_counter() - started
    list_started = time.perf_counter()
    total, _ = await query.list_jobs(engine, query.JobFilter(limit=20, user="user10", states=frozenset({"FAILED"})))
    list_ms = (time.perf_counter() - list_started) * 1000
    async with engine.connect() as connection:
        await connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    await engine.dispose()
    size = sum(p.stat().st_size for p in root.iterdir())
    return {"jobs": jobs, "events": len(events), "sqlite_bytes": size, "bytes_per_job": round(size / jobs),
            "events_per_s": round(len(events) / applied_s), "filtered_list_ms": round(list_ms, 1),
            "filtered_total": total}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000))))
