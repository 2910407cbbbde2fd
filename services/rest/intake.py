"""Job intake's second half: telling the platform about a recorded job.

Order, for crash safety: the record is created in pai_jobs first (the job exists
from then on; a second submission of the name is a 409 there), then
`JobSubmitted` is published with the deterministic id `<job>/submitted`
(JetStream stores a repeat once; the consumers are idempotent). Nothing is
written after the publish: two round trips per submission.

Submissions that arrive while others are being written are written together
(`Intake.submit`): their records created in one go, then their events published
in one go, each write's ack awaited on the bus's batch path (one reply
subscription, one timer per batch) instead of nats-py's per-request path. The
first submission after a quiet spell goes at once: gathering adds no wait. Each
submission is answered on its own, from its own writes' answers: a refused one
fails alone, and each keeps the order above (its record stored before its event).

Whether a record's `JobSubmitted` is out is not written down; it is known from
(`sweep_plan`, cheapest first):
- this process: it saw the publish stored (`Intake.published_here`), or
- the scheduler's or the launcher's document of the job (pai_schedule,
  pai_job_status, in the job index): they exist only once the event was consumed, or
- the event stream itself: the last message on the job's `job.submitted` subject
  (one lookup, for a record none of the above vouches for).
A record none of them vouches for -- rest died between the two steps, or the
publish was not answered in time -- is published again by the sweep, in every
rest replica, once it is `UNPUBLISHED_AFTER_SECONDS` old. The sweep walks the job
index's set of records not yet vouched for (every record the index loads or
changes enters it), so a restarted rest finds what its predecessor left half-done
as soon as its index is loaded, without reading every key. Two replicas sweeping
the same record publish it twice, stored once.

Records written before intake worked this way carry `published: true` and are
taken at their word. A record older than the event stream keeps events
(`max_age`) whose event is not there is not published again: its event may have
aged out, and the job long ended.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Container

import msgspec
import nats.errors
import nats.js.errors

from libs.common import ids
from libs.common.bus import store_is_full
from libs.common.errors import BadInput, Transient
from libs.common.jetstream_limits import store_settings
from libs.common.messages import JobSubmitted, subject_of
from libs.common.service import ServiceContext
from libs.common.subjects import STREAM, Bucket
from services.rest.job_index import JobIndex
from services.rest.records import SubmittedJob

log = logging.getLogger("pai.rest.intake")
_encoder = msgspec.json.Encoder()

# A submission waits for at most this many publish attempts (5 s each) before it is
# answered; past them the sweep takes over.
PUBLISH_ATTEMPTS = 2
# How long a record may stay unvouched for before the sweep looks it up and
# publishes it: longer than an intake in flight takes (so the sweep does not race it
# for nothing), short enough that a job whose publish timed out is scheduled in seconds.
UNPUBLISHED_AFTER_SECONDS = 5.0
SWEEP_SECONDS = 2.0
SWEEP_BATCH = 256  # records looked up per sweep at most; the next sweep takes the rest
# How long this process remembers a publish it saw stored, for the sweep to match
# with the record the index gets from its watch (milliseconds later). Forgetting
# one costs a lookup, never a wrong answer.
REMEMBER_PUBLISHED_SECONDS = 60.0


def submitted_event(record: SubmittedJob) -> JobSubmitted:
    return JobSubmitted(id=f"{record.job}/submitted", job=record.job, at=record.submittedAt, spec=record.spec)


def sweep_plan(index: JobIndex, published_here: Container[str], now: float, *,
               older_than: float = UNPUBLISHED_AFTER_SECONDS, kept_for: float = 0.0,
               limit: int = SWEEP_BATCH) -> tuple[list[str], list[str]]:
    """Of the index's records not yet vouched for: (those now known to be out or gone,
    those to look up in the event stream, oldest first, at most `limit`). Pure.

    `kept_for`: how long the event stream keeps events (0: for ever); a record older
    than that is known out (its event may have aged out)."""
    settled: list[str] = []
    to_check: list[tuple[float, str]] = []
    for key in index.unpublished:
        job = index.get(key)
        if job is None or job.brief.published or key in published_here or job.status is not None or job.schedule is not None:
            settled.append(key)
            continue
        age = now - job.brief.submittedAt
        if kept_for and age >= kept_for:
            settled.append(key)
        elif age >= older_than:
            to_check.append((job.brief.submittedAt, key))
    return settled, [key for _, key in sorted(to_check)[:limit]]


class _Submission:
    """One request's job record, encoded, and its answer once its writes are answered."""

    __slots__ = ("answer", "record", "value")

    def __init__(self, record: SubmittedJob):
        self.record = record
        # Encoded here, in the request's own call: a record that cannot be encoded fails
        # its own request, never the batch it would have joined. Its event too (the
        # bus encodes it again in the batch, where it must not fail).
        self.value = _encoder.encode(record)
        _encoder.encode(submitted_event(record))
        self.answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def succeed(self, published: bool) -> None:
        if not self.answer.done():  # a request gone meanwhile (its client left) has no one to answer
            self.answer.set_result(published)

    def fail(self, exc: BaseException) -> None:
        if not self.answer.done():
            self.answer.set_exception(exc)


class Intake:
    """One rest process's side of intake: publishing JobSubmitted, remembering what
    it saw stored, and the sweep that publishes what nobody vouches for."""

    def __init__(self, ctx: ServiceContext, index: JobIndex):
        self.ctx = ctx
        self.index = index
        self.published_here: dict[str, float] = {}  # record key -> when its publish was stored
        # Submissions waiting for the batch in flight to be written, and that batch's writer.
        self._gathered: list[_Submission] = []
        self._writer: asyncio.Future[None] | None = None
        events_max_age = store_settings(ctx.config).events.max_age_seconds
        # A margin under the stream's max_age: an event about to age out still counts.
        self.events_kept_for = events_max_age * 0.9 if events_max_age else 0.0

    async def submit(self, record: SubmittedJob) -> bool:
        """Create the job's record, then publish its JobSubmitted, together with the
        submissions that arrive meanwhile. True once both are stored; False when the
        record is stored but its publish was not answered (the sweep publishes it).

        Raises `KeyWrongLastSequenceError` when the job exists, and the bus's error
        when the record could not be stored (a timeout: it may be), or when the store
        refused the event for want of room (the record is then taken back, so the
        same submission may be sent again)."""
        try:
            submission = _Submission(record)
        except (UnicodeEncodeError, msgspec.EncodeError) as exc:  # validation refuses this first (protocol/encodable.py)
            raise BadInput(f"the job cannot be stored: {exc}") from None
        self._gathered.append(submission)
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_gathered())
        return await submission.answer

    async def _write_gathered(self) -> None:
        """Write what was gathered, batch after batch, until no submission waits."""
        batch: list[_Submission] = []
        try:
            while self._gathered:
                batch, self._gathered = [s for s in self._gathered if not s.answer.done()], []
                try:
                    await self._write_batch(batch)
                except Exception as exc:  # noqa: BLE001 - each waiting request answers with it
                    await self._write_alone(batch, exc)
        finally:
            # Cancelled (rest stopping): no submission is left waiting for an answer that never comes.
            for submission in [*batch, *self._gathered]:
                if not submission.answer.done():
                    submission.answer.cancel()
            self._gathered = []
            self._writer = None

    async def _write_alone(self, batch: list[_Submission], exc: Exception) -> None:
        """A batch failed as a whole: each submission not yet answered is written on its
        own, so that one request's failure (whatever it is) fails that request alone.
        A record the batch stored before failing is recognised as its own (`_write_batch`)."""
        waiting = [s for s in batch if not s.answer.done()]
        if len(batch) == 1:
            for submission in waiting:
                submission.fail(exc)
            return
        log.warning("a batch of %d submissions failed (%r); writing each of the %d unanswered alone",
                    len(batch), exc, len(waiting))

        async def alone(submission: _Submission) -> None:
            try:
                await self._write_batch([submission])
            except Exception as own:  # noqa: BLE001 - its request answers with it
                submission.fail(own)

        await asyncio.gather(*(alone(s) for s in waiting))

    async def _write_batch(self, batch: list[_Submission]) -> None:
        bus = self.ctx.bus
        keys = [ids.job_key(s.record.job) for s in batch]
        values = [s.value for s in batch]
        revisions = await bus.kv_create_each(Bucket.JOBS, list(zip(keys, values, strict=True)))
        existing = [i for i, revision in enumerate(revisions) if isinstance(revision, nats.js.errors.KeyWrongLastSequenceError)]
        if existing:
            # The key has a history: the job exists (a 409), or its record was deleted
            # (a submission taken back), which nats-py's create tells apart and re-creates.
            kv = await bus.kv(Bucket.JOBS)
            again = await asyncio.gather(*(kv.create(keys[i], values[i]) for i in existing), return_exceptions=True)
            for i, revision in zip(existing, again, strict=True):
                revisions[i] = revision
            # A record written by a batch that then failed, now written again alone: the
            # stored record is this very submission (same bytes, to its submission time), not a 409.
            for i in existing:
                if isinstance(revisions[i], nats.js.errors.KeyWrongLastSequenceError):
                    try:
                        entry = await kv.get(keys[i])
                    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                        continue
                    if entry.value == values[i] and entry.revision is not None:
                        revisions[i] = entry.revision
        created: list[tuple[_Submission, str, int]] = []
        for submission, key, value, revision in zip(batch, keys, values, revisions, strict=True):
            if isinstance(revision, BaseException):
                submission.fail(revision)
            else:
                self.index.put_submission(key, value)  # in this replica's list at once
                created.append((submission, key, revision))
        if not created:
            return
        outcomes = await bus.publish_each([submitted_event(s.record) for s, _, _ in created], attempts=PUBLISH_ATTEMPTS)
        refused: list[tuple[_Submission, str, int, BaseException]] = []
        for (submission, key, revision), failure in zip(created, outcomes, strict=True):
            if failure is None:
                self._published(key)
                submission.succeed(True)
            elif store_is_full(failure):
                # Refused for certain (not a timeout, after which it may be stored): the record is
                # taken back below, so the job is not left half-submitted.
                refused.append((submission, key, revision, failure))
            else:
                log.warning("submission of %s recorded; its publish was not answered (%r): the sweep retries it",
                            submission.record.job, failure)
                submission.succeed(False)
        if refused:
            kv = await bus.kv(Bucket.JOBS)
            deleted = await asyncio.gather(*(kv.delete(key, last=revision) for _, key, revision, _ in refused),
                                           return_exceptions=True)
            for (submission, key, _, failure), outcome in zip(refused, deleted, strict=True):
                if not isinstance(outcome, BaseException):
                    # Out of this replica's list before the request is answered, not when the watch
                    # brings the delete: a GET right after the refusal must not find the job. A record
                    # whose delete failed stays listed, so the sweep still publishes it.
                    self.index.delete_submission(key)
                submission.fail(failure)

    async def publish(self, record: SubmittedJob, *, attempts: int = PUBLISH_ATTEMPTS) -> None:
        """Publish the job's JobSubmitted; once stored, the job is out."""
        await self.ctx.bus.publish(submitted_event(record), attempts=attempts)
        self._published(ids.job_key(record.job))

    def _published(self, key: str) -> None:
        self.published_here.pop(key, None)  # kept in the order stored: the oldest are forgotten first
        self.published_here[key] = time.monotonic()
        self.index.unpublished.discard(key)

    async def sweep_once(self, now: float | None = None) -> int:
        """Settle the records the index has not seen vouched for; how many were published."""
        self._forget_old()
        if not self.index.ready:
            return 0
        settled, to_check = sweep_plan(self.index, self.published_here, time.time() if now is None else now,
                                       kept_for=self.events_kept_for)
        for key in settled:
            self.index.unpublished.discard(key)
            self.published_here.pop(key, None)
        outcomes = await asyncio.gather(*(self._settle(key) for key in to_check), return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise failed[0]
        return sum(1 for o in outcomes if o is True)

    async def _settle(self, key: str) -> bool:
        """Look the record's JobSubmitted up in the stream; publish it when it is not
        there. True when it was published here and now."""
        job = self.index.get(key)
        if job is None:  # deleted meanwhile (a refused submission taken back)
            self.index.unpublished.discard(key)
            return False
        record = job.record()
        event = submitted_event(record)
        try:
            await self.ctx.bus.js.get_last_msg(STREAM, subject_of(event))
        except nats.js.errors.NotFoundError:
            await self.publish(record, attempts=1)
            log.info("published the submission of %s, left unpublished since %.0f s", record.job,
                     time.time() - record.submittedAt)
            return True
        self.index.unpublished.discard(key)  # it is in the stream
        return False

    def _forget_old(self) -> None:
        horizon = time.monotonic() - REMEMBER_PUBLISHED_SECONDS
        while self.published_here:
            key, at = next(iter(self.published_here.items()))  # oldest first: insertion order
            if at >= horizon:
                break
            del self.published_here[key]

    async def run_sweep(self, stopping: asyncio.Event, every: float = SWEEP_SECONDS) -> None:
        """Sweep every `every` seconds until `stopping`; a failed sweep is tried again at the next."""
        while not stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), timeout=every)
                return
            except TimeoutError:
                pass
            try:
                await self.sweep_once()
            except asyncio.CancelledError:
                raise
            except (TimeoutError, Transient, nats.errors.Error, nats.js.errors.Error) as exc:
                log.warning("the sweep of unpublished submissions failed (%r); trying again in %.0f s", exc, every)
