"""What the alert rules read from the node agent's samples and the launcher's records."""

from __future__ import annotations

from libs.common.ids import EventId, JobId, NodeName
from libs.common.messages import ExitSpec, JobState, NodeStatus
from libs.common.protocol.model import JobSpec
from libs.common.records import AttemptRecord, JobRecord, TaskRecord
from services.monitor.alerts.core import AlertCore, AlertFired, Notification
from services.monitor.alerts.rules import load_rules_text
from services.monitor.alerts.shell import job_view_of, reading_of
from services.monitor.core.samples import ExternalGpuProcess, GpuSample, NodeSample

GIB = 1024**3


def test_a_node_sample_becomes_the_rules_reading():
    sample = NodeSample(
        node="gpu-3", at=1000.0, cpuPercent=97.5, memoryUsedBytes=60 * GIB, memoryTotalBytes=64 * GIB,
        diskUsedBytes=930, diskTotalBytes=1000,
        gpus=[
            GpuSample(index=0, uuid="GPU-a", utilizationGpuPercent=88.0, eccErrors={"volatile_double": 2, "volatile_single": 9}),
            GpuSample(index=1, uuid="GPU-b", utilizationGpuPercent=None, eccErrors={"aggregated_double": 5}),
            GpuSample(index=2, uuid="GPU-c", utilizationGpuPercent=0.0),
        ],
        externalGpuProcesses=[ExternalGpuProcess(minorNumber="2", pid=4242)],
    )
    reading = reading_of(sample)
    assert reading.node == "gpu-3" and reading.at == 1000.0
    assert reading.cpuPercent == 97.5
    assert reading.memoryPercent == 93.75 and reading.diskPercent == 93.0
    # OpenPAI's NvidiaSmiDoubleEccError counts volatile double-bit errors (since the driver loaded).
    assert reading.eccDoubleBit == {0: 2}
    assert reading.externalProcesses == 1
    assert reading.gpuUtilization == {0: 88.0, 2: 0.0}, "an unknown reading is not an idle GPU"


def test_a_node_without_gpus_or_totals_has_no_percentages():
    reading = reading_of(NodeSample(node="cpu-1", at=5.0))
    assert reading.memoryPercent is None and reading.diskPercent is None
    assert reading.eccDoubleBit == {} and reading.gpuUtilization == {} and reading.externalProcesses == 0


def _record(state: JobState, **times) -> JobRecord:
    spec = JobSpec(name="t", user="alice", virtualCluster="vc1", notifyOnStateChange=True,
                   notifyStates=["failed"], notifyEmails=["team@example.com"])
    return JobRecord(
        job="alice~t", name="t", user="alice", vc="vc1", spec=spec, state=state, attempt=2,
        createdTime=10.0, launchedTime=50.0, **times,
        attempts=[AttemptRecord(attempt=1, createdTime=10.0),
                  AttemptRecord(attempt=2, createdTime=40.0, tasks=[
                      TaskRecord(role="w", index=0, node="n1", gpus=[0, 1]),
                      TaskRecord(role="w", index=1, node="n2", gpus=[3])])],
    )


def test_a_running_job_record_becomes_the_view_a_restarted_monitor_starts_from():
    view = job_view_of(_record(JobState.RUNNING))
    assert (view.state, view.attempt, view.waitingSince, view.runningSince) == (JobState.RUNNING, 2, 40.0, 50.0)
    assert view.failedAt is None and view.exitSpec is None
    assert view.gpus == (("n1", 0), ("n1", 1), ("n2", 3)) and view.nodes == ("n1", "n2")
    assert view.notify and view.notifyStates == ("failed",) and view.notifyEmails == ("team@example.com",)


def test_a_failed_job_record_keeps_what_its_rules_read_and_not_its_gpus_or_mail_settings():
    oom = ExitSpec(code=137, phrase="ContainerOOMKilled")
    view = job_view_of(_record(JobState.FAILED, completedTime=90.0, appExitSpec=oom, appExitCode=137))
    # Times as the live view has them: the last attempt waited from 40.
    assert (view.state, view.attempt, view.waitingSince, view.runningSince) == (JobState.FAILED, 2, 40.0, 50.0)
    assert view.failedAt == 90.0 and view.exitSpec == oom and view.exitCode == 137
    assert view.nodes == ("n1", "n2"), "JobFailed names them, and a lost one inhibits it"
    # A finished job never runs or changes state again: no GPUs, no status mail.
    assert view.gpus == () and not view.notify and view.notifyEmails == ()
    succeeded = job_view_of(_record(JobState.SUCCEEDED, completedTime=90.0))
    assert (succeeded.waitingSince, succeeded.failedAt, succeeded.nodes, succeeded.gpus) == (40.0, None, (), ())


def test_a_job_failed_on_a_lost_node_before_a_restart_mails_only_the_node_alert():
    """The monitor restarts between a job's failure and its JobFailed alert: the
    restored view still knows the job's nodes, so the lost node's alert inhibits it."""
    core = AlertCore(load_rules_text(RULES))
    oom = ExitSpec(code=-7, phrase="PodNodeLost")
    core.restore_job(job_view_of(_record(JobState.FAILED, completedTime=90.0, appExitSpec=oom, appExitCode=-7)))
    core.handle(NodeStatus(id=EventId("n2/lost"), job=JobId(""), node=NodeName("n2"), healthy=False, reason="lost"))
    out = core.evaluate(100.0)
    fired = {f.alert.rule: f.alert for f in out if isinstance(f, AlertFired)}
    assert set(fired) == {"NodeNotReady", "JobFailed"}
    assert fired["JobFailed"].nodes == ["n1", "n2"] and fired["JobFailed"].inhibitedBy == "NodeNotReady/n2"
    assert [n.rule for n in out if isinstance(n, Notification)] == ["NodeNotReady"]


RULES = """
inhibit: [{source: NodeNotReady, targets: [JobFailed]}]
rules:
- {name: NodeNotReady, when: node_not_ready, threshold: 2m, actions: [email-admin]}
- {name: JobFailed, when: job_failed, window: 1h, sendResolved: false, actions: [email-owner]}
"""
