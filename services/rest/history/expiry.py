"""A finished job's live records leave the buckets once the history holds it; history
rows leave the database past the retention an admin sets.

Archiving (every `history_sweep_seconds`, on each rest replica; duplicates are
harmless): a job whose final state the projection has applied (`jobs.completed_at`)
and that finished over `live_finished_job_seconds` ago, not yet archived:

1. its submission as accepted at intake (pai_jobs: config, warnings, tags; secrets
   masked) is copied into `jobs.submission`, so its reads answer the same from here;
2. `JobArchived` is published (id `<job>/archived/<submittedAt>`, deduplicated): each
   owner removes its live records of the job -- the scheduler pai_schedule, the
   launcher pai_job_status once its task files and logs are removed (retention);
3. rest purges its own record in pai_jobs (the one submitted then, not a later one);
4. `jobs.archived_at` is set.

Each step is idempotent and the row is marked last, so a crash anywhere means the next
sweep does the job again and changes nothing twice. A paused projection archives
nothing: the jobs table has no final state for a job it has not applied.

pai_secrets is kept: the launcher scrubs an archived job's logs with them until its
retention removes the logs; JobDeleted removes them.

Retention (`history_retention_days`, 0: forever): an archived job that finished longer
ago leaves every history table, in pages.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from libs.common import ids
from libs.common.bus import get_json
from libs.common.errors import Transient
from libs.common.messages import JobArchived, JobState, job_archived_id
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest.history import schema
from services.rest.records import SubmittedJob

log = logging.getLogger("pai.rest.history")

PAGE = 200  # jobs archived, or purged, per query
FINAL = tuple(state.value for state in JobState if state.is_final)
# A job's submission time in pai_jobs and in the history (float seconds, the same event).
SAME_SUBMISSION = 1e-6


async def due_for_archive(engine: AsyncEngine, *, cutoff: float, limit: int = PAGE) -> list[Any]:
    """Finished jobs the history holds that finished before `cutoff`, not yet archived."""
    jobs = schema.jobs
    query = (sa.select(jobs.c.id, jobs.c.vc, jobs.c.submitted_at, jobs.c.submission)
             .where(jobs.c.archived_at.is_(None), jobs.c.completed_at.is_not(None), jobs.c.completed_at <= cutoff,
                    jobs.c.state.in_(FINAL), jobs.c.submitted_at.is_not(None))
             .order_by(jobs.c.completed_at).limit(limit))
    async with engine.connect() as connection:
        return list((await connection.execute(query)).all())


async def _update(engine: AsyncEngine, job: str, submitted_at: float, **values: Any) -> None:
    jobs = schema.jobs
    async with engine.begin() as connection:
        await connection.execute(sa.update(jobs).where(jobs.c.id == job, jobs.c.submitted_at == submitted_at)
                                 .values(**values))


async def archive_one(ctx: ServiceContext, engine: AsyncEngine, row: Any) -> None:
    job, submitted_at = row.id, row.submitted_at
    key = ids.job_key(job)
    kv = await ctx.bus.kv(Bucket.JOBS)
    got = await get_json(kv, key, SubmittedJob)
    ours = got is not None and abs(got[0].submittedAt - submitted_at) <= SAME_SUBMISSION
    if ours and row.submission is None:
        assert got is not None
        await _update(engine, job, submitted_at, submission=msgspec.json.encode(got[0]).decode())
    await ctx.bus.publish(JobArchived(id=job_archived_id(job, submitted_at), job=job, vc=row.vc or "default",
                                      at=time.time(), submittedAt=submitted_at))
    if ours:
        try:
            await kv.purge(key)
        except nats.js.errors.NotFoundError:
            pass
    await _update(engine, job, submitted_at, archived_at=time.time())


async def archive_due(ctx: ServiceContext, engine: AsyncEngine, *, now: float | None = None) -> int:
    """Archive every job due; how many."""
    cutoff = (time.time() if now is None else now) - ctx.config.live_finished_job_seconds
    done = 0
    while True:
        rows = await due_for_archive(engine, cutoff=cutoff)
        for row in rows:
            await archive_one(ctx, engine, row)
        done += len(rows)
        if len(rows) < PAGE:
            return done


async def purge_expired(engine: AsyncEngine, *, retention_days: float, now: float | None = None) -> int:
    """Remove the archived jobs that finished over `retention_days` ago (0: none) from every
    table; how many."""
    if retention_days <= 0:
        return 0
    cutoff = (time.time() if now is None else now) - retention_days * 86400.0
    jobs = schema.jobs
    done = 0
    while True:
        async with engine.begin() as connection:
            ids_ = list((await connection.execute(
                sa.select(jobs.c.id).where(jobs.c.completed_at.is_not(None), jobs.c.completed_at < cutoff,
                                           jobs.c.archived_at.is_not(None)).limit(PAGE))).scalars())
            if not ids_:
                return done
            for table in (schema.events, schema.tasks, schema.attempts, schema.job_tags):
                await connection.execute(sa.delete(table).where(table.c.job.in_(ids_)))
            await connection.execute(sa.delete(jobs).where(jobs.c.id.in_(ids_)))
        done += len(ids_)


async def run(ctx: ServiceContext, engine: AsyncEngine, stopping: asyncio.Event) -> None:
    """Archive and purge every `history_sweep_seconds` until `stopping`; trouble waits for the next sweep."""
    while not stopping.is_set():
        try:
            archived = await archive_due(ctx, engine)
            purged = await purge_expired(engine, retention_days=ctx.config.history_retention_days)
            if archived or purged:
                log.info("history: %d finished jobs archived (live records removed), %d past retention purged",
                         archived, purged)
        except asyncio.CancelledError:
            raise
        except (SQLAlchemyError, OSError, Transient, nats.errors.Error, nats.js.errors.Error,
                asyncio.TimeoutError) as exc:
            log.warning("history sweep: %r; trying again at the next sweep", exc)
        try:
            await asyncio.wait_for(stopping.wait(), ctx.config.history_sweep_seconds)
        except asyncio.TimeoutError:
            pass
