"""rest's intake sweep plan (pure): which records not yet vouched for are known to be
out, which must be looked up in the event stream, and which are left for later."""

from __future__ import annotations

import msgspec
import pytest

from libs.common.protocol.model import JobSpec
from services.rest.intake import sweep_plan
from services.rest.job_index import JobIndex, ScheduleBrief, StatusBrief
from services.rest.records import SubmittedJob

NOW = 10_000.0
WEEK = 7 * 24 * 3600.0


def record(name: str, *, age: float, published: bool = False) -> SubmittedJob:
    return SubmittedJob(job=f"alice~{name}", user="alice", name=name, vc="default",
                        spec=JobSpec(name=name, user="alice", taskRoles=[]), config={},
                        submittedAt=NOW - age, published=published)


def index_of(*records: SubmittedJob, status=(), schedule=()) -> JobIndex:
    index = JobIndex()
    for sub in records:
        index.put_submission(f"alice.{sub.name}", msgspec.json.encode(sub))
    for name in status:
        index.put_status(f"alice.{name}", StatusBrief())
    for name in schedule:
        index.put_schedule(f"alice.{name}", ScheduleBrief())
    return index


@pytest.mark.parametrize("sub,here,status,schedule,kept_for,expected", [
    (record("young", age=1), (), (), (), 0.0, "wait"),
    (record("old", age=6), (), (), (), 0.0, "look up"),
    (record("ownyoung", age=1), ("alice.ownyoung",), (), (), 0.0, "settled"),
    (record("ownold", age=60), ("alice.ownold",), (), (), 0.0, "settled"),
    (record("marked", age=60, published=True), (), (), (), 0.0, "settled"),
    (record("launched", age=60), (), ("launched",), (), 0.0, "settled"),
    (record("scheduled", age=60), (), (), ("scheduled",), 0.0, "settled"),
    (record("ancient", age=2 * WEEK), (), (), (), WEEK, "settled"),
    (record("ancient-kept", age=2 * WEEK), (), (), (), 0.0, "look up"),
], ids=["young-waits", "old-unknown-looked-up", "published-here-young", "published-here-old",
        "marked-by-older-intake", "launcher-has-it", "scheduler-has-it", "older-than-the-stream-keeps",
        "stream-keeps-for-ever"])
def test_plan(sub, here, status, schedule, kept_for, expected):
    index = index_of(sub, status=status, schedule=schedule)
    index.unpublished.add(f"alice.{sub.name}")  # listed, as a marked record was before its mark came
    settled, to_check = sweep_plan(index, set(here), NOW, kept_for=kept_for)
    key = f"alice.{sub.name}"
    got = "settled" if key in settled else "look up" if key in to_check else "wait"
    assert got == expected


def test_a_deleted_record_is_settled():
    index = index_of(record("gone", age=60))
    index.jobs.clear()  # deleted from the bucket, still listed as not vouched for
    settled, to_check = sweep_plan(index, set(), NOW)
    assert settled == ["alice.gone"] and to_check == []


def test_lookups_go_oldest_first_and_are_bounded():
    index = index_of(*(record(f"j{n}", age=10 + n) for n in range(10)))
    _, to_check = sweep_plan(index, set(), NOW, limit=3)
    assert to_check == ["alice.j9", "alice.j8", "alice.j7"]
