"""Job intake's second half: telling the platform about a recorded job.

Order, for crash safety: the record is created in pai_jobs first (the job exists
from then on), then `JobSubmitted` is published with the deterministic id
`<job>/submitted` (JetStream stores a repeat once; the consumers are idempotent),
then the record is marked `published`. A record left unmarked -- rest died between
the steps, or the publish was not answered in time -- is published again:
- by the sweep, in every rest replica, once it has stayed unmarked for
  `UNPUBLISHED_AFTER_SECONDS`; it reads the job index's set of unmarked records,
  not every key, so it costs nothing while there are none;
- at start-up, by a scan of every record (the index is not loaded yet then).
Two replicas sweeping the same record publish it twice, stored once; the mark is
a compare-and-set, so one of them marks it.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
import nats.errors
import nats.js.errors

from libs.common import ids
from libs.common.bus import all_keys, get_json, store_is_full
from libs.common.errors import Transient
from libs.common.messages import JobSubmitted
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest.job_index import JobIndex
from services.rest.records import SubmittedJob

log = logging.getLogger("pai.rest.intake")

# A submission waits for at most this many publish attempts (5 s each) before it is
# answered; past them the sweep takes over.
PUBLISH_ATTEMPTS = 2
# How long a record may stay unmarked before the sweep publishes it: longer than an
# intake in flight takes (so the sweep does not race it for nothing), short enough
# that a job whose publish timed out is scheduled in seconds.
UNPUBLISHED_AFTER_SECONDS = 5.0
SWEEP_SECONDS = 2.0
SWEEP_BATCH = 256  # records published per sweep at most; the next sweep takes the rest


def submitted_event(record: SubmittedJob) -> JobSubmitted:
    return JobSubmitted(id=f"{record.job}/submitted", job=record.job, at=record.submittedAt, spec=record.spec)


async def publish_submitted(ctx: ServiceContext, record: SubmittedJob, revision: int, *,
                            attempts: int = PUBLISH_ATTEMPTS) -> None:
    """Publish the job's JobSubmitted, then mark its record (at `revision`) published."""
    await ctx.bus.publish(submitted_event(record), attempts=attempts)
    kv = await ctx.bus.kv(Bucket.JOBS)
    try:
        await kv.update(ids.job_key(record.job), msgspec.json.encode(msgspec.structs.replace(record, published=True)),
                        last=revision)
    except nats.js.errors.KeyWrongLastSequenceError:
        pass  # changed since (a tag, or another replica marked it): the event is out either way
    except nats.js.errors.APIError as exc:
        if not store_is_full(exc):
            raise
        # The event is out: the job is accepted. Left unmarked, the record is
        # published again by the sweep, which the event id makes harmless.
        log.warning("submission of %s published; marking it so failed: the store is full", record.job)


async def publish_pending_submissions(ctx: ServiceContext) -> int:
    """At start-up: publish every job whose intake was cut short (reads every record)."""
    kv = await ctx.bus.kv(Bucket.JOBS)
    count = 0
    for key in await all_keys(kv):
        got = await get_json(kv, key, SubmittedJob)
        if got is not None and not got[0].published:
            await publish_submitted(ctx, got[0], got[1])
            count += 1
    return count


def due_for_sweep(index: JobIndex, now: float, *, older_than: float = UNPUBLISHED_AFTER_SECONDS,
                  limit: int = SWEEP_BATCH) -> list[str]:
    """Keys of records unmarked for longer than `older_than` seconds, oldest first (pure)."""
    due = []
    for key in index.unpublished:
        job = index.get(key)
        if job is not None and not job.sub.published and now - job.sub.submittedAt >= older_than:
            due.append((job.sub.submittedAt, key))
    return [key for _, key in sorted(due)[:limit]]


async def sweep_once(ctx: ServiceContext, index: JobIndex, now: float | None = None) -> int:
    """Publish the records the index says are unmarked for too long; how many were."""
    if not index.ready:
        return 0
    kv = await ctx.bus.kv(Bucket.JOBS)
    count = 0
    for key in due_for_sweep(index, time.time() if now is None else now):
        got = await get_json(kv, key, SubmittedJob)  # the record as stored now, with its revision
        if got is None or got[0].published:
            continue
        await publish_submitted(ctx, got[0], got[1], attempts=1)
        log.info("published the submission of %s, left unpublished since %.0f s", got[0].job,
                 time.time() - got[0].submittedAt)
        count += 1
    return count


async def run_sweep(ctx: ServiceContext, index: JobIndex, stopping: asyncio.Event,
                    every: float = SWEEP_SECONDS) -> None:
    """Sweep every `every` seconds until `stopping`; a failed sweep is tried again at the next."""
    while not stopping.is_set():
        try:
            await asyncio.wait_for(stopping.wait(), timeout=every)
            return
        except asyncio.TimeoutError:
            pass
        try:
            await sweep_once(ctx, index)
        except asyncio.CancelledError:
            raise
        except (Transient, nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError) as exc:
            log.warning("the sweep of unpublished submissions failed (%r); trying again in %.0f s", exc, every)
