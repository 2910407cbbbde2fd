"""Reads of a job whose live records left the buckets (services/rest/history/expiry.py):
from the history database, in the shapes the bucket reads give, so a user sees the same.

- the submission: `jobs.submission`, the record pai_jobs held (config, warnings, tags;
  secrets masked), copied there before it was purged;
- the launcher's record while it is still in pai_job_status (it stays until retention
  removes the job's logs); past that, a record made from the history's rows: state,
  times, exit code, retries, and each attempt with its tasks.

Hooks: `jobs_api.read_job` when a job is not in pai_jobs, and intake's name check
(`holds`): a name the history holds is still taken. Deleting and tagging such a job
(`archived`, `change_tags`): the history is its only record in rest then.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec
import sqlalchemy as sa
from aiohttp import web
from sqlalchemy.exc import SQLAlchemyError

from libs.common import ids
from libs.common.bus import get_json
from libs.common.errors import Transient
from libs.common.messages import JobState, TaskState
from libs.common.protocol.model import JobSpec
from libs.common.records import AttemptRecord, JobRecord, TaskRecord
from libs.common.subjects import Bucket
from services.rest.history import schema, store as history_store
from services.rest.history.wiring import HISTORY
from services.rest.records import SubmittedJob
from services.rest.request import ctx_of

log = logging.getLogger("pai.rest.history")


def _engine(app: web.Application):
    history = app.get(HISTORY)
    return history.engine if history is not None else None


async def _job_row(engine, jid: str) -> Any:
    async with engine.connect() as connection:
        return (await connection.execute(sa.select(schema.jobs).where(schema.jobs.c.id == jid))).first()


async def _archived_row(app: web.Application, jid: str) -> Any:
    """The history's row of `jid` if the job is archived (its live records gone); None
    where it is not, or the history is not open or failed to answer."""
    engine = _engine(app)
    if engine is None:
        return None
    try:
        row = await _job_row(engine, jid)
    except SQLAlchemyError:
        return None
    return row if row is not None and row.archived_at is not None else None


def _submission(row: Any) -> SubmittedJob | None:
    """The job as accepted at intake, its tags as the database has them now (they change
    after archiving: `change_tags`); from its spec where the record was never copied."""
    sub = _submitted(row)
    if sub is None:
        return None
    try:
        tags = msgspec.json.decode(row.tags or "[]", type=list[str])
    except (msgspec.ValidationError, msgspec.DecodeError):
        return sub
    return msgspec.structs.replace(sub, tags=tags)


def _submitted(row: Any) -> SubmittedJob | None:
    if row.submission:
        try:
            return msgspec.json.decode(row.submission, type=SubmittedJob)
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass
    if not row.spec or row.submitted_at is None:
        return None
    spec = msgspec.json.decode(row.spec, type=JobSpec)
    return SubmittedJob(job=row.id, user=row.user, name=row.name, vc=row.vc, spec=spec,
                        config=msgspec.json.decode(row.spec), submittedAt=row.submitted_at)


async def _record_from_rows(engine, row: Any, sub: SubmittedJob) -> JobRecord:
    async with engine.connect() as connection:
        attempts = (await connection.execute(sa.select(schema.attempts).where(schema.attempts.c.job == row.id)
                                             .order_by(schema.attempts.c.attempt))).all()
        tasks = (await connection.execute(sa.select(schema.tasks).where(schema.tasks.c.job == row.id)
                                          .order_by(schema.tasks.c.attempt, schema.tasks.c.role, schema.tasks.c.idx,
                                                    schema.tasks.c.task_attempt))).all()
    by_attempt: dict[int, dict[tuple[str, int], TaskRecord]] = {}
    for t in tasks:  # the last task attempt of each task
        by_attempt.setdefault(t.attempt, {})[(t.role, t.idx)] = TaskRecord(
            role=t.role, index=t.idx, taskAttempt=t.task_attempt, state=TaskState(t.state), node=t.node,
            launchedTime=t.started_at, completedTime=t.completed_at, exitCode=t.exit_code)
    records = [AttemptRecord(attempt=a.attempt, state=JobState(a.state), createdTime=a.created_at or 0.0,
                             launchedTime=a.started_at, completedTime=a.completed_at, exitCode=a.exit_code,
                             tasks=list(by_attempt.get(a.attempt, {}).values()))
               for a in attempts]
    return JobRecord(job=row.id, name=row.name, user=row.user, vc=row.vc, spec=sub.spec, state=JobState(row.state),
                     createdTime=row.submitted_at or 0.0, launchedTime=row.started_at, completedTime=row.completed_at,
                     attempt=row.attempt, retries=row.retries, attempts=records, appExitCode=row.exit_code,
                     stopRequestedBy=row.stop_requested_by)


async def read(request: web.Request, jid: str) -> tuple[SubmittedJob, JobRecord | None] | None:
    """The job from the history, or None where the history has no such job (or is not open)."""
    row = await _archived_row(request.app, jid)
    if row is None:  # not archived: its live records are the truth
        return None
    sub = _submission(row)
    if sub is None:
        return None
    got = await get_json(await ctx_of(request).bus.kv(Bucket.JOB_STATUS), ids.job_key(jid), JobRecord)
    if got is not None and abs(got[0].createdTime - sub.submittedAt) <= 1e-3:
        return sub, got[0]
    return sub, await _record_from_rows(_engine(request.app), row, sub)


async def holds(request: web.Request, jid: str) -> bool:
    """Whether the history holds a job of this id whose live records left the buckets
    (its name is taken until it is deleted, or retention removes it)."""
    engine = _engine(request.app)
    if engine is None:
        return False
    history = request.app[HISTORY]
    lookups = history.hold_lookups
    if lookups is None or lookups.engine is not engine:
        lookups = history.hold_lookups = _HoldLookups(engine)
    # The embedded database answers at once, on this thread: no task, no turn of the loop
    # (on a busy loop each turn is milliseconds, and a submission took three).
    found = lookups.local.archived_among([jid])
    if found is not None:
        return jid in found
    try:
        return await lookups.archived(jid)
    except SQLAlchemyError:
        return False


class _HoldLookups:
    """Every submission asks whether its name is an archived job's. The embedded SQLite
    answers each on the loop's thread (`local`); through the engine (PostgreSQL), the
    submissions waiting at one moment are answered by one query for their ids alone
    (one each, reading whole rows, cost rest more CPU than the rest of a submission)."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.local = history_store.LocalReads(engine)
        self._waiting: dict[str, list[asyncio.Future[bool]]] = {}
        self._asking: asyncio.Task[None] | None = None

    async def archived(self, jid: str) -> bool:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(jid, []).append(future)
        if self._asking is None:
            self._asking = asyncio.create_task(self._ask())
        return await future

    async def _ask(self) -> None:
        await asyncio.sleep(0)  # those arriving in this turn of the loop join
        while self._waiting:
            waiting, self._waiting = self._waiting, {}
            try:
                found = await history_store.archived_among(self.engine, list(waiting))
            except BaseException as exc:
                for futures in waiting.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(exc if isinstance(exc, Exception) else SQLAlchemyError(repr(exc)))
                if not isinstance(exc, Exception):
                    self._asking = None
                    raise
                continue
            for jid, futures in waiting.items():
                for future in futures:
                    if not future.done():
                        future.set_result(jid in found)
        self._asking = None


async def archived(app: web.Application, jid: str) -> tuple[SubmittedJob, str] | None:
    """An archived job's submission and its tags as `jobs.tags` reads now (for a
    compare-and-set), or None where the history has no archived job of this id."""
    row = await _archived_row(app, jid)
    if row is None:
        return None
    sub = _submission(row)
    return (sub, row.tags) if sub is not None else None


async def change_tags(app: web.Application, jid: str, tags: list[str], expected: str) -> bool:
    """An archived job's tags set, where they still read `expected`; False: changed meanwhile."""
    engine = _engine(app)
    if engine is None:
        return False
    try:
        return await history_store.replace_tags(engine, jid, expected, tags)
    except (SQLAlchemyError, OSError) as exc:
        raise Transient(f"the job history database did not take the tags of {jid} ({exc.__class__.__name__}); "
                        "try again") from None


async def delete(request: web.Request, sub: SubmittedJob) -> bool:
    """An archived job's rows leave the history at once (the projection's JobDeleted
    removes them again when it comes: nothing then)."""
    engine = _engine(request.app)
    if engine is None:
        return False
    try:
        return await history_store.delete_job(engine, sub.job, sub.submittedAt)
    except (SQLAlchemyError, OSError) as exc:  # the projection's JobDeleted removes them
        log.warning("the history rows of %s not removed yet (%r)", sub.job, exc, extra={"job": sub.job})
        return False
