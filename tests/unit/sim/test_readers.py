"""Trace readers on small files in each format, quirks and bad rows included."""

from __future__ import annotations

import pytest

from libs.common.protocol.model import OPPORTUNISTIC_PRIORITY, PRIORITY_CLASSES
from services.scheduler.sim.readers import TraceFormatError, detect_trace_format, read_trace
from services.scheduler.sim.trace import skipped_summary
from tests.unit.sim.helpers import TRACES


@pytest.mark.parametrize(("file", "expected"), [
    ("hand-12.csv", "csv"),
    ("bad-rows.csv", "csv"),
    ("philly-small.csv", "philly"),
    ("alibaba-pods-small.csv", "alibaba-pods"),
], ids=["own-csv", "own-csv-with-bad-rows", "philly", "alibaba-pods"])
def test_the_header_tells_the_format(file, expected):
    assert detect_trace_format(TRACES / file) == expected


def test_a_file_that_is_no_trace_is_refused_with_the_formats_expected(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("when,what\n1,2\n")
    with pytest.raises(TraceFormatError, match="not a known trace.*job_id,submit_time"):
        read_trace(path)


# --- PAI's own CSV -------------------------------------------------------------------------

BAD_ROWS = [  # (line, kind, words the reason must contain)
    (4, "duplicate-job_id", "job_id ok-1 already used at line 2"),
    (5, "bad-num_gpus", "num_gpus 'zero' is not a number"),
    (6, "bad-duration", "duration '-3' must be a number of seconds >= 0"),
    (7, "no-job_id", "job_id is empty"),
    (8, "bad-tasks", "num_gpus 3 cannot be split evenly over 2 tasks"),
    (9, "bad-priority", "priority 'urgent' is neither a whole number nor one of crit/prod/test/oppo"),
    (10, "no-vc", "vc is empty"),
    (11, "short-row", "the row has 3 fields; column num_gpus is missing"),
]


@pytest.fixture(scope="module")
def bad_rows_trace():
    return read_trace(TRACES / "bad-rows.csv")


def test_good_rows_of_a_file_with_bad_rows_are_read(bad_rows_trace):
    jobs = {job.job_id: job for job in bad_rows_trace.jobs}
    assert list(jobs) == ["ok-1", "ok-2", "ok-3"]
    assert (jobs["ok-2"].priority, jobs["ok-2"].tasks, jobs["ok-2"].num_gpus) == (PRIORITY_CLASSES["prod"], 2, 4)
    assert jobs["ok-3"].priority == OPPORTUNISTIC_PRIORITY
    assert jobs["ok-1"].priority is None and jobs["ok-1"].tasks is None


@pytest.mark.parametrize(("line", "kind", "reason"), BAD_ROWS, ids=[kind for _, kind, _ in BAD_ROWS])
def test_each_bad_row_is_reported_with_its_line_and_reason(bad_rows_trace, line, kind, reason):
    skipped = {row.line: row for row in bad_rows_trace.skipped}
    assert skipped[line].kind == kind
    assert reason in skipped[line].detail


def test_only_the_bad_rows_are_skipped_and_unused_columns_are_named(bad_rows_trace):
    assert sorted(row.line for row in bad_rows_trace.skipped) == [line for line, _, _ in BAD_ROWS]
    assert bad_rows_trace.notes == ["columns not used by the simulator: owner"]


def test_the_skipped_summary_counts_by_kind_and_shows_examples(bad_rows_trace):
    summary = skipped_summary(bad_rows_trace.skipped)
    assert summary["count"] == len(BAD_ROWS)
    assert summary["by_kind"]["bad-tasks"] == {
        "rows": 1, "examples": [{"line": 8, "reason": "num_gpus 3 cannot be split evenly over 2 tasks"}]}


def test_submit_times_may_be_dates_but_not_mixed_with_seconds(tmp_path):
    path = tmp_path / "dates.csv"
    path.write_text("job_id,submit_time,duration,num_gpus,vc\n"
                    "j1,2017-10-01 00:00:00,60,1,a\n"
                    "j2,2017-10-01T00:01:00,60,1,a\n"
                    "j3,120,60,1,a\n")
    trace = read_trace(path)
    assert [job.submit_time for job in trace.jobs] == [1506816000.0, 1506816060.0]
    assert trace.epoch_times
    assert trace.skipped[0].line == 4 and "earlier rows use date-times" in trace.skipped[0].detail


# --- Philly -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def philly():
    return read_trace(TRACES / "philly-small.csv")


def test_philly_rows_become_jobs_with_their_vc_and_gpus(philly):
    assert len(philly.jobs) == 7
    first = philly.jobs[0]
    assert (first.job_id, first.submit_time, first.duration, first.num_gpus, first.vc) == (
        "philly-2", 1506934800.0, 600.0, 1, "vc-small")
    assert philly.epoch_times


def test_philly_jobs_are_replayed_in_time_order(philly):
    times = [job.submit_time for job in philly.sorted_jobs()]
    assert times == sorted(times)
    assert philly.sorted_jobs()[0].job_id == "philly-7"
    assert any("not in time order (2 arrive earlier" in note for note in philly.notes)


@pytest.mark.parametrize(("line", "kind"), [
    (8, "bad-duration"), (9, "bad-num_gpus"), (10, "bad-timestamp"), (12, "empty-line"),
], ids=["duration-not-a-number", "zero-gpus", "timestamp-not-a-date", "trailing-empty-line"])
def test_philly_bad_rows_are_reported(philly, line, kind):
    assert {row.line: row.kind for row in philly.skipped}[line] == kind


def test_philly_duplicates_are_kept_and_reported_or_dropped_on_request(philly):
    assert any("1 rows repeat an earlier row exactly (line 4 = line 3" in note for note in philly.notes)
    dropped = read_trace(TRACES / "philly-small.csv", drop_duplicates=True)
    assert len(dropped.jobs) == 6
    assert [(row.line, row.kind) for row in dropped.skipped if row.kind == "duplicate"] == [(4, "duplicate")]


def test_philly_gpu_time_that_disagrees_is_noted(philly):
    assert any("1 rows have gpu_time != duration * num_gpus" in note for note in philly.notes)


# --- Alibaba 2023 ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pods():
    return read_trace(TRACES / "alibaba-pods-small.csv")


def test_scheduled_pods_become_one_task_jobs(pods):
    jobs = {job.job_id: job for job in pods.jobs}
    assert list(jobs) == ["pod-a", "pod-b", "pod-c", "pod-f"]
    assert (jobs["pod-c"].submit_time, jobs["pod-c"].duration, jobs["pod-c"].num_gpus) == (200, 600, 8)
    assert all(job.tasks == 1 and job.vc == "default" for job in jobs.values())


def test_best_effort_pods_are_opportunistic(pods):
    priorities = {job.job_id: job.priority for job in pods.jobs}
    assert priorities == {"pod-a": None, "pod-b": OPPORTUNISTIC_PRIORITY, "pod-c": None, "pod-f": None}


@pytest.mark.parametrize(("line", "kind", "reason"), [
    (5, "never-scheduled", "pod pod-d was never scheduled (Pending)"),
    (6, "no-gpu", "pod pod-e asks for no GPU"),
    (8, "bad-times", "pod pod-g is deleted (1400) before it is scheduled (1450)"),
], ids=["pending", "cpu-only", "deleted-before-scheduled"])
def test_pods_that_cannot_be_replayed_are_reported(pods, line, kind, reason):
    row = {row.line: row for row in pods.skipped}[line]
    assert row.kind == kind and reason in row.detail


@pytest.mark.parametrize("words", [
    "2 pods still run when the trace ends (t=5000 s): their run time is cut there",
    "1 pods ask for a fraction of one GPU",
    "1 pods already exist when the trace starts",
], ids=["cut-at-trace-end", "fractional-gpu", "there-at-start"])
def test_pod_quirks_are_noted(pods, words):
    assert any(words in note for note in pods.notes)
