"""The job index remembers computed lists until it changes, and only so many."""

from __future__ import annotations

from services.rest import job_index
from services.rest.job_index import JobIndex


def test_a_memo_holds_until_the_index_changes():
    index = JobIndex()
    calls = []
    compute = lambda: calls.append(1) or len(calls)  # noqa: E731
    assert index.memo("q", compute) == 1
    assert index.memo("q", compute) == 1
    index.delete_submission("nobody.never")  # no change: nothing to forget
    assert index.memo("q", compute) == 1
    index.put_status("alice.job", None)  # a change of a job not listed yet does not count either
    index.version += 1  # what every real change does
    assert index.memo("q", compute) == 2


def test_memos_are_bounded_oldest_first(monkeypatch):
    monkeypatch.setattr(job_index, "MAX_MEMOS", 3)
    index = JobIndex()
    for n in range(10):
        index.memo(("filter", n), lambda n=n: n)
    assert len(index._memo) == 3
    assert set(index._memo) == {("filter", 7), ("filter", 8), ("filter", 9)}
