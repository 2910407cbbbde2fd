"""The alert core, table-tested with synthetic samples, events and a fake clock."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from libs.common.alerts_messages import AlertState
from libs.common.ids import EventId, JobId, NodeName, UserName, VcName
from libs.common.messages import (
    ExitSpec,
    JobPlaced,
    JobState,
    JobStateChanged,
    JobSubmitted,
    JobWaiting,
    NodeStatus,
    TaskPlacement,
)
from libs.common.protocol.model import JobSpec
from services.monitor.alerts.core import (
    ActionDue,
    AlertCore,
    AlertEnded,
    AlertFired,
    JobView,
    NodeReading,
    Notification,
    ServiceReading,
)
from services.monitor.alerts.rules import Action, load_rules_text

T0 = 1_700_000_000.0


def core_with(rules_yaml: str) -> AlertCore:
    return AlertCore(load_rules_text(rules_yaml))


def submitted(job: str, at: float, *, notify: bool = False, vc: str = "vc1", states: tuple[str, ...] = ()) -> JobSubmitted:
    user, name = job.split("~")
    return JobSubmitted(id=EventId(f"{job}/submitted"), job=JobId(job), at=at,
                        spec=JobSpec(name=name, user=user, virtualCluster=vc, notifyOnStateChange=notify,
                                     notifyStates=list(states)))


def state(job: str, new: JobState, at: float, *, attempt: int = 1, spec: ExitSpec | None = None,
          code: int | None = None) -> JobStateChanged:
    return JobStateChanged(id=EventId(f"{job}/{attempt}/{new.value}"), job=JobId(job), at=at, vc=VcName("vc1"),
                           user=UserName(job.split("~")[0]), attempt=attempt, state=new, exitSpec=spec, exitCode=code)


def placed(job: str, node: str, gpus: list[int], at: float, attempt: int = 1) -> JobPlaced:
    return JobPlaced(id=EventId(f"{job}/{attempt}/placed"), job=JobId(job), at=at, vc=VcName("vc1"), attempt=attempt,
                     tasks=[TaskPlacement(role="train", index=0, node=NodeName(node), gpus=gpus)])


def of(outputs, kind):
    return [o for o in outputs if isinstance(o, kind)]


NODE_RULES = """
repeatInterval: 1h
inhibit: [{source: NodeNotReady, targets: [NodeFilesystemUsage, JobFailed]}]
rules:
- {name: NvidiaSmiDoubleEccError, when: gpu_ecc_double_bit, severity: critical, actions: [email-admin, cordon-node]}
- {name: GpuUsedByExternalProcess, when: gpu_external_process, for: 5m, actions: [email-admin]}
- {name: NodeNotReady, when: node_not_ready, threshold: 2m, for: 1m, actions: [email-admin],
   summary: "node {node} is not ready: {reason}"}
- {name: NodeFilesystemUsage, when: node_disk_usage, threshold: 90, for: 5m, actions: [email-admin]}
- {name: NodeMemoryUsage, when: node_memory_usage, threshold: 95, actions: [email-admin]}
- {name: NodeCPUUsage, when: node_cpu_usage, threshold: 95}
- {name: JobFailed, when: job_failed, window: 1h, sendResolved: false, actions: [email-owner, tag-job],
   summary: "job {job} failed: {reason}"}
"""


@pytest.mark.parametrize(
    ("reading", "rule", "for_seconds"),
    [
        pytest.param(dict(eccDoubleBit={1: 2}), "NvidiaSmiDoubleEccError", 0, id="ecc-double-bit"),
        pytest.param(dict(externalProcesses=1), "GpuUsedByExternalProcess", 300, id="external-gpu-process"),
        pytest.param(dict(diskPercent=93.0), "NodeFilesystemUsage", 300, id="disk"),
        pytest.param(dict(memoryPercent=99.0), "NodeMemoryUsage", 0, id="memory"),
        pytest.param(dict(cpuPercent=97.0), "NodeCPUUsage", 0, id="cpu"),
    ],
)
def test_a_node_condition_fires_after_its_for_duration_and_resolves(reading, rule, for_seconds):
    core = core_with(NODE_RULES)
    t = T0
    core.node_sampled(NodeReading(node="n1", at=t, **reading))
    first = core.evaluate(t)
    if for_seconds:
        assert not of(first, AlertFired), "fired before its for-duration"
        t += for_seconds - 1
        core.node_sampled(NodeReading(node="n1", at=t, **reading))
        assert not of(core.evaluate(t), AlertFired)
        t += 1
        core.node_sampled(NodeReading(node="n1", at=t, **reading))
        first = core.evaluate(t)
    fired = of(first, AlertFired)
    assert [f.alert.rule for f in fired] == [rule]
    assert fired[0].alert.node == "n1" and fired[0].alert.startsAt == T0
    core.validate_state()

    t += 10
    core.node_sampled(NodeReading(node="n1", at=t))  # healthy again
    ended = of(core.evaluate(t), AlertEnded)
    assert [e.alert.rule for e in ended] == [rule]
    assert ended[0].alert.state is AlertState.RESOLVED and ended[0].alert.endsAt == t
    core.validate_state()


def test_a_condition_that_stops_before_its_for_duration_never_fires():
    core = core_with(NODE_RULES)
    core.node_sampled(NodeReading(node="n1", at=T0, diskPercent=95))
    core.evaluate(T0)
    core.node_sampled(NodeReading(node="n1", at=T0 + 200, diskPercent=50))
    core.evaluate(T0 + 200)
    core.node_sampled(NodeReading(node="n1", at=T0 + 400, diskPercent=95))
    assert not of(core.evaluate(T0 + 400), AlertFired), "the for-duration starts again"
    assert of(core.evaluate(T0 + 700), AlertFired)


def test_a_silent_node_is_not_ready_and_says_for_how_long():
    core = core_with(NODE_RULES)
    core.node_sampled(NodeReading(node="n1", at=T0))
    assert not of(core.evaluate(T0 + 120), AlertFired)  # exactly the threshold: still fine
    core.evaluate(T0 + 121)
    fired = of(core.evaluate(T0 + 181), AlertFired)
    assert fired[0].alert.rule == "NodeNotReady"
    assert "no sample from its agent for 3m" in fired[0].alert.summary  # 181 s silent when it fired


def test_a_node_reported_unhealthy_is_not_ready_with_the_reason():
    core = core_with(NODE_RULES)
    core.handle(NodeStatus(id=EventId("n2/lost"), job=JobId(""), node=NodeName("n2"), healthy=False,
                           reason="agent silent for 31 s"))
    core.evaluate(T0)
    fired = of(core.evaluate(T0 + 60), AlertFired)
    assert fired[0].alert.summary == "node n2 is not ready: agent silent for 31 s"
    core.handle(NodeStatus(id=EventId("n2/back"), job=JobId(""), node=NodeName("n2"), healthy=True))
    assert of(core.evaluate(T0 + 70), AlertEnded)


def test_a_node_kept_out_for_pressure_or_a_cordon_is_not_a_lost_node():
    core = core_with(NODE_RULES)
    core.node_sampled(NodeReading(node="n3", at=T0))
    core.handle(NodeStatus(id=EventId("n3/c"), job=JobId(""), node=NodeName("n3"), healthy=False,
                           reason="cordoned: replacing GPU 3", conditions=["cordoned"]))
    assert not of(core.evaluate(T0 + 100), AlertFired)
    core.handle(NodeStatus(id=EventId("n3/l"), job=JobId(""), node=NodeName("n3"), healthy=False,
                           reason="agent silent for 31 s", conditions=["cordoned", "lost"]))
    core.evaluate(T0 + 101)
    assert [f.alert.rule for f in of(core.evaluate(T0 + 161), AlertFired)] == ["NodeNotReady"]


JOB_RULES = """
rules:
- {name: PaiJobPending, when: job_waiting, threshold: 1h, actions: [email-admin, email-owner],
   summary: "job {job} of {user} has waited {value} in VC {vc}: {reason}"}
- {name: JobFailed, when: job_failed, window: 1h, sendResolved: false, actions: [email-owner, tag-job, stop-job],
   summary: "job {job} failed: {reason}"}
- {name: LowGpuUtilization, when: job_low_gpu_utilization, threshold: 10, window: 30m, actions: [email-owner],
   summary: "job {job} used {value}% of its GPUs"}
- {name: ServiceDown, when: service_not_ready, for: 2m, actions: [email-admin]}
"""


def test_a_job_waiting_too_long_fires_with_the_waiting_reason():
    core = core_with(JOB_RULES)
    core.handle(submitted("alice~big", T0))
    core.handle(JobWaiting(id=EventId("w"), job=JobId("alice~big"), vc=VcName("vc1"), attempt=1,
                           reason="VC vc1 has 2 of the 8 GPUs this job needs free"))
    assert not of(core.evaluate(T0 + 3600), AlertFired)
    fired = of(core.evaluate(T0 + 3601), AlertFired)
    assert fired[0].alert.summary == (
        "job alice~big of alice has waited 60m in VC vc1: VC vc1 has 2 of the 8 GPUs this job needs free")
    core.handle(state("alice~big", JobState.RUNNING, T0 + 4000))
    assert of(core.evaluate(T0 + 4000), AlertEnded)


def test_a_failed_job_fires_with_cause_and_solution_and_actions_once():
    core = core_with(JOB_RULES)
    core.handle(submitted("bob~t", T0))
    spec = ExitSpec(code=137, phrase="ContainerOOMKilled", reason="the task used more memory than it asked for",
                    solution=["ask for more memory"])
    core.handle(state("bob~t", JobState.FAILED, T0 + 10, spec=spec, code=137))
    out = core.evaluate(T0 + 10)
    alert = of(out, AlertFired)[0].alert
    assert alert.summary == "job bob~t failed: the task used more memory than it asked for"
    assert alert.solution == ["ask for more memory"] and alert.user == "bob"
    assert sorted(a.action.value for a in of(out, ActionDue)) == ["stop-job", "tag-job"]
    mail = of(out, Notification)[0]
    assert mail.toUsers == ("bob",) and not mail.toAdmins
    assert not of(core.evaluate(T0 + 20), ActionDue), "an action runs once per alert"
    resolved = core.evaluate(T0 + 3611)
    assert of(resolved, AlertEnded) and not of(resolved, Notification), "JobFailed sends no resolve notice"


def test_low_gpu_utilisation_over_the_window():
    core = core_with(JOB_RULES)
    core.handle(submitted("carol~idle", T0))
    core.handle(placed("carol~idle", "n1", [0, 1], T0))
    core.handle(state("carol~idle", JobState.RUNNING, T0))
    for step in range(0, 1801, 60):
        core.node_sampled(NodeReading(node="n1", at=T0 + step, gpuUtilization={0: 4.0, 1: 8.0, 2: 100.0}))
    assert not of(core.evaluate(T0 + 1799), AlertFired), "not running for a whole window yet"
    fired = of(core.evaluate(T0 + 1800), AlertFired)
    assert fired[0].alert.rule == "LowGpuUtilization" and "6.0" in fired[0].alert.summary
    for step in range(1860, 3700, 60):
        core.node_sampled(NodeReading(node="n1", at=T0 + step, gpuUtilization={0: 90.0, 1: 90.0}))
    assert of(core.evaluate(T0 + 3660), AlertEnded)


def test_a_service_not_ready_fires_after_two_minutes():
    core = core_with(JOB_RULES)
    core.service_probed(ServiceReading(service="scheduler", ready=False, at=T0, reason="connection refused"))
    core.evaluate(T0)
    fired = of(core.evaluate(T0 + 120), AlertFired)
    assert fired[0].alert.service == "scheduler" and "connection refused" in fired[0].alert.summary
    core.service_probed(ServiceReading(service="scheduler", ready=True, at=T0 + 130))
    assert of(core.evaluate(T0 + 130), AlertEnded)


def test_notifications_repeat_only_after_the_interval_and_a_resolve_notice_follows():
    core = core_with(NODE_RULES)
    core.node_sampled(NodeReading(node="n1", at=T0, memoryPercent=99))
    first = of(core.evaluate(T0), Notification)
    assert len(first) == 1 and first[0].toAdmins and not first[0].reminder
    for minute in range(1, 60):
        core.node_sampled(NodeReading(node="n1", at=T0 + minute * 60, memoryPercent=99))
        assert not of(core.evaluate(T0 + minute * 60), Notification)
    core.node_sampled(NodeReading(node="n1", at=T0 + 3600, memoryPercent=99))
    reminder = of(core.evaluate(T0 + 3600), Notification)
    assert len(reminder) == 1 and reminder[0].reminder
    core.node_sampled(NodeReading(node="n1", at=T0 + 3700, memoryPercent=20))
    resolved = of(core.evaluate(T0 + 3700), Notification)
    assert len(resolved) == 1 and resolved[0].resolved[0].rule == "NodeMemoryUsage" and not resolved[0].firing


def test_alerts_of_one_group_go_in_one_mail():
    core = core_with("rules: [{name: Mem, when: node_memory_usage, threshold: 90, actions: [email-admin], groupBy: []}]")
    for node in ("n1", "n2", "n3"):
        core.node_sampled(NodeReading(node=node, at=T0, memoryPercent=99))
    mails = of(core.evaluate(T0), Notification)
    assert len(mails) == 1 and {a.node for a in mails[0].firing} == {"n1", "n2", "n3"}


def test_a_lost_node_silences_alerts_about_it_and_its_jobs():
    core = core_with(NODE_RULES)
    core.handle(submitted("dave~j", T0))
    core.handle(placed("dave~j", "n1", [0], T0))
    core.handle(state("dave~j", JobState.RUNNING, T0))
    core.node_sampled(NodeReading(node="n1", at=T0, diskPercent=99))
    core.handle(NodeStatus(id=EventId("n1/lost"), job=JobId(""), node=NodeName("n1"), healthy=False, reason="lost"))
    core.evaluate(T0)
    core.handle(state("dave~j", JobState.FAILED, T0 + 300, spec=ExitSpec(code=-7, phrase="PodNodeLost")))
    out = core.evaluate(T0 + 300)
    fired = {f.alert.rule: f.alert for f in of(out, AlertFired)}
    assert set(fired) == {"NodeNotReady", "NodeFilesystemUsage", "JobFailed"}, "inhibited alerts are still listed"
    assert fired["JobFailed"].inhibitedBy == fired["NodeFilesystemUsage"].inhibitedBy == "NodeNotReady/n1"
    mails = of(out, Notification)
    assert [m.rule for m in mails] == ["NodeNotReady"]
    assert not of(out, ActionDue), "an inhibited alert runs no action"


def test_an_owner_asking_for_status_mail_gets_one_per_state_once():
    core = core_with(JOB_RULES)
    core.handle(submitted("erin~x", T0, notify=True))
    running = core.handle(state("erin~x", JobState.RUNNING, T0 + 1))
    assert [(n.kind, n.state, n.toUsers) for n in running] == [("job_state", "RUNNING", ("erin",))]
    assert core.handle(state("erin~x", JobState.RUNNING, T0 + 1)) == [], "a redelivered event mails nobody"
    done = core.handle(state("erin~x", JobState.SUCCEEDED, T0 + 9))
    assert done[0].id == "erin~x/1/SUCCEEDED"
    core.handle(submitted("fred~y", T0))
    assert core.handle(state("fred~y", JobState.FAILED, T0 + 1)) == [], "fred did not ask"


@pytest.mark.parametrize(
    ("states", "mailed"),
    [
        pytest.param((), ["running", "failed", "retried", "running", "failed"], id="true-means-the-usual-states"),
        pytest.param(("failed",), ["failed", "failed"], id="only-failed"),
        pytest.param(("retried", "succeeded"), ["retried"], id="only-retried"),
        pytest.param(("waiting", "stopping"), ["waiting"], id="a-retry-is-not-a-wait"),
    ],
)
def test_an_owner_is_mailed_on_the_states_they_asked_for(states, mailed):
    core = core_with(JOB_RULES)
    core.handle(submitted("gina~z", T0, notify=True, states=states))
    sent = []
    for attempt, new in [(1, JobState.WAITING), (1, JobState.RUNNING), (1, JobState.FAILED),
                         (2, JobState.WAITING), (2, JobState.RUNNING), (2, JobState.FAILED)]:
        for n in core.handle(state("gina~z", new, T0 + attempt, attempt=attempt)):
            sent.append("retried" if n.state == "WAITING" and n.attempt > 1 else n.state.lower())
    assert sent == mailed


def test_a_restart_neither_fires_again_nor_mails_before_the_repeat_interval():
    core = core_with(NODE_RULES)
    core.node_sampled(NodeReading(node="n1", at=T0, memoryPercent=99))
    out = core.evaluate(T0)
    stored_alerts = list(core.alerts.values())
    stored_groups = [n.group for n in of(out, Notification)]

    again = core_with(NODE_RULES)
    again.restore(stored_alerts, stored_groups)
    again.node_sampled(NodeReading(node="n1", at=T0 + 600, memoryPercent=99))
    out = again.evaluate(T0 + 600)
    assert not of(out, AlertFired) and not of(out, Notification)
    again.node_sampled(NodeReading(node="n1", at=T0 + 3600, memoryPercent=99))
    reminder = of(again.evaluate(T0 + 3600), Notification)
    assert [(n.rule, n.reminder) for n in reminder] == [("NodeMemoryUsage", True)]
    again.validate_state()


def test_rules_changed_at_run_time_apply_at_the_next_evaluation():
    core = core_with(NODE_RULES)
    core.node_sampled(NodeReading(node="n1", at=T0, memoryPercent=80))
    assert not of(core.evaluate(T0), AlertFired)
    core.set_rules(load_rules_text("rules: [{name: NodeMemoryUsage, when: node_memory_usage, threshold: 70}]"))
    assert of(core.evaluate(T0 + 1), AlertFired)
    core.set_rules(load_rules_text("rules: [{name: Other, when: node_cpu_usage}]"))
    assert of(core.evaluate(T0 + 2), AlertEnded), "an alert of a removed rule resolves"


def test_actions_named_by_configuration():
    core = core_with("rules: [{name: Ecc, when: gpu_ecc_double_bit, actions: [cordon-node]}]")
    core.node_sampled(NodeReading(node="n7", at=T0, eccDoubleBit={0: 1}))
    due = of(core.evaluate(T0), ActionDue)
    assert [(d.action, d.alert.node) for d in due] == [(Action.CORDON_NODE, "n7")]


@pytest.mark.parametrize("module", ["services.monitor.alerts.core", "services.monitor.alerts.compose",
                                    "services.monitor.alerts.report", "libs.common.alerts_messages"])
def test_the_alert_core_and_mail_text_load_no_io_library(module):
    """Imported in a fresh interpreter, so what other tests imported hides nothing."""
    import subprocess
    import sys
    from pathlib import Path

    code = (f"import importlib, sys; importlib.import_module({module!r}); "
            "print([n for n in ('asyncio', 'nats', 'aiohttp', 'aiosmtplib') if n in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("setting", "states"),
    [("true", []), ("{running: true, failed: true, succeeded: false}", ["failed", "running"]),
     ("{Retried: true}", ["retried"])],
)
def test_the_job_protocol_keeps_the_states_the_owner_asked_for(setting, states):
    from libs.common.protocol import parse_job

    body = ("protocolVersion: 2\nname: n\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n    commands: [echo]\n"
            f"extras:\n  jobStatusChangeNotification: {setting}\n")
    spec = parse_job(body, user="alice").spec
    assert spec.notifyOnStateChange is True and spec.notifyStates == states


@given(readings=st.lists(st.tuples(st.floats(0, 200_000), st.floats(0, 100)), max_size=300),
       cutoff=st.floats(0, 200_000))
def test_a_gpus_window_mean_is_the_mean_of_its_readings_in_the_window(readings, cutoff):
    from services.monitor.alerts.core import MAX_HISTORY_SECONDS, _History

    history = _History()
    kept: list[tuple[float, float]] = []
    for at, percent in readings:
        if kept and at <= kept[-1][0]:
            continue  # late readings are ignored
        history.append(at, percent)
        kept.append((at, percent))
    newest = kept[-1][0] if kept else 0.0
    in_window = [p for at, p in kept if at >= cutoff and at >= newest - MAX_HISTORY_SECONDS]
    mean = history.mean_since(max(cutoff, newest - MAX_HISTORY_SECONDS))
    if in_window:
        assert mean == pytest.approx(sum(in_window) / len(in_window), abs=1e-6)
    else:
        assert mean is None


# --- evaluation that skips what did not change ---------------------------------------


def test_a_firing_alert_is_re_rendered_when_its_facts_change_and_reminds_with_the_latest_text():
    core = core_with("repeatInterval: 10m\n" + JOB_RULES)
    core.handle(submitted("alice~big", T0))
    core.handle(JobWaiting(id=EventId("w"), job=JobId("alice~big"), vc=VcName("vc1"), attempt=1, reason="VC full"))
    core.evaluate(T0 + 3601)
    summaries = set()
    reminders = []
    for second in range(3615, 4300, 15):  # quiet rounds: nothing fires or resolves
        reminders += of(core.evaluate(T0 + second), Notification)
        summaries.add(core.alerts["PaiJobPending/alice~big/1"].summary)
        core.validate_state()
    assert len(summaries) == 12, "the waited time in the text follows the clock, minute by minute"
    assert [n.reminder for n in reminders] == [True]
    assert reminders[0].firing[0].summary.startswith("job alice~big of alice has waited 70m")


def test_an_alert_firing_during_quiet_rounds_is_inhibited_by_a_node_lost_later():
    core = core_with(NODE_RULES)
    core.handle(submitted("dave~j", T0))
    core.handle(placed("dave~j", "n1", [0], T0))
    core.handle(state("dave~j", JobState.FAILED, T0, spec=ExitSpec(code=1, phrase="UserError")))
    core.node_sampled(NodeReading(node="n1", at=T0))
    assert of(core.evaluate(T0), Notification)
    for second in range(15, 120, 15):
        assert not of(core.evaluate(T0 + second), Notification)
    core.handle(NodeStatus(id=EventId("n1/lost"), job=JobId(""), node=NodeName("n1"), healthy=False, reason="lost"))
    core.evaluate(T0 + 120)
    out = core.evaluate(T0 + 180)
    assert core.alerts["JobFailed/dave~j/1"].inhibitedBy == "NodeNotReady/n1"
    assert [m.rule for m in of(out, Notification)] == ["NodeNotReady"]
    core.validate_state()


def test_a_job_rule_alerts_for_at_most_the_bound_of_one_users_jobs_and_the_next_as_those_resolve():
    """A tenant whose jobs all fail raises JobFailed for `max_job_alerts_per_user` of them
    at once, not one per job (each a mail, a tag, and a record kept a day); another user's
    failure still fires. As the earliest failures leave the window, later ones get theirs."""
    core = AlertCore(load_rules_text(JOB_RULES), max_job_alerts_per_user=3)
    for i in range(5):
        core.handle(submitted(f"evil~j{i}", T0 + i))
        core.handle(state(f"evil~j{i}", JobState.FAILED, T0 + i, code=1))
    core.handle(submitted("bob~t", T0 + 5))
    core.handle(state("bob~t", JobState.FAILED, T0 + 5, code=1))
    out = core.evaluate(T0 + 10)
    fired = {f.alert.fingerprint for f in of(out, AlertFired)}
    assert fired == {"JobFailed/evil~j0/1", "JobFailed/evil~j1/1", "JobFailed/evil~j2/1", "JobFailed/bob~t/1"}
    assert core.held_back == {("JobFailed", "evil"): 2}
    assert {a.alert.job for a in of(out, ActionDue)} == {"evil~j0", "evil~j1", "evil~j2", "bob~t"}, "tags too"
    out = core.evaluate(T0 + 3600.5)  # evil~j0 has left JobFailed's hour
    assert {e.alert.fingerprint for e in of(out, AlertEnded)} == {"JobFailed/evil~j0/1"}
    assert {f.alert.fingerprint for f in of(out, AlertFired)} == {"JobFailed/evil~j3/1"}
    assert core.held_back == {("JobFailed", "evil"): 1}
    core.validate_state()


def test_resolved_alerts_are_forgotten_after_a_day():
    core = core_with(JOB_RULES)
    core.handle(submitted("bob~t", T0))
    core.handle(state("bob~t", JobState.FAILED, T0, code=1))
    core.evaluate(T0)
    core.evaluate(T0 + 3601)  # JobFailed's window is over: resolved
    assert core.alerts["JobFailed/bob~t/1"].state is AlertState.RESOLVED
    core.evaluate(T0 + 3601 + 86400)
    assert "JobFailed/bob~t/1" in core.alerts, "kept a whole day"
    core.evaluate(T0 + 3602 + 86400)
    assert "JobFailed/bob~t/1" not in core.alerts
    core.validate_state()


def test_a_failed_jobs_view_is_kept_as_long_as_the_longest_job_failed_window():
    """JobFailed lists a failed job for its window and no other rule reads one: its view
    goes then (it was kept a week whatever the rules said, so a tenant whose jobs fail
    fast grew the monitor for a week). A longer window, set later, keeps later failures
    longer and still lists them."""
    core = core_with(JOB_RULES)  # JobFailed: window 1h
    core.handle(submitted("bob~t", T0))
    core.handle(state("bob~t", JobState.FAILED, T0, code=1))
    core.evaluate(T0 + 3599)
    assert "bob~t" in core.jobs
    core.evaluate(T0 + 3601)
    assert "bob~t" not in core.jobs
    core.set_rules(load_rules_text(JOB_RULES.replace("window: 1h, sendResolved", "window: 2d, sendResolved")))
    core.handle(submitted("bob~u", T0 + 4000))
    core.handle(state("bob~u", JobState.FAILED, T0 + 4000, code=1))
    out = core.evaluate(T0 + 4000 + 86400)
    assert "bob~u" in core.jobs and "JobFailed/bob~u/1" in {f.alert.fingerprint for f in of(out, AlertFired)}
    core.evaluate(T0 + 4000 + 2 * 86400 + 1)
    assert not core.jobs
    core.validate_state()


@pytest.mark.parametrize("final", [JobState.SUCCEEDED, JobState.STOPPED])
def test_a_job_that_did_not_fail_is_forgotten_an_hour_after_it_ended(final: JobState):
    """No rule reads such a job again: kept only while the bus may still redeliver one of
    its events, which then finds it final (not a job RUNNING again)."""
    core = core_with(JOB_RULES)
    core.handle(submitted("bob~done", T0))
    core.handle(state("bob~done", JobState.RUNNING, T0 + 1))
    core.handle(state("bob~done", final, T0 + 10))
    core.handle(state("bob~done", JobState.RUNNING, T0 + 1))  # redelivered, late
    core.evaluate(T0 + 10 + 3599)
    assert core.jobs["bob~done"].state is final
    core.evaluate(T0 + 10 + 3601)
    assert not core.jobs
    core.validate_state()


def test_a_job_that_did_not_fail_keeps_no_placement_in_its_hour_and_a_failed_one_keeps_its_nodes():
    """An ended job's GPUs and nodes are read by no rule but JobFailed's (it names the nodes); the
    views of jobs that did not fail share one empty tuple, and a later job's placement is its own."""
    core = core_with(JOB_RULES)
    for job in ("bob~ok", "bob~bad", "bob~next"):
        core.handle(submitted(job, T0))
        core.handle(placed(job, "node-1", [0, 1], T0 + 1))
        core.handle(state(job, JobState.RUNNING, T0 + 2))
    core.handle(state("bob~ok", JobState.SUCCEEDED, T0 + 10))
    core.handle(state("bob~bad", JobState.FAILED, T0 + 10, spec=ExitSpec(code=1, phrase="UserError")))
    core.handle(placed("bob~next", "node-2", [3], T0 + 11))
    ok, bad, following = core.jobs["bob~ok"], core.jobs["bob~bad"], core.jobs["bob~next"]
    assert (ok.gpus, ok.nodes) == ((), ())
    assert bad.nodes == ("node-1",) and bad.gpus == (("node-1", 0), ("node-1", 1))
    assert following.gpus == (("node-2", 3),) and following.nodes == ("node-2",)
    core.validate_state()


def test_a_restored_job_that_succeeded_is_forgotten_an_hour_after_it_ended():
    core = core_with(JOB_RULES)
    core.restore_job(JobView(job="bob~old", user="bob", vc="vc1", state=JobState.SUCCEEDED, waitingSince=T0,
                             endedAt=T0 + 100))
    core.evaluate(T0 + 100 + 3599)
    assert "bob~old" in core.jobs
    core.evaluate(T0 + 100 + 3601)
    assert not core.jobs
