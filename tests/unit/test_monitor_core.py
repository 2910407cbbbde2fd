"""The monitor core: what `pai_jobs`, the submit-to-running histogram and the event,
task-exit and node metrics show for a stream of events, redelivered or not."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from libs.common.messages import (
    ExitSpec,
    JobState,
    JobStateChanged,
    JobSubmitted,
    NodeStatus,
    StopRequested,
    TaskExited,
    TaskVerdict,
)
from libs.common.protocol.model import JobSpec
from services.monitor.core import (
    EventCounted,
    JobsGauge,
    MonitorCore,
    NodeCount,
    NodeUp,
    StoredJob,
    SubmitToRunning,
    TaskExitCounted,
)

W, R, SG = JobState.WAITING, JobState.RUNNING, JobState.STOPPING
OK, KO, SD = JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED


def submitted(job: str = "alice~a", vc: str = "default") -> JobSubmitted:
    user, name = job.split("~")
    return JobSubmitted(id=f"{job}/submitted", job=job, spec=JobSpec(name=name, user=user, virtualCluster=vc))


def state(
    job: str, to: JobState, attempt: int = 1, *, vc: str = "default", since: float | None = None
) -> JobStateChanged:
    return JobStateChanged(
        id=f"{job}/{attempt}/state/{to}",
        job=job,
        vc=vc,
        user=job.split("~")[0],
        attempt=attempt,
        state=to,
        sinceSubmit=since,
    )


def exited(job: str, code: int, index: int = 0, *, vc: str = "default") -> TaskExited:
    return TaskExited(
        id=f"{job}/1/worker/{index}/0/exited", job=job, vc=vc, attempt=1, role="worker", index=index, exitCode=code
    )


def verdict(job: str, code: int, phrase: str, index: int = 0, *, vc: str = "default") -> TaskVerdict:
    return TaskVerdict(
        id=f"{job}/1/worker/{index}/0/verdict",
        job=job,
        vc=vc,
        attempt=1,
        role="worker",
        index=index,
        exitCode=code,
        spec=ExitSpec(code=code, phrase=phrase),
    )


def node(name: str, healthy: bool, at: float) -> NodeStatus:
    return NodeStatus(id=f"node/{name}/{at}", job="", node=name, healthy=healthy, at=at)


def run(core: MonitorCore, *events) -> list:
    out = []
    for event in events:
        out.extend(core.handle(event))
    core.validate_state()
    return out


def jobs_by_state(core: MonitorCore, vc: str = "default") -> dict[str, int]:
    return {str(s): core.jobs_in(vc, s) for s in JobState if core.jobs_in(vc, s)}


def of_type(updates, kind) -> list:
    return [u for u in updates if isinstance(u, kind)]


LIFECYCLES = [
    pytest.param([submitted()], {"WAITING": 1}, id="submitted-job-is-waiting"),
    pytest.param([state("alice~a", W)], {"WAITING": 1}, id="state-without-submission-still-counts"),
    pytest.param([submitted(), state("alice~a", W), state("alice~a", R)], {"RUNNING": 1}, id="waiting-then-running"),
    pytest.param(
        [submitted(), state("alice~a", R), state("alice~a", OK)], {"SUCCEEDED": 1}, id="running-then-succeeded"
    ),
    pytest.param(
        [submitted(), state("alice~a", R), state("alice~a", SG), state("alice~a", SD)],
        {"STOPPED": 1},
        id="stopped-through-stopping",
    ),
    pytest.param(
        [submitted(), state("alice~a", R), state("alice~a", W, attempt=2)],
        {"WAITING": 1},
        id="retry-goes-back-to-waiting",
    ),
    pytest.param(
        [submitted(), submitted("bob~b"), state("alice~a", R), state("bob~b", KO)],
        {"RUNNING": 1, "FAILED": 1},
        id="two-jobs",
    ),
    pytest.param(
        [submitted(), state("alice~a", R), state("alice~a", OK), state("alice~a", R)],
        {"SUCCEEDED": 1},
        id="late-redelivery-does-not-move-back",
    ),
    pytest.param(
        [submitted(), state("alice~a", R, attempt=2), state("alice~a", OK, attempt=1)],
        {"RUNNING": 1},
        id="older-attempt-is-stale",
    ),
    pytest.param(
        [state("alice~a", R), submitted()], {"RUNNING": 1}, id="late-submission-does-not-reset-the-state"
    ),
]


@pytest.mark.parametrize("events, expected", LIFECYCLES)
def test_jobs_gauge_shows_each_job_in_its_latest_state(events, expected):
    core = MonitorCore()
    run(core, *events)
    assert jobs_by_state(core) == expected


def test_a_new_vc_gets_every_state_gauge_so_zeros_show():
    updates = run(MonitorCore(), submitted(vc="research"))
    gauges = {(u.state, u.count) for u in of_type(updates, JobsGauge) if u.vc == "research"}
    assert gauges == {(str(s), 1 if s == W else 0) for s in JobState}


def test_a_move_updates_both_the_old_and_the_new_state_gauge():
    core = MonitorCore()
    run(core, submitted())
    updates = run(core, state("alice~a", R))
    assert set(of_type(updates, JobsGauge)) == {
        JobsGauge(vc="default", state="WAITING", count=0),
        JobsGauge(vc="default", state="RUNNING", count=1),
    }


def test_every_event_redelivered_changes_nothing():
    events = [
        submitted(),
        state("alice~a", W),
        state("alice~a", R, since=0.4),
        exited("alice~a", 0),
        verdict("alice~a", 0, "Succeeded"),
        state("alice~a", OK),
        node("n1", True, 5.0),
    ]
    core = MonitorCore()
    run(core, *events)
    before = jobs_by_state(core)
    again = run(core, *events)
    assert jobs_by_state(core) == before == {"SUCCEEDED": 1}
    assert not of_type(again, EventCounted)
    assert not of_type(again, TaskExitCounted)
    assert not of_type(again, SubmitToRunning)


@pytest.mark.parametrize(
    "events, expected",
    [
        pytest.param([state("alice~a", R, since=0.25)], [0.25], id="first-run-observed"),
        pytest.param([state("alice~a", R, since=0.25), state("alice~a", R, since=0.25)], [0.25], id="redelivered-once"),
        pytest.param(
            [
                state("alice~a", R, since=1.0),
                state("alice~a", W, attempt=2),
                state("alice~a", R, attempt=2, since=90.0),
            ],
            [1.0],
            id="retry-running-again-not-observed",
        ),
        pytest.param(
            [state("alice~a", W, attempt=2), state("alice~a", R, attempt=2, since=30.0)],
            [30.0],
            id="preempted-before-running-observed-at-first-run",
        ),
        pytest.param([state("alice~a", R)], [], id="no-since-submit-no-observation"),
        pytest.param([state("alice~a", W, since=0.0), state("alice~a", OK, since=3.0)], [], id="never-ran"),
    ],
)
def test_submit_to_running_is_observed_once_per_job(events, expected):
    updates = run(MonitorCore(), *events)
    assert [u.seconds for u in of_type(updates, SubmitToRunning)] == expected


def test_submit_to_running_is_labelled_with_the_vc_of_the_job():
    updates = run(MonitorCore(), submitted(vc="research"), state("alice~a", R, vc="research", since=2.0))
    assert of_type(updates, SubmitToRunning) == [SubmitToRunning(vc="research", seconds=2.0)]


@pytest.mark.parametrize(
    "events, expected",
    [
        pytest.param([exited("alice~a", 0)], ["success"], id="exit-0-is-success"),
        pytest.param([exited("alice~a", 1)], [], id="failure-waits-for-the-verdict"),
        pytest.param(
            [exited("alice~a", 1), verdict("alice~a", 1, "UserCommandFailed")],
            ["UserCommandFailed"],
            id="verdict-phrase",
        ),
        pytest.param(
            [exited("alice~a", 0), verdict("alice~a", 0, "Succeeded")],
            ["success"],
            id="success-verdict-not-counted-twice",
        ),
        pytest.param([verdict("alice~a", 137, "  ")], ["failure"], id="blank-phrase-is-failure"),
        pytest.param([verdict("alice~a", 2, "x" * 200)], ["x" * 64], id="long-phrase-cut"),
        pytest.param(
            [exited("alice~a", 0, 0), exited("alice~a", 0, 1)], ["success", "success"], id="each-instance-counted"
        ),
    ],
)
def test_task_exits_are_counted_by_outcome(events, expected):
    updates = run(MonitorCore(), *events)
    assert [u.outcome for u in of_type(updates, TaskExitCounted)] == expected


def test_every_event_kind_is_counted_once_by_id():
    core = MonitorCore()
    stop = StopRequested(id="alice~a/stop", job="alice~a", vc="default", by="alice")
    updates = run(core, submitted(), stop, stop, state("alice~a", SD))
    assert [u.kind for u in of_type(updates, EventCounted)] == ["job.submitted", "job.stop_requested", "job.state"]


@pytest.mark.parametrize(
    "events, expected_up",
    [
        pytest.param([node("n1", True, 1.0)], {"n1": True}, id="healthy"),
        pytest.param([node("n1", True, 1.0), node("n1", False, 2.0)], {"n1": False}, id="turns-unhealthy"),
        pytest.param([node("n1", False, 2.0), node("n1", True, 1.0)], {"n1": False}, id="older-report-ignored"),
        pytest.param([node("n1", True, 1.0), node("n2", False, 1.0)], {"n1": True, "n2": False}, id="two-nodes"),
    ],
)
def test_node_up_follows_the_latest_node_status(events, expected_up):
    updates = run(MonitorCore(), *events)
    shown = {u.node: u.up for u in of_type(updates, NodeUp)}
    assert shown == expected_up
    assert of_type(updates, NodeCount)[-1].count == len(expected_up)


def test_a_sampled_node_is_up_until_a_newer_report_says_otherwise():
    core = MonitorCore()
    assert core.node_sampled("vm", 10.0) == [NodeUp(node="vm", up=True), NodeCount(count=1)]
    assert run(core, node("vm", False, 11.0))[-2:] == [NodeUp(node="vm", up=False), NodeCount(count=1)]
    assert core.node_sampled("vm", 10.5) == []


def test_restore_sets_gauges_from_the_launcher_records():
    core = MonitorCore()
    updates = core.restore(
        [
            StoredJob(job="alice~a", vc="default", state=R),
            StoredJob(job="alice~b", vc="default", state=OK),
            StoredJob(job="bob~c", vc="research", state=W, attempt=3),
        ]
    )
    core.validate_state()
    gauges = {(u.vc, u.state): u.count for u in of_type(updates, JobsGauge) if u.count}
    assert gauges == {("default", "RUNNING"): 1, ("default", "SUCCEEDED"): 1, ("research", "WAITING"): 1}


def test_events_older_than_the_restored_record_do_not_move_the_job_back():
    core = MonitorCore()
    core.restore([StoredJob(job="alice~a", vc="default", state=OK, attempt=2)])
    run(core, submitted(), state("alice~a", R, since=0.5), state("alice~a", W, attempt=2))
    assert jobs_by_state(core) == {"SUCCEEDED": 1}


# --- invariants -------------------------------------------------------------------

JOBS = ["alice~a", "alice~b", "bob~c"]
VC_OF = {"alice~a": "default", "alice~b": "default", "bob~c": "research"}

any_event = st.one_of(
    st.sampled_from(JOBS).map(lambda j: submitted(j, VC_OF[j])),
    st.builds(
        lambda j, to, attempt, since: state(j, to, attempt, vc=VC_OF[j], since=since),
        st.sampled_from(JOBS),
        st.sampled_from(list(JobState)),
        st.integers(1, 3),
        st.sampled_from([None, 0.01, 2.0]),
    ),
    st.builds(lambda j, code: exited(j, code, vc=VC_OF[j]), st.sampled_from(JOBS), st.sampled_from([0, 1])),
    st.builds(lambda j, code: verdict(j, code, "Phrase", vc=VC_OF[j]), st.sampled_from(JOBS), st.sampled_from([0, 1])),
)


def totals(updates) -> tuple:
    return (
        sorted(u.kind for u in of_type(updates, EventCounted)),
        sorted((u.vc, u.outcome) for u in of_type(updates, TaskExitCounted)),
        sorted((u.vc, u.seconds) for u in of_type(updates, SubmitToRunning)),
    )


@settings(max_examples=150, deadline=None)
@given(events=st.lists(any_event, max_size=25), data=st.data())
def test_redeliveries_anywhere_later_change_no_metric(events, data):
    """JetStream redelivers an event after itself, never before: whatever the
    redeliveries, the counts and observations equal those of a single delivery."""
    once = MonitorCore()
    once_updates = run(once, *events)

    with_redeliveries = list(events)
    for event in events:
        if data.draw(st.booleans()):
            later = data.draw(st.integers(with_redeliveries.index(event) + 1, len(with_redeliveries)))
            with_redeliveries.insert(later, event)
    twice = MonitorCore()
    twice_updates = run(twice, *with_redeliveries)

    assert totals(twice_updates) == totals(once_updates)
    for vc in ("default", "research"):
        assert jobs_by_state(twice, vc) == jobs_by_state(once, vc)
    jobs_mentioned = {e.job for e in events if isinstance(e, (JobSubmitted, JobStateChanged))}
    assert twice.job_count == once.job_count == len(jobs_mentioned)


@settings(max_examples=100, deadline=None)
@given(events=st.lists(any_event, max_size=25))
def test_the_last_gauge_update_of_each_pair_is_the_true_count(events):
    """Applying the updates in order leaves every gauge at the core's count."""
    core = MonitorCore()
    shown: dict[tuple[str, str], int] = {}
    for update in of_type(run(core, *events), JobsGauge):
        shown[(update.vc, update.state)] = update.count
    for (vc, state_name), count in shown.items():
        assert count == core.jobs_in(vc, JobState(state_name))
    assert sum(shown.values()) == core.job_count


def test_a_dead_lettered_event_raises_one_critical_alert_naming_job_consumer_and_reason():
    from libs.common.messages import EventDeadLettered
    from services.monitor.core.updates import RaiseAlert

    letter = EventDeadLettered(
        id="alice~a/submitted/dead-lettered/launcher", job="alice~a", cause="alice~a/submitted",
        consumer="launcher", eventId="alice~a/submitted", eventKind="job.submitted",
        subject="pai.v1.job.submitted.default.alice.a", deliveries=5, reason="MaxPayloadError: too big",
    )
    core = MonitorCore()
    first, again = run(core, letter), run(core, letter)
    [alert] = of_type(first, RaiseAlert)
    assert alert.severity == "critical" and alert.job == "alice~a"
    assert "launcher" in alert.summary and "MaxPayloadError" in alert.summary
    # A redelivery raises the same alert (same id, so the bus stores it once) and counts nothing.
    assert of_type(again, RaiseAlert) == [alert] and not of_type(again, EventCounted)


def gauges_after(updates) -> dict[tuple[str, str], int]:
    shown: dict[tuple[str, str], int] = {}
    for update in of_type(updates, JobsGauge):
        shown[(update.vc, update.state)] = update.count
    return shown


@settings(max_examples=150, deadline=None)
@given(events=st.lists(any_event, max_size=25), data=st.data())
def test_a_stream_handled_in_batches_shows_what_it_shows_event_by_event(events, data):
    """The service hands the core every waiting event at once: cut anywhere into
    batches, the counts, observations and final gauge values are those of the
    events one by one, and a batch sets each touched gauge once."""
    one_by_one = MonitorCore()
    single_updates = run(one_by_one, *events)

    batched = MonitorCore()
    batched_updates: list = []
    rest = list(events)
    while rest:
        size = data.draw(st.integers(1, len(rest)))
        batch, rest = rest[:size], rest[size:]
        updates = batched.handle(*batch)
        gauges = [(u.vc, u.state) for u in of_type(updates, JobsGauge)]
        assert len(gauges) == len(set(gauges)), "a gauge set twice in one batch"
        batched_updates.extend(updates)
    batched.validate_state()

    assert totals(batched_updates) == totals(single_updates)
    assert gauges_after(batched_updates) == gauges_after(single_updates)
    for vc in ("default", "research"):
        assert jobs_by_state(batched, vc) == jobs_by_state(one_by_one, vc)


def test_an_event_that_raises_hands_back_the_updates_of_the_batch_before_it(monkeypatch):
    """Those events are applied (and remembered as seen): the shell must still show them."""
    from services.monitor.core.tally import PartlyHandled

    core = MonitorCore()
    bad = state("bob~b", R)
    original = core._state_changed

    def failing(event, updates, touched):
        if event.job == "bob~b":
            raise RuntimeError("a bug")
        original(event, updates, touched)

    monkeypatch.setattr(core, "_state_changed", failing)
    with pytest.raises(PartlyHandled) as raised:
        core.handle(submitted(), state("alice~a", R, since=1.5), bad, exited("alice~a", 0))
    assert isinstance(raised.value.__cause__, RuntimeError)
    handed_back = raised.value.updates
    assert [u.kind for u in of_type(handed_back, EventCounted)] == ["job.submitted", "job.state", "job.state"]
    assert [u.seconds for u in of_type(handed_back, SubmitToRunning)] == [1.5]
    assert gauges_after(handed_back)[("default", "RUNNING")] == 1
    assert not of_type(handed_back, TaskExitCounted), "the event after the failing one was handled"


# --- finished jobs held for a bounded while ---------------------------------------


def finished_at(job: str, at: float, to: JobState = OK) -> list:
    return [submitted(job), msgspec.structs.replace(state(job, R), at=at - 1),
            msgspec.structs.replace(state(job, to), at=at)]


def test_past_the_count_bound_the_earliest_finished_job_is_forgotten_and_leaves_its_gauge():
    core = MonitorCore(keep_finished=2)
    run(core, *finished_at("alice~a", 10.0), *finished_at("alice~b", 20.0, KO), submitted("bob~c"))
    updates = run(core, *finished_at("alice~d", 30.0))
    assert core.state_of("alice~a") is None  # forgotten
    assert core.state_of("alice~b") == KO and core.state_of("alice~d") == OK
    assert core.state_of("bob~c") == W  # an unfinished job is never forgotten
    assert jobs_by_state(core) == {"WAITING": 1, "FAILED": 1, "SUCCEEDED": 1}
    assert JobsGauge(vc="default", state="SUCCEEDED", count=1) in of_type(updates, JobsGauge)


def test_a_job_finished_longer_ago_than_the_time_bound_is_forgotten():
    core = MonitorCore(keep_finished_seconds=60.0)
    run(core, *finished_at("alice~a", 1000.0), submitted("bob~c"))
    assert core.state_of("alice~a") == OK
    run(core, msgspec.structs.replace(state("bob~c", R), at=1061.0))
    assert core.state_of("alice~a") is None
    assert jobs_by_state(core) == {"RUNNING": 1}


def test_a_redelivered_event_of_a_forgotten_job_does_not_bring_it_back():
    core = MonitorCore(keep_finished=1)
    first = finished_at("alice~a", 10.0)
    run(core, *first, *finished_at("alice~b", 20.0))
    assert core.state_of("alice~a") is None
    updates = run(core, *first)
    assert core.state_of("alice~a") is None
    assert jobs_by_state(core) == {"SUCCEEDED": 1}
    assert not of_type(updates, EventCounted)


def test_restore_keeps_the_latest_finished_jobs_within_the_bound():
    core = MonitorCore(keep_finished=1)
    core.restore([
        StoredJob(job="alice~b", vc="default", state=OK, completedTime=20.0),
        StoredJob(job="alice~a", vc="default", state=KO, completedTime=10.0),
        StoredJob(job="bob~c", vc="default", state=R),
    ])
    core.validate_state()
    assert core.state_of("alice~a") is None and core.state_of("alice~b") == OK
    assert jobs_by_state(core) == {"RUNNING": 1, "SUCCEEDED": 1}
