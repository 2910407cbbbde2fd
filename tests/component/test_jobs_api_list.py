"""The job list's pure parts: the query, the order, the page; and the index's memo.
(No NATS here: the served list is tested in test_jobs_api.py.)"""

from __future__ import annotations

import msgspec
import pytest

from libs.common.errors import BadInput
from libs.common.messages import JobState
from libs.common.protocol.model import JobSpec, TaskRole
from services.rest.job_index import JobIndex, StatusBrief
from services.rest.jobs_api import JobRow, order_jobs, parse_list_query, select_jobs
from services.rest.records import SubmittedJob


def job(user: str, name: str, at: float, *, state: JobState = JobState.WAITING, done: float | None = None,
        tags: tuple[str, ...] = (), vc: str = "default"):
    spec = JobSpec(name=name, user=user, taskRoles=[TaskRole(name="main")])
    sub = SubmittedJob(job=f"{user}~{name}", user=user, name=name, vc=vc, spec=spec, config={}, submittedAt=at,
                       tags=list(tags))
    row = JobRow(debugId=sub.job, name=name, username=user, state=state, subState=state.value,
                 executionType="START", retries=0, totalTaskNumber=1, totalGpuNumber=0, createdTime=int(at * 1000),
                 completedTime=None if done is None else int(done * 1000), appExitCode=None, virtualCluster=vc,
                 priority=100, waitingReason=None, tags=list(tags))
    return sub, row


JOBS = [
    job("ann", "alpha", 1, state=JobState.SUCCEEDED, done=5, tags=("gold",)),
    job("bob", "beta", 2, state=JobState.RUNNING, vc="vision"),
    job("ann", "gamma", 3, state=JobState.FAILED, done=4, tags=("gold", "old")),
    job("cy", "delta", 4),
]


def names(query: dict) -> tuple[int, list[str]]:
    q = parse_list_query(query)
    total, page = select_jobs(q, order_jobs(JOBS, q.order_field, q.descending))
    return total, [row.name for row in page]


@pytest.mark.parametrize("query,expected", [
    ({}, (4, ["delta", "gamma", "beta", "alpha"])),
    ({"order": "submissionTime,ASC"}, (4, ["alpha", "beta", "gamma", "delta"])),
    ({"order": "name"}, (4, ["gamma", "delta", "beta", "alpha"])),
    ({"order": "completionTime,ASC"}, (4, ["gamma", "alpha", "beta", "delta"])),
    ({"order": "completionTime,DESC"}, (4, ["alpha", "gamma", "beta", "delta"])),
    ({"username": "ann"}, (2, ["gamma", "alpha"])),
    ({"vc": "vision"}, (1, ["beta"])),
    ({"state": "succeeded,failed"}, (2, ["gamma", "alpha"])),
    ({"keyword": "ANN~"}, (2, ["gamma", "alpha"])),
    ({"tags": "gold"}, (2, ["gamma", "alpha"])),
    ({"tagsContain": "old,new"}, (1, ["gamma"])),
    ({"tagsNotContain": "old"}, (3, ["delta", "beta", "alpha"])),
    ({"offset": "1", "limit": "2"}, (4, ["gamma", "beta"])),
    ({"username": "ann", "offset": "1"}, (2, ["alpha"])),
    ({"offset": "9"}, (4, [])),
], ids=["newest-first", "oldest-first", "by-name-desc-default", "unfinished-last-asc", "unfinished-last-desc",
        "user", "vc", "states", "keyword-any-case", "tag", "tags-any", "tags-none", "page", "filtered-page",
        "past-the-end"])
def test_list_query(query, expected):
    assert names(query) == expected


@pytest.mark.parametrize("query,path", [
    ({"order": "size"}, "order"), ({"order": "name,SIDEWAYS"}, "order"), ({"state": "DONE"}, "state"),
    ({"limit": "0"}, "limit"), ({"limit": "10001"}, "limit"), ({"offset": "-2"}, "offset"), ({"offset": "a"}, "offset"),
    ({"offset": "185035319790205485581584184085839872"}, "offset"),  # past a database's 64-bit OFFSET: was a 500
], ids=["unknown-field", "bad-direction", "unknown-state", "zero-limit", "limit-too-big", "negative-offset", "not-int",
        "offset-too-big"])
def test_bad_list_query_names_the_parameter(query, path):
    with pytest.raises(BadInput) as caught:
        parse_list_query(query)
    assert caught.value.details["errors"][0]["path"] == path


def test_with_total_count_flag():
    assert parse_list_query({"withTotalCount": "true"}).with_total
    assert not parse_list_query({}).with_total


def test_index_memo_is_computed_again_after_any_change():
    index = JobIndex()
    sub, _ = JOBS[0]
    calls = []

    def compute():
        calls.append(1)
        return len(index.jobs)

    assert index.memo("n", compute) == 0 and index.memo("n", compute) == 0 and len(calls) == 1
    index.put_submission("ann.alpha", msgspec.json.encode(sub))
    assert index.memo("n", compute) == 1 and len(calls) == 2
    index.put_status("ann.alpha", StatusBrief(state=JobState.RUNNING))
    index.memo("n", compute)
    assert len(calls) == 3 and index.jobs["ann.alpha"].status.state == JobState.RUNNING
    index.put_status("nobody.none", StatusBrief())  # a status before its submission changes no row
    index.memo("n", compute)
    assert len(calls) == 3
    index.put_submission("nobody.none", msgspec.json.encode(sub))
    assert index.jobs["nobody.none"].status is not None  # joined when the submission comes
    index.delete_submission("nobody.none")
    assert index.memo("n", compute) == 1 and len(calls) == 4  # two changes since, one recompute
