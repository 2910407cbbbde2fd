"""Every Prometheus metric of the monitor, and how core updates and node samples set them.

All live in prometheus-client's default registry, which the service shell serves
on `/metrics`. Names follow OpenPAI where it has one (`pai_node_count`,
`nvidiasmi_utilization_gpu`, ...).
"""

from __future__ import annotations

from collections import Counter as TallyCounter
from collections.abc import Iterable
from typing import TypeVar, cast

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from services.monitor.core.nodes import NodeConditionCounts
from services.monitor.core.samples import NodeSample
from services.monitor.core.series import (
    ECC_LABELS,
    EXTERNAL_PROCESS_LABELS,
    GPU_LABELS,
    TASK_GPU_LABELS,
    TASK_LABELS,
    node_series,
)
from services.monitor.core.updates import (
    EventCounted,
    JobsGauge,
    NodeCount,
    NodeUp,
    SubmitToRunning,
    TaskExitCounted,
    Update,
)

NODE_COUNT_LABELS = ("ready", "disk_pressure", "memory_pressure", "unschedulable")

# From 5 ms (an idle local cluster) to an hour (a busy VC's queue); about three
# buckets per decade so the quantiles stay meaningful at every scale.
SUBMIT_TO_RUNNING_BUCKETS = (
    0.005, 0.01, 0.02, 0.05, 0.075, 0.1, 0.2, 0.35, 0.5, 0.75,
    1.0, 2.0, 3.5, 5.0, 7.5, 10.0, 20.0, 30.0, 45.0, 60.0,
    120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip

jobs = Gauge("pai_jobs", "Jobs by current state, per virtual cluster; a final state counts the jobs still live "
             "(finished within live_finished_job_seconds, at most live_finished_job_max).", ["state", "vc"])
submit_to_running_seconds = Histogram(
    "pai_job_submit_to_running_seconds",
    "Seconds from a job's submission to the first time it runs.",
    ["vc"],
    buckets=SUBMIT_TO_RUNNING_BUCKETS,
)
events_total = Counter("pai_events_total", "Events seen on the bus, by kind.", ["kind"])
task_exits_total = Counter(
    "pai_task_exits_total",
    'Task exits by virtual cluster and outcome: "success", or the phrase of the failure verdict.',
    ["vc", "outcome"],
)
node_count = Gauge(
    "pai_node_count",
    "Nodes by condition, as OpenPAI: ready (not lost, no GPU ECC error), disk_pressure, "
    "memory_pressure, unschedulable (cordoned).",
    list(NODE_COUNT_LABELS),
)
node_up = Gauge("pai_node_up", "1 while a node is healthy, 0 when it is reported unhealthy.", ["node"])

# Gauges of this machine, set from each node sample. They are registered through
# `_ThisNode` (below), which adds the `node` label once the agent names its node.
_NODE_GAUGES: dict[str, Gauge] = {
    name: Gauge(name, doc, registry=None)
    for name, doc in {
        "pai_node_cpu_percent": "CPU busy percent over the last sample period.",
        "pai_node_memory_used_bytes": "Memory in use (total minus available).",
        "pai_node_memory_total_bytes": "Physical memory.",
        "pai_node_load1": "1-minute load average.",
        "pai_node_load5": "5-minute load average.",
        "pai_node_load15": "15-minute load average.",
        "pai_node_data_disk_used_bytes": "Used bytes of the file system of PAI's data dir.",
        "pai_node_data_disk_total_bytes": "Size of the file system of PAI's data dir.",
        "nvidiasmi_attached_gpus": "GPUs NVML reports on this machine.",
    }.items()
}
# Labelled gauges of this machine (GPUs, tasks, external GPU processes): a series
# whose GPU, task or process went away is removed at the next sample.
_GPU_GAUGES: dict[str, Gauge] = {
    name: Gauge(name, doc, list(labels), registry=None)
    for name, (doc, labels) in {
        "nvidiasmi_utilization_gpu": ("GPU busy percent (NVML utilization.gpu).", GPU_LABELS),
        "nvidiasmi_utilization_memory": ("GPU memory-controller busy percent (NVML utilization.memory).", GPU_LABELS),
        "nvidiasmi_memory_used_bytes": ("GPU memory in use.", GPU_LABELS),
        "nvidiasmi_memory_total_bytes": ("GPU memory.", GPU_LABELS),
        "nvidiasmi_temperature": ("GPU core temperature in degrees Celsius.", GPU_LABELS),
        "nvidiasmi_process_count": ("Processes holding a context on the GPU.", GPU_LABELS),
        "nvidiasmi_power_draw_watts": ("GPU power draw in watts.", GPU_LABELS),
        "nvidiasmi_performance_state": ("GPU performance state: 0 (P0, fastest) to 15.", GPU_LABELS),
        "nvidiasmi_ecc_error_count": (
            "ECC errors by type: volatile_single/double (since the driver loaded), aggregated_single/double (lifetime).",
            ECC_LABELS,
        ),
        "task_cpu_percent": ("CPU busy percent of the whole node used by a PAI task's processes.", TASK_LABELS),
        "task_mem_usage_byte": ("Resident memory of a PAI task's processes.", TASK_LABELS),
        "task_gpu_percent": ("Busy percent of a GPU a PAI task holds.", TASK_GPU_LABELS),
        "task_gpu_mem_percent": ("Percent of a GPU's memory a PAI task's processes hold.", TASK_GPU_LABELS),
        "gpu_used_by_external_process_count": (
            "1 for each process holding a GPU that belongs to no PAI task.",
            EXTERNAL_PROCESS_LABELS,
        ),
    }.items()
}


class _ThisNode(Collector):
    """The agent's gauges, each series labelled `node` with the name of the node
    the agent samples, once `label_node` named it. OpenPAI's job-exporter leaves
    that to Prometheus's target labels; PAI's dashboards pick one node by `node`,
    and under `pai up` no service discovery adds it. The label is added, never
    renamed: OpenPAI's names and labels stay as they are. (The chart's PodMonitor
    honours it, so the series do not also get an `exported_node`.)"""

    def __init__(self, gauges: list[Gauge]):
        self.gauges = gauges
        self.node = ""

    def collect(self) -> Iterable[Metric]:
        for gauge in self.gauges:
            for family in gauge.collect():
                if self.node:
                    family.samples = [s._replace(labels={**s.labels, "node": self.node}) for s in family.samples]
                yield family


_this_node = _ThisNode([*_NODE_GAUGES.values(), *_GPU_GAUGES.values()])
REGISTRY.register(_this_node)


def label_node(node: str) -> None:
    """From now on every series of this machine carries `node="<node>"` (the agent calls it)."""
    _this_node.node = node


# Label sets set by the previous sample, to drop the series of what went away.
_gpu_series_shown: dict[str, set[tuple[str, ...]]] = {name: set() for name in _GPU_GAUGES}


# Labelled children already looked up: `labels()` costs a lock and a tuple build
# per call, and a batch of events touches the same few series many times. Only
# series that are never removed are cached here (none of apply's are).
_children: dict[tuple[MetricWrapperBase, tuple[str, ...]], MetricWrapperBase] = {}
_Metric = TypeVar("_Metric", bound=MetricWrapperBase)


def _child(metric: _Metric, *labels: str) -> _Metric:
    child = _children.get((metric, labels))
    if child is None:
        child = _children[(metric, labels)] = metric.labels(*labels)
    return cast(_Metric, child)  # a metric's children are of its own type


def apply(updates: Iterable[Update | NodeConditionCounts]) -> None:
    """Set what `updates` say; counter increments of a batch are summed per series first."""
    increments: TallyCounter[tuple[Counter, tuple[str, ...]]] = TallyCounter()
    for update in updates:
        match update:
            case JobsGauge(vc=vc, state=state, count=count):
                _child(jobs, state, vc).set(count)
            case SubmitToRunning(vc=vc, seconds=seconds):
                _child(submit_to_running_seconds, vc).observe(seconds)
            case EventCounted(kind=kind):
                increments[(events_total, (kind,))] += 1
            case TaskExitCounted(vc=vc, outcome=outcome):
                increments[(task_exits_total, (vc, outcome))] += 1
            case NodeUp(node=node, up=up):
                _child(node_up, node).set(1 if up else 0)
            case NodeConditionCounts(counts=counts):
                for condition_labels, count in counts.items():
                    _child(node_count, *condition_labels).set(count)
            case NodeCount():
                pass  # the nodes the event tally saw; pai_node_count comes from node health
            case _:
                raise TypeError(f"not a monitor update: {update!r}")
    for (metric, labels), n in increments.items():
        _child(metric, *labels).inc(n)


def record_node_sample(sample: NodeSample) -> None:
    shown: dict[str, set[tuple[str, ...]]] = {name: set() for name in _GPU_GAUGES}
    for series in node_series(sample):
        if series.name in _GPU_GAUGES:
            _GPU_GAUGES[series.name].labels(*series.labels).set(series.value)
            shown[series.name].add(series.labels)
        else:
            _NODE_GAUGES[series.name].set(series.value)
    for name, gauge in _GPU_GAUGES.items():
        for labels in _gpu_series_shown[name] - shown[name]:
            gauge.remove(*labels)
        _gpu_series_shown[name] = shown[name]


# --- JetStream's fill (services/monitor/store_fill.py) ---
STREAM_LABELS = ("stream", "bucket")  # the JetStream stream, and the KV bucket it holds ("" for PAI_EVENTS)
store_bytes = Gauge("pai_jetstream_store_bytes", "Bytes JetStream stores for PAI's account (every stream and bucket).")
store_max_bytes = Gauge("pai_jetstream_store_max_bytes", "The account's JetStream storage limit (no series: unlimited).")
stream_bytes = Gauge("pai_jetstream_stream_bytes", "Bytes a stream or bucket holds.", list(STREAM_LABELS))
stream_max_bytes = Gauge("pai_jetstream_stream_max_bytes", "A stream's or bucket's byte limit (discard-new: past it, "
                         "writes are refused; no series: unlimited).", list(STREAM_LABELS))
stream_messages = Gauge("pai_jetstream_stream_messages", "Messages a stream or bucket holds.", list(STREAM_LABELS))
stream_max_messages = Gauge("pai_jetstream_stream_max_messages", "A stream's or bucket's message limit "
                            "(no series: unlimited).", list(STREAM_LABELS))


def record_store(*, used: int, limit: int | None) -> None:
    store_bytes.set(used)
    if limit is None:
        store_max_bytes.clear()
    else:
        store_max_bytes.set(limit)


def record_stream(stream: str, bucket: str, *, used_bytes: int, messages: int, max_bytes: int | None,
                  max_messages: int | None) -> None:
    """One stream's fill; a limit of -1 or 0 (none) leaves its max series out."""
    stream_bytes.labels(stream, bucket).set(used_bytes)
    stream_messages.labels(stream, bucket).set(messages)
    for gauge, limit in ((stream_max_bytes, max_bytes), (stream_max_messages, max_messages)):
        if limit is not None and limit > 0:
            gauge.labels(stream, bucket).set(limit)
        else:
            try:
                gauge.remove(stream, bucket)
            except KeyError:
                pass


# --- alerts (services/monitor/alerts; docs/alerts.md) ---
alerts_firing = Gauge("pai_alerts_firing", "Alerts firing now, silenced ones included, by rule and severity.",
                      ["rule", "severity"])
alert_mails_total = Counter("pai_alert_mails_total", "Alert, job-state and report mail by outcome (sent, not_sent).",
                            ["kind", "outcome"])
alert_evaluation_seconds = Histogram("pai_alert_evaluation_seconds", "CPU-bound time of one evaluation of every rule.",
                                     buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0))
alert_deliveries_total = Counter(
    "pai_alert_deliveries_total",
    "Posts to Alertmanager and the alert webhook by outcome: sent, failed (retried), refused (a 4xx; not retried).",
    ["receiver", "outcome"])
_alerts_shown: set[tuple[str, str]] = set()


def record_alerts_firing(counts: dict[tuple[str, str], int]) -> None:
    """Set pai_alerts_firing to `counts` ((rule, severity) -> n), dropping series no longer firing."""
    global _alerts_shown
    for labels, count in counts.items():
        alerts_firing.labels(*labels).set(count)
    for labels in _alerts_shown - set(counts):
        alerts_firing.remove(*labels)
    _alerts_shown = set(counts)
