"""Finished jobs, held compactly: a launcher holds only live work whole.

A finished job's record (pai_job_status) is 15 KB and more; the launcher needs
it again only now and then: its logs read, its files pruned past the retention
age, the job deleted, a late event about it (a placement, a stop, a verdict
redelivered). So past `keep_seconds` after it finished it is held as a
`FinishedJob` (what the retention sweep decides from) and the shell reads the
record again from the bucket when it needs it whole.

At a restart the records are read in pages (`bus.read_pages`) and each is first
decoded as a `RecordSummary`, which reads a few fields only; a finished one
past `keep_seconds` is never decoded whole. The outbox of a finished job is
published again only when it may not have been (`replay_since`).

Pure: no I/O.
"""

from __future__ import annotations

import msgspec

from libs.common.messages import JobState
from libs.common.records import JobRecord


class _At(msgspec.Struct):
    at: float = 0.0


class RecordSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of a stored `JobRecord` a restore sorts records by."""

    job: str
    state: JobState = JobState.WAITING  # the record leaves its defaults out
    createdTime: float = 0.0
    completedTime: float | None = None
    logsPrunedAt: float | None = None
    archivedAt: float | None = None
    outbox: list[_At] = []

    @property
    def newest_event_at(self) -> float:
        return max((event.at for event in self.outbox), default=0.0)


class FinishedJob(msgspec.Struct, frozen=True, gc=False):
    """A finished job held compactly: what the retention sweep needs."""

    completedTime: float
    logsPrunedAt: float | None = None
    archivedAt: float | None = None  # the history holds it: the record goes with its logs


_summary_decoder = msgspec.json.Decoder(RecordSummary)


def summary_of(data: bytes) -> RecordSummary:
    """Raises msgspec.ValidationError/DecodeError on a value that is not a job record."""
    return _summary_decoder.decode(data)


def finished_job(record: JobRecord | RecordSummary) -> FinishedJob:
    return FinishedJob(completedTime=record.completedTime or record.createdTime, logsPrunedAt=record.logsPrunedAt,
                       archivedAt=record.archivedAt)


def held_whole(summary: RecordSummary, *, now: float, keep_seconds: float, replay_since: float) -> bool:
    """Whether a restored record is held whole: the job is live, finished less
    than `keep_seconds` ago, or its outbox is published again (`replay_since`)."""
    if not summary.state.is_final:
        return True
    finished = summary.completedTime or summary.createdTime
    return now - finished < keep_seconds or summary.newest_event_at >= replay_since


def replay_since(newest_event_at: float, margin_seconds: float) -> float:
    """From when a finished job's outbox may be unpublished: transactions run one
    after another, each published before the next is decided, so only the last
    one before a crash (its events the newest of every record) can be; `margin`
    covers the time one transaction's events were made over."""
    return newest_event_at - margin_seconds


def sheddable(record: JobRecord, *, now: float, keep_seconds: float) -> bool:
    """Whether a record the core holds whole may go to a `FinishedJob`."""
    return record.state.is_final and now - (record.completedTime or record.createdTime) >= keep_seconds
