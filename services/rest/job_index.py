"""rest's in-memory index of every job, for `GET /api/v2/jobs` without reading every key.

Fed by KV watches on the three buckets a job row is made of (pai_jobs: the
submission, pai_job_status: the launcher's state, pai_schedule: why it waits).
It is a cache, never a store: it starts empty, is rebuilt from the buckets by the
watches' initial values, and is not used until all three have delivered them;
when the NATS connection comes back after a break, the watches are started
again from scratch (a restarted NATS forgets their consumers). While it is not
ready, the list reads the buckets as before. Nothing is written from here, so a
crash loses nothing.

Only what a list row needs is kept decoded per job: a brief of the submission
(name, VC, tags, task counts) and of the status and schedule documents. The
submission itself is kept as stored (its JSON), decoded when one job is read
(`IndexedJob.record`): the watch then decodes a fraction of each record (msgspec
skips the fields a brief has not), and the index holds a handful of objects per
job, none of which the cyclic garbage collector has to walk (a rest holding ten
thousand jobs spent a tenth of its CPU in full collections walking their
decoded records and documents).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import nats.js.api

from libs.common.bus import KV_TTL_HEADER, Bus, keep_watching
from libs.common.messages import JobState
from libs.common.protocol.model import DEFAULT_PRIORITY_CLASS, PRIORITY_CLASSES
from libs.common.subjects import Bucket
from services.rest.records import SubmittedJob

log = logging.getLogger("pai.rest.index")

# A watch's consumer, as nats-py's KV watch makes it: forgotten by the server this long after its subscriber is gone.
WATCH_INACTIVE_SECONDS = 300.0
# How a KV bucket shows on the bus (the JetStream KV convention nats-py's KeyValue follows too).
KV_SUBJECT_PREFIX = "$KV."
KV_OPERATION_HEADER = "KV-Operation"
KV_DELETIONS = ("DEL", "PURGE")
KV_MARKER_HEADER = "Nats-Marker-Reason"
KV_MARKER_DELETIONS = ("MaxAge", "Purge", "Remove")
# Results remembered between changes (orders, filtered lists): any query string makes one.
MAX_MEMOS = 128


# The briefs and index entries below hold no reference back to anything that holds
# them (no cycle), so they are left out of the cyclic garbage collector (gc=False).


class StatusBrief(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The fields of a `JobRecord` a list row shows (msgspec skips the rest while decoding)."""

    state: JobState = JobState.WAITING
    stopRequestedBy: str | None = None
    retries: int = 0
    completedTime: float | None = None
    appExitCode: int | None = None
    attempt: int = 1


class ScheduleBrief(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The fields of a `ScheduleEntry` a list row shows."""

    attempt: int = 1
    placed: bool = False
    reason: str = ""


class GpusBrief(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    gpu: int = 0


class RoleBrief(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    instances: int = 1
    resources: GpusBrief = GpusBrief()


class SpecBrief(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    priority: int = PRIORITY_CLASSES[DEFAULT_PRIORITY_CLASS]
    taskRoles: tuple[RoleBrief, ...] = ()

    @property
    def task_count(self) -> int:
        return sum(r.instances for r in self.taskRoles)


class SubmissionBrief(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The fields of a `SubmittedJob` a list row shows and the sweep reads, in its shape
    (a row is made of either: views.job_summary), with the same defaults."""

    job: str
    user: str
    name: str
    vc: str
    spec: SpecBrief
    submittedAt: float
    published: bool = False
    tags: tuple[str, ...] = ()


_SUBMISSION = msgspec.json.Decoder(SubmissionBrief)
_RECORD = msgspec.json.Decoder(SubmittedJob)
_STATUS = msgspec.json.Decoder(StatusBrief)
_SCHEDULE = msgspec.json.Decoder(ScheduleBrief)


class IndexedJob(msgspec.Struct, kw_only=True, gc=False):
    brief: SubmissionBrief
    stored: bytes  # the submission as in pai_jobs
    status: StatusBrief | None = None
    schedule: ScheduleBrief | None = None
    row: Any = None  # the list row, made when first listed and dropped at every change

    def record(self) -> SubmittedJob:
        """The whole submission, decoded now (one job's answer, the sweep)."""
        return _RECORD.decode(self.stored)


def _finished(job: IndexedJob) -> bool:
    return job.status is not None and job.status.state.is_final


class _Order:
    """The jobs in one row field's order, kept sorted as rows change (bisect, no re-sort):
    rows with the field ascending by (value, job id), rows without it by job id. Descending
    is the first part read backwards, then the second (jobs_api.order_jobs: unset last)."""

    def __init__(self, field: str, rows: Iterator[tuple[str, Any]]) -> None:
        self.field = field
        self.present: list[tuple[Any, str, str]] = []  # (value, job id, KV key)
        self.missing: list[tuple[str, str]] = []  # (job id, KV key)
        for key, row in rows:
            entry = self._entry(key, row)
            (self.present if len(entry) == 3 else self.missing).append(entry)  # type: ignore[arg-type]
        self.present.sort()
        self.missing.sort()

    def _entry(self, key: str, row: Any) -> tuple:
        value = getattr(row, self.field)
        return (row.debugId, key) if value is None else (value, row.debugId, key)

    def add(self, key: str, row: Any) -> None:
        entry = self._entry(key, row)
        bisect.insort(self.present if len(entry) == 3 else self.missing, entry)  # type: ignore[type-var]

    def remove(self, key: str, row: Any) -> None:
        entry = self._entry(key, row)
        rows: list = self.present if len(entry) == 3 else self.missing
        at = bisect.bisect_left(rows, entry)
        if at < len(rows) and rows[at] == entry:
            del rows[at]

    def keys(self, descending: bool) -> list[str] | Iterator[str]:
        present = reversed(self.present) if descending else iter(self.present)
        yield from (entry[2] for entry in present)
        yield from (entry[1] for entry in self.missing)


class OrderedView:
    """The index's (submission brief, row) pairs in one order, read lazily: a page is a
    slice of the sorted keys (jobs_api.select_jobs), not a copy of every row."""

    def __init__(self, index: JobIndex, order: _Order, descending: bool) -> None:
        self.index, self.order, self.descending = index, order, descending

    def __len__(self) -> int:
        return len(self.order.present) + len(self.order.missing)

    def _pair(self, key: str) -> tuple[Any, Any]:
        job = self.index.jobs[key]
        return job.brief, job.row

    def __iter__(self):
        for key in self.order.keys(self.descending):
            yield self._pair(key)

    def __getitem__(self, part: slice) -> list[tuple[Any, Any]]:
        start, stop, _ = part.indices(len(self))
        present, missing = self.order.present, self.order.missing
        out = []
        for i in range(start, stop):
            if i < len(present):
                entry = present[len(present) - 1 - i] if self.descending else present[i]
                out.append(self._pair(entry[2]))
            else:
                out.append(self._pair(missing[i - len(present)][1]))
        return out


class Unsettled:
    """Keys whose row the history database may not have as the index has it, in the order
    they last changed: the settling compares those quiet for a while (a job still
    changing would only be compared again), the list overlays every one."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}  # key -> when it last changed (monotonic), oldest first

    def add(self, key: str) -> None:
        self._since.pop(key, None)  # to the end: the newest change
        self._since[key] = time.monotonic()

    def discard(self, key: str) -> None:
        self._since.pop(key, None)

    def clear(self) -> None:
        self._since.clear()

    def quiet(self, seconds: float) -> list[str]:
        """The keys unchanged for `seconds` or more, oldest change first."""
        cutoff = time.monotonic() - seconds
        out = []
        for key, since in self._since.items():
            if since > cutoff:
                break
            out.append(key)
        return out

    def __contains__(self, key: object) -> bool:
        return key in self._since

    def __iter__(self) -> Iterator[str]:
        return iter(self._since)

    def __len__(self) -> int:
        return len(self._since)


class JobIndex:
    def __init__(self) -> None:
        self.jobs: dict[str, IndexedJob] = {}  # by KV key user.name
        # Keys whose row the history database may not have as it is here (changed since it was
        # last found equal there, or deleted): the list overlays them on the database's page.
        self.unsettled = Unsettled()
        # The orders asked for so far, kept sorted through every change (and the row maker
        # they were built with: jobs_api.job_row over the briefs).
        self._orders: dict[str, _Order] = {}
        self._make_row: Callable[[IndexedJob], Any] | None = None
        # Keys of submissions not yet marked published (their JobSubmitted may not be on the bus).
        self.unpublished: set[str] = set()
        # Status and schedule documents may arrive before their submission.
        self._status: dict[str, StatusBrief] = {}
        self._schedule: dict[str, ScheduleBrief] = {}
        self.ready = False
        # Per user: (jobs stored, bytes of their records), for the per-user quotas (services/rest/quotas.py).
        self.usage: dict[str, tuple[int, int]] = {}
        # Per user: how many of those jobs have finished, so that a refusal past the stored-jobs
        # quota can say whether finished jobs fill it (they leave by themselves) or a queue does.
        self.finished: dict[str, int] = {}
        # Keys of jobs deleted (their records purged: services/rest/deletion.py) -> when, for the
        # wait before their name is used again. Submissions taken back are deletes, not purges.
        self.purged: dict[str, float] = {}
        self._generation = 0
        # Bumped at every change; what `memo` computed for an older version is computed again.
        self.version = 0
        self._memo: dict[Any, tuple[int, Any]] = {}

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """`compute()`, remembered until the index next changes (e.g. the jobs in one order,
        or those one filter matches); at most MAX_MEMOS results, the oldest forgotten first."""
        got = self._memo.get(key)
        if got is not None and got[0] == self.version:
            return got[1]
        value = compute()
        self._memo.pop(key, None)
        while len(self._memo) >= MAX_MEMOS:
            del self._memo[next(iter(self._memo))]
        self._memo[key] = (self.version, value)
        return value

    def ordered(self, field: str, descending: bool, make_row: Callable[[IndexedJob], Any]) -> OrderedView:
        """Every job in the order of the row field `field`; sorted once, then kept sorted."""
        order = self._orders.get(field)
        if order is None:
            self._make_row = make_row
            for job in self.jobs.values():
                if job.row is None:
                    job.row = make_row(job)
            order = self._orders[field] = _Order(field, ((key, job.row) for key, job in self.jobs.items()))
        return OrderedView(self, order, descending)

    def _unlist(self, key: str, job: IndexedJob | None) -> None:
        """Take the job's current row out of the kept orders (before it changes)."""
        if job is not None and self._orders and job.row is not None:
            for order in self._orders.values():
                order.remove(key, job.row)

    def _relist(self, key: str, job: IndexedJob) -> None:
        """Put the job's new row into the kept orders (after it changed)."""
        job.row = None
        if self._orders and self._make_row is not None:
            job.row = self._make_row(job)
            for order in self._orders.values():
                order.add(key, job.row)

    # --- applying one KV entry (pure; the watches call these) -------------------------------

    def get(self, key: str) -> IndexedJob | None:
        return self.jobs.get(key)

    def put_submission(self, key: str, stored: bytes) -> None:
        """The submission of `key` as stored in pai_jobs (raises msgspec.DecodeError when unreadable)."""
        brief = _SUBMISSION.decode(stored)
        self.purged.pop(key, None)
        old = self.jobs.get(key)
        self._count(old, -1)
        self._unlist(key, old)
        self.jobs[key] = job = IndexedJob(brief=brief, stored=stored, status=self._status.get(key),
                                          schedule=self._schedule.get(key))
        self._count(job, 1)
        self._relist(key, job)
        self.unsettled.add(key)
        if brief.published:
            self.unpublished.discard(key)
        else:
            self.unpublished.add(key)
        self.version += 1

    def put_status(self, key: str, status: StatusBrief | None) -> None:
        self._put_side(key, status, self._status, "status")

    def put_schedule(self, key: str, schedule: ScheduleBrief | None) -> None:
        self._put_side(key, schedule, self._schedule, "schedule")

    def delete_submission(self, key: str) -> None:
        self.unpublished.discard(key)
        job = self.jobs.pop(key, None)
        if job is not None:
            self._count(job, -1)
            self._unlist(key, job)
            finished = job.status is not None and job.status.state.is_final
            if key in self.purged or not finished:
                # Deleted by its owner, or an unfinished job's record gone: the history may
                # still list it, the list's overlay hides it.
                self.unsettled.add(key)
            else:  # a finished job's records expired from the buckets: the history has it
                self.unsettled.discard(key)
            self.version += 1

    def _count(self, job: IndexedJob | None, sign: int) -> None:
        if job is not None:
            user = job.brief.user
            count, total = self.usage.get(user, (0, 0))
            if count + sign <= 0:
                self.usage.pop(user, None)
            else:
                self.usage[user] = (count + sign, total + sign * len(job.stored))
            if _finished(job):
                self._count_finished(user, sign)

    def _count_finished(self, user: str, change: int) -> None:
        left = self.finished.get(user, 0) + change
        if left <= 0:
            self.finished.pop(user, None)
        else:
            self.finished[user] = left

    def _put_side(self, key: str, value, store: dict, field: str) -> None:
        if value is None:
            store.pop(key, None)
        else:
            store[key] = value
        job = self.jobs.get(key)
        if job is not None:
            self._unlist(key, job)
            was_finished = _finished(job)
            setattr(job, field, value)
            if _finished(job) != was_finished:
                self._count_finished(job.brief.user, -1 if was_finished else 1)
            self._relist(key, job)
            self.unsettled.add(key)
            self.version += 1

    # --- the watches ---------------------------------------------------------------------

    async def run(self, bus: Bus, stopping: asyncio.Event) -> None:
        """Keep the index current until `stopping`; rebuild after every reconnect."""
        watchers: list[_Watch] = []

        async def start(connection: int) -> list[_Watch]:
            self._reset()
            watchers[:] = await self._start(bus)
            loaded = [asyncio.ensure_future(w.initial.wait()) for w in watchers]
            try:
                await asyncio.wait_for(asyncio.gather(*loaded), timeout=60)
            except BaseException:
                for watcher in watchers:  # not yet the loop's to stop
                    await watcher.stop()
                raise
            self.ready = True
            log.info("job index ready: %d jobs", len(self.jobs))
            return list(watchers)

        def ended() -> None:
            self.ready = False

        await keep_watching(bus, "the job index's buckets", stopping, start=start,
                            standing=lambda: all(not w.done for w in watchers), ended=ended)

    def _reset(self) -> None:
        self.jobs.clear()
        self.usage.clear()
        self.finished.clear()
        self.purged.clear()
        self.unpublished.clear()
        self.unsettled.clear()
        self._orders.clear()
        self._status.clear()
        self._schedule.clear()
        self._memo.clear()
        self._generation += 1
        self.version += 1

    async def _start(self, bus: Bus) -> list[_Watch]:
        generation = self._generation

        def submissions(key: str, raw: bytes | None) -> None:
            if raw is None:
                self.delete_submission(key)
            else:
                self.put_submission(key, raw)

        def statuses(key: str, raw: bytes | None) -> None:
            self.put_status(key, None if raw is None else _STATUS.decode(raw))

        def schedules(key: str, raw: bytes | None) -> None:
            self.put_schedule(key, None if raw is None else _SCHEDULE.decode(raw))

        watches: list[_Watch] = []
        try:
            for bucket, apply in ((Bucket.JOBS, submissions), (Bucket.JOB_STATUS, statuses),
                                  (Bucket.SCHEDULE, schedules)):
                on_purge = self.purged.__setitem__ if bucket is Bucket.JOBS else None
                watches.append(await _Watch.start(bus, bucket, apply, lambda: self._generation == generation,
                                                  on_purge=on_purge))
        except BaseException:
            for watch in watches:  # those started before one failed are not the caller's to stop
                await watch.stop()
            raise
        return watches


class _Watch:
    """One bucket's watch, applying each entry; `initial` is set once the bucket's values are in.

    The same ordered push consumer `KeyValue.watchall()` makes (every key's last
    value, then every change; nats-py restarts it on a gap), but each message is
    applied as nats-py's read loop hands it over (`Link.apply_on_arrival`; on the fast link): no
    `KeyValue.Entry`, no queue and no task hop per message, and the reply
    subject's metadata is parsed only until the initial values are in (only
    their pending count is needed). rest receives about seven of these per job
    (its own records back, the launcher's statuses, the scheduler's entries).
    """

    def __init__(self, prefix: str, apply: Callable[[str, bytes | None], None], current: Callable[[], bool],
                 on_purge: Callable[[str, float], None] | None = None):
        self.prefix = prefix
        self.on_purge = on_purge
        self.apply = apply
        self.current = current
        self.initial = asyncio.Event()
        self.done = False
        self.sub = None
        self.applier = None  # what applies the messages as they come (the bus's link)

    @classmethod
    async def start(cls, bus: Bus, bucket: Bucket, apply, current, on_purge=None) -> _Watch:
        watch = cls(f"{KV_SUBJECT_PREFIX}{bucket.value}.", apply, current, on_purge)
        watch.sub = await bus.js.subscribe(
            f"{watch.prefix}>", stream=f"KV_{bucket.value}", ordered_consumer=True,
            deliver_policy=nats.js.api.DeliverPolicy.LAST_PER_SUBJECT, inactive_threshold=WATCH_INACTIVE_SECONDS)
        watch.applier = bus.link.apply_on_arrival(watch.sub, watch._on_message)
        await asyncio.sleep(0)
        try:
            info = await watch.sub.consumer_info()
        except BaseException:
            await watch.stop()
            raise
        # An empty bucket: nothing will say so. What the server sent counts, not what
        # was read yet (a message on its way would be applied after "initial").
        if info.num_pending == 0 and info.delivered.consumer_seq == 0:
            watch.initial.set()
        return watch

    def _on_message(self, msg) -> None:
        if not self.current():
            return
        loading = not self.initial.is_set()
        headers = msg.headers
        deleted = not msg.data
        if headers:
            operation = headers.get(KV_OPERATION_HEADER)
            if operation is not None:
                deleted = deleted or operation in KV_DELETIONS
                # A purge marker with a TTL is the history's expiry archiving a finished job
                # (services/rest/history/expiry.py; a deletion's has none): the history holds the
                # job and its name, so it is no deletion to remember (`purged`).
                if operation == "PURGE" and self.on_purge is not None and KV_TTL_HEADER not in headers:
                    self.on_purge(msg.subject[len(self.prefix):], msg.metadata.timestamp.timestamp())
            elif KV_MARKER_HEADER in headers:  # a marker the server placed (nats-server 2.11+)
                reason = headers[KV_MARKER_HEADER]
                if reason not in KV_MARKER_DELETIONS:
                    if loading and msg.metadata.num_pending == 0:
                        self.initial.set()
                    return  # a marker this version does not know: no change of value
                deleted = True
        try:
            self.apply(msg.subject[len(self.prefix):], None if deleted else msg.data)
        except msgspec.DecodeError as exc:  # a value this version cannot read: skip it, loudly
            log.error("job index: cannot decode %s: %s", msg.subject, exc)
        if loading and msg.metadata.num_pending == 0:
            self.initial.set()

    async def stop(self) -> None:
        self.done = True
        if self.applier is not None:
            await self.applier.unsubscribe()
        if self.sub is None:
            return
        try:
            await self.sub.unsubscribe()
        except Exception as exc:  # the connection may be gone already
            log.debug("stopping a watch: %r", exc)

