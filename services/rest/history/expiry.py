"""A finished job's live records leave the buckets once the history holds it; history
rows leave the database past the retention an admin sets.

Archiving (every `history_sweep_seconds`, on each rest replica; duplicates are
harmless): a job whose final state the projection has applied (`jobs.completed_at`),
not yet archived, that finished over `live_finished_job_seconds` ago -- or, while more
than `live_finished_job_max` finished jobs are live, one of the oldest-finished past
that many. Live records are so bounded by count as well as by time: however fast jobs
finish, each service holds at most that many finished jobs (plus what finished since
the last sweep, which runs every BUSY_SWEEP_SECONDS while it finds work).

A page of jobs at a time, each step for the whole page before the next:

1. its submission as accepted at intake (pai_jobs: config, warnings, tags; secrets
   masked) is copied into `jobs.submission`, so its reads answer the same from here;
2. `JobArchived` is published (id `<job>/archived/<submittedAt>`, deduplicated): each
   owner removes its live records of the job -- the scheduler pai_schedule, the
   launcher pai_job_status once its task files and logs are removed (retention);
3. rest purges its own record in pai_jobs (the one submitted then, not a later one),
   with a purge marker that expires after the event stream's duplicate window (Nats-TTL):
   the history holds the job's name from then on, so no marker of an archived job stays
   in the bucket, nor in the job index of a rest that starts later;
4. `jobs.archived_at` is set.

Each step is idempotent and the rows are marked last, so a crash anywhere means the next
sweep does the page again and changes nothing twice. A paused projection archives
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
from libs.common.jetstream_limits import marker_seconds
from libs.common.messages import JobArchived, JobState, job_archived_id
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest.history import schema
from services.rest.records import SubmittedJob

log = logging.getLogger("pai.rest.history")

PAGE = 200  # jobs archived, or purged, per query
# While a sweep finds jobs to archive (jobs finishing all the time), the next one comes this soon.
BUSY_SWEEP_SECONDS = 1.0
FINAL = tuple(state.value for state in JobState if state.is_final)
# A job's submission time in pai_jobs and in the history (float seconds, the same event).
SAME_SUBMISSION = 1e-6


def _live_finished() -> list[Any]:
    """A finished job the history holds whose live records are not archived yet."""
    jobs = schema.jobs
    return [jobs.c.archived_at.is_(None), jobs.c.completed_at.is_not(None), jobs.c.state.in_(FINAL),
            jobs.c.submitted_at.is_not(None)]


async def due_for_archive(engine: AsyncEngine, *, cutoff: float, limit: int = PAGE) -> list[Any]:
    """Finished jobs the history holds that finished before `cutoff`, not yet archived, oldest first."""
    jobs = schema.jobs
    query = (sa.select(jobs.c.id, jobs.c.vc, jobs.c.submitted_at, jobs.c.submission)
             .where(*_live_finished(), jobs.c.completed_at <= cutoff)
             .order_by(jobs.c.completed_at).limit(limit))
    async with engine.connect() as connection:
        return list((await connection.execute(query)).all())


async def count_cutoff(engine: AsyncEngine, *, keep: int) -> float | None:
    """The finish time at or before which archiving leaves at most `keep` finished jobs
    live (the newest-finished `keep` stay); None while no more than `keep` are live.
    One walk of ix_jobs_archive (archived_at, completed_at) over at most `keep` + 1
    entries: the live finished jobs, newest first."""
    jobs = schema.jobs
    query = (sa.select(jobs.c.completed_at).where(*_live_finished())
             .order_by(jobs.c.completed_at.desc()).offset(keep).limit(1))
    async with engine.connect() as connection:
        return (await connection.execute(query)).scalar()


async def _update_many(engine: AsyncEngine, rows: list[dict[str, Any]], **values: Any) -> None:
    """Set `values` (bound per row by name) on each job of `rows` ({"job", "at", ...})."""
    if not rows:
        return
    jobs = schema.jobs
    statement = (sa.update(jobs).where(jobs.c.id == sa.bindparam("job"), jobs.c.submitted_at == sa.bindparam("at"))
                 .values(**values))
    async with engine.begin() as connection:
        await connection.execute(statement, rows)


async def _submission_of(kv: Any, key: str) -> SubmittedJob | None:
    got = await get_json(kv, key, SubmittedJob)
    return None if got is None else got[0]


async def archive_page(ctx: ServiceContext, engine: AsyncEngine, rows: list[Any]) -> None:
    """Archive these jobs (due_for_archive's rows): the module's four steps, each for the
    whole page at once (reads and purges in flight together, one publish of every event,
    one transaction per update)."""
    if not rows:
        return
    kv = await ctx.bus.kv(Bucket.JOBS)
    keys = [ids.job_key(row.id) for row in rows]
    stored = await asyncio.gather(*(_submission_of(kv, key) for key in keys))
    # Ours: the record in pai_jobs is the one this row describes, not a later job of its name.
    ours = [got is not None and abs(got.submittedAt - row.submitted_at) <= SAME_SUBMISSION
            for row, got in zip(rows, stored, strict=True)]
    await _update_many(engine, [{"job": row.id, "at": row.submitted_at,
                                 "text": msgspec.json.encode(got).decode()}
                                for row, got, mine in zip(rows, stored, ours, strict=True)
                                if mine and row.submission is None],
                       submission=sa.bindparam("text"))
    await ctx.bus.publish_many([JobArchived(id=job_archived_id(row.id, row.submitted_at), job=row.id,
                                            vc=row.vc or "default", at=time.time(), submittedAt=row.submitted_at)
                                for row in rows])
    await _purge_records(ctx, [key for key, mine in zip(keys, ours, strict=True) if mine])
    await _update_many(engine, [{"job": row.id, "at": row.submitted_at} for row in rows], archived_at=time.time())


async def _purge_records(ctx: ServiceContext, keys: list[str]) -> None:
    """Their records leave pai_jobs, each purge marker expiring after a while
    (jetstream_limits.marker_seconds): the history holds the jobs and their names."""
    if keys:
        await ctx.bus.kv_write_many(Bucket.JOBS, dict.fromkeys(keys), gone_after=marker_seconds(ctx.config))


async def archive_due(ctx: ServiceContext, engine: AsyncEngine, *, now: float | None = None) -> int:
    """Archive every job due, by age or past the count bound; how many."""
    cutoff = (time.time() if now is None else now) - ctx.config.live_finished_job_seconds
    by_count = await count_cutoff(engine, keep=max(ctx.config.live_finished_job_max, 0))
    if by_count is not None:
        cutoff = max(cutoff, by_count)
    done = 0
    while True:
        rows = await due_for_archive(engine, cutoff=cutoff)
        await archive_page(ctx, engine, rows)
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
    """Archive and purge every `history_sweep_seconds` until `stopping` -- every
    BUSY_SWEEP_SECONDS while sweeps find jobs to archive, so that under load the count
    bound is passed by at most about that long's finished jobs; trouble waits for the
    next sweep."""
    while not stopping.is_set():
        archived = 0
        try:
            archived = await archive_due(ctx, engine)
            purged = await purge_expired(engine, retention_days=ctx.config.history_retention_days)
            if archived or purged:
                log.info("history: %d finished jobs archived (live records removed), %d past retention purged",
                         archived, purged)
        except asyncio.CancelledError:
            raise
        except (TimeoutError, SQLAlchemyError, OSError, Transient, nats.errors.Error, nats.js.errors.Error) as exc:
            log.warning("history sweep: %r; trying again at the next sweep", exc)
        pause = ctx.config.history_sweep_seconds
        if archived:
            pause = min(pause, BUSY_SWEEP_SECONDS)
        try:
            await asyncio.wait_for(stopping.wait(), pause)
        except TimeoutError:
            pass
