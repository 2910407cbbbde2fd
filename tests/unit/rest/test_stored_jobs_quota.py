"""The stored-jobs quota (pure): a refusal says how many of the user's stored jobs have
finished, and tells them what would free room: deleting finished jobs (which also leave
by themselves), or, when every one is waiting or running, stopping some; and the job
index keeps that count through every change of its entries."""

from __future__ import annotations

import msgspec
import pytest

from libs.common.config import Config
from libs.common.errors import QuotaExceeded
from libs.common.messages import JobState
from libs.common.protocol.model import JobSpec
from services.rest.job_index import JobIndex, StatusBrief
from services.rest.quotas import check_stored_jobs
from services.rest.records import SubmittedJob

CONFIG = Config(rest_user_max_jobs=3, live_finished_job_seconds=1800.0)


@pytest.mark.parametrize("jobs,finished,says,remedy_says", [
    (3, None, "alice has 3 jobs stored, the most", "delete finished jobs"),
    (3, 0, "alice has 3 jobs stored (0 finished)", "none of them has finished: stop jobs"),
    (3, 2, "alice has 3 jobs stored (2 finished)", "leave the count by themselves, about 30 minutes"),
    (5, 5, "alice has 5 jobs stored (5 finished)", "delete finished jobs"),
])
def test_a_refusal_says_how_many_finished_and_what_frees_room(jobs, finished, says, remedy_says):
    with pytest.raises(QuotaExceeded) as refused:
        check_stored_jobs(CONFIG, "alice", jobs, 0, 100, finished)
    assert refused.value.status == 507
    assert says in refused.value.message
    assert remedy_says in refused.value.details["remedy"]
    assert refused.value.details | {"remedy": None} == {"limit": "rest_user_max_jobs", "value": 3, "used": jobs,
                                                        "remedy": None}


def test_a_short_live_window_is_said_in_seconds():
    with pytest.raises(QuotaExceeded) as refused:
        check_stored_jobs(Config(rest_user_max_jobs=1, live_finished_job_seconds=10.0), "alice", 1, 0, 100, 1)
    assert "about 10 seconds after they end" in refused.value.details["remedy"]


def test_under_the_quota_nothing_is_refused():
    check_stored_jobs(CONFIG, "alice", 2, 0, 100, 0)
    check_stored_jobs(Config(rest_user_max_jobs=0), "alice", 10**6, 0, 100, 0)  # 0: no limit


def submission(user: str, name: str) -> bytes:
    return msgspec.json.encode(SubmittedJob(job=f"{user}~{name}", user=user, name=name, vc="default",
                                            spec=JobSpec(name=name, user=user, taskRoles=[]), config={},
                                            submittedAt=1.0))


def test_the_index_counts_each_users_finished_jobs_through_every_change():
    index = JobIndex()
    index.put_submission("alice.a", submission("alice", "a"))
    index.put_submission("alice.b", submission("alice", "b"))
    index.put_submission("bob.c", submission("bob", "c"))
    assert index.finished == {}

    index.put_status("alice.a", StatusBrief(state=JobState.RUNNING))
    assert index.finished == {}
    index.put_status("alice.a", StatusBrief(state=JobState.SUCCEEDED))
    index.put_status("alice.a", StatusBrief(state=JobState.SUCCEEDED))  # the same again counts once
    index.put_status("bob.c", StatusBrief(state=JobState.FAILED))
    assert index.finished == {"alice": 1, "bob": 1}

    # A status that came before its submission counts once the submission is there.
    index.put_status("alice.d", StatusBrief(state=JobState.STOPPED))
    assert index.finished == {"alice": 1, "bob": 1}
    index.put_submission("alice.d", submission("alice", "d"))
    assert index.finished == {"alice": 2, "bob": 1}
    assert index.usage["alice"][0] == 3

    # The same submission stored again (published marked) is still one finished job.
    index.put_submission("alice.d", submission("alice", "d"))
    assert index.finished == {"alice": 2, "bob": 1}

    index.put_status("alice.a", StatusBrief(state=JobState.WAITING))  # retried from the start: not finished
    assert index.finished == {"alice": 1, "bob": 1}
    index.put_status("alice.d", None)  # its status record gone: not known to be finished
    assert index.finished == {"bob": 1}

    index.delete_submission("bob.c")  # archived or deleted: leaves both counts
    assert index.finished == {}
    assert "bob" not in index.usage
