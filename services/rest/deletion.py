"""Deleting a finished job: DELETE /api/v2/jobs/{user}~{name} (OpenPAI has none).

Only its owner or an admin, only once it is finished (else 409 naming its state: stop
it first). rest publishes `JobDeleted` (id `<job>/deleted/<submittedAt>`, deduplicated)
and every owner removes its own records of the job, driven by that event on its
durable consumer: rest pai_jobs and pai_secrets, the launcher pai_job_status and the
task files and logs, the scheduler pai_schedule. Each handler is idempotent and acks
after its deletes, so a crash midway converges when the service is back. rest also
removes its records at once in the request, so the answer is true when it comes.

A job whose live records expired (archived: services/rest/history/expiry.py) is
deleted the same way, found in the history database: the same event (the launcher may
still hold its record and logs until retention; rest its secrets), and rest removes
its history rows at once (the projection's JobDeleted removes them again, finding none).

The record in pai_jobs is purged, not deleted: every rest replica's job index sees
the purge and when it happened. Until the event stream's duplicate window has passed
since then, the name is not used again (a 409 says until when): a new job's events
(`<job>/1/placed`, ...) would have the ids of the old job's, and JetStream would drop
them as repeats.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import nats.errors
import nats.js.errors

from libs.common import ids
from libs.common.bus import get_json
from libs.common.errors import Conflict, Transient
from libs.common.jetstream_limits import store_settings
from libs.common.messages import JobDeleted, job_deleted_id
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket, Durable, Kind
from services.rest import job_ssh
from services.rest.job_index import JobIndex
from services.rest.records import SubmittedJob

log = logging.getLogger("pai.rest.deletion")


def deleted_event(sub: SubmittedJob, by: str) -> JobDeleted:
    return JobDeleted(id=job_deleted_id(sub.job, sub.submittedAt), job=sub.job, vc=sub.vc, by=by, at=time.time(),
                      submittedAt=sub.submittedAt)


async def remove_records(ctx: ServiceContext, job: str, submitted_at: float) -> bool:
    """rest's records of the job submitted at `submitted_at` (not of a later one of its
    name): its secrets, then its record, purged. Whether its record was there.

    An archived job has no record left (expiry purged it) but keeps its secrets (the
    launcher scrubs its logs with them until retention): they go now."""
    key = ids.job_key(job)
    jobs = await ctx.bus.kv(Bucket.JOBS)
    got = await get_json(jobs, key, SubmittedJob)
    if got is not None and abs(got[0].submittedAt - submitted_at) > 1e-6:
        return False  # a later job of its name: the secrets are that job's
    secrets = await ctx.bus.kv(Bucket.SECRETS)
    try:
        await secrets.purge(key)
    except nats.js.errors.NotFoundError:
        pass
    await job_ssh.forget(ctx.bus, job)  # the ssh plugin's key pair kept for the owner, where it has one
    if got is None:
        return False
    await jobs.purge(key)
    return True


def name_reuse_refusal(ctx: ServiceContext, index: JobIndex | None, jid: str, now: float) -> Conflict | None:
    """The 409 for a submission reusing the name of a job deleted too recently, or None."""
    if index is None:
        return None
    purged_at = index.purged.get(ids.job_key(jid))
    if purged_at is None:
        return None
    window = store_settings(ctx.config).events.duplicate_window_seconds
    free_at = purged_at + window
    if now >= free_at:
        return None
    return Conflict(f"job {jid} was deleted {now - purged_at:.0f} s ago; its name can be used again in "
                    f"{free_at - now:.0f} s (PAI tells a job's events apart by name for {window:.0f} s); "
                    "or submit it under another name",
                    details={"retryAfterSeconds": round(free_at - now, 1)})


async def handle_deleted(ctx: ServiceContext, events: Sequence[JobDeleted]) -> None:
    """rest's durable consumer of job.deleted: its own records of each deleted job."""
    for event in events:
        if await remove_records(ctx, event.job, event.submittedAt):
            log.info("removed the records of %s (deleted by %s)", event.job, event.by, extra={"job": event.job})


async def consume(ctx: ServiceContext, stopping: asyncio.Event) -> None:
    """Run rest's job.deleted consumer until `stopping`; started again after NATS trouble."""
    while not stopping.is_set():
        try:
            await ctx.bus.consume_batches(Durable.REST, [Kind.JOB_DELETED], (JobDeleted,),
                                          lambda events: handle_deleted(ctx, events), stopping=stopping)
        except asyncio.CancelledError:
            raise
        except (TimeoutError, Transient, nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            log.warning("the job.deleted consumer stopped (%r); starting it again", exc)
            await asyncio.sleep(1.0)
