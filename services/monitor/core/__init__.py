"""The monitor's pure part: events -> metric updates, NVML readings -> node samples.

Synchronous and deterministic, no I/O: the service shell feeds it events and
readings and applies what it returns to Prometheus and the `pai_nodes` bucket.
"""

from services.monitor.core.gpus import NvmlReading, gpu_sample, merge_processes
from services.monitor.core.recent import RecentIds
from services.monitor.core.samples import (
    GpuProcess,
    GpuSample,
    NodeSample,
    decode_node_sample,
    encode_node_sample,
    node_key,
)
from services.monitor.core.series import Series, gpu_series, node_series
from services.monitor.core.stored import StoredJob, decode_stored_job
from services.monitor.core.tally import FAILURE_OUTCOME, SUCCESS_OUTCOME, MonitorCore
from services.monitor.core.updates import (
    EventCounted,
    JobsGauge,
    NodeCount,
    NodeUp,
    SubmitToRunning,
    TaskExitCounted,
    Update,
)

__all__ = [
    "FAILURE_OUTCOME",
    "SUCCESS_OUTCOME",
    "EventCounted",
    "GpuProcess",
    "GpuSample",
    "JobsGauge",
    "MonitorCore",
    "NodeCount",
    "NodeSample",
    "NodeUp",
    "NvmlReading",
    "RecentIds",
    "Series",
    "StoredJob",
    "SubmitToRunning",
    "TaskExitCounted",
    "Update",
    "decode_node_sample",
    "decode_stored_job",
    "encode_node_sample",
    "gpu_sample",
    "gpu_series",
    "merge_processes",
    "node_key",
    "node_series",
]
