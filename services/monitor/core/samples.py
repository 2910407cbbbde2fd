"""What the monitor stores about a node: one `NodeSample` per node in the `pai_nodes` bucket.

The monitor is the only writer of `pai_nodes`; the key is the node name (see
`node_key`), the value the JSON of the latest sample. Readers (the portal, the
scheduler's node health, alert rules) decode it with `decode_node_sample`.

Field names are camelCase like every other document on the bus. Schema
evolution: new fields get defaults; no field changes type.
"""

from __future__ import annotations

import msgspec

from libs.common.nodes import node_key as node_key  # re-exported: one rule for both buckets


class GpuProcess(msgspec.Struct, frozen=True, kw_only=True):
    """A process holding a GPU context, as NVML lists it."""

    pid: int
    # None where the driver cannot tell (e.g. inside some containers).
    usedMemoryBytes: int | None = None


class ExternalGpuProcess(msgspec.Struct, frozen=True, kw_only=True):
    """A process holding a GPU that belongs to no PAI task."""

    minorNumber: str
    pid: int


class TaskGpuUsage(msgspec.Struct, frozen=True, kw_only=True):
    """One task on one GPU."""

    minorNumber: str
    gpuPercent: float | None = None  # the card's busy percent (cards are not shared by tasks)
    gpuMemPercent: float | None = None  # the task's share of the card's memory


class TaskUsage(msgspec.Struct, frozen=True, kw_only=True):
    """What one PAI task uses on this node (services/monitor/core/tasks.py)."""

    key: str
    username: str = ""
    jobName: str = ""  # the job id user~name, as PAI_JOB_NAME
    roleName: str = ""
    taskIndex: str = ""
    virtualCluster: str = ""
    cpuPercent: float = 0.0  # of the whole node
    memoryBytes: int = 0  # resident memory of all its processes
    gpus: list[TaskGpuUsage] = []  # the GPUs its processes hold a context on
    gpuCount: int = 0  # the GPUs placed for it (PAI_GPU_COUNT), used or not


class GpuSample(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU at sample time. A reading NVML could not give is None, not 0:
    "unknown" and "idle" must not look alike on a dashboard."""

    index: int
    uuid: str
    minorNumber: int | None = None
    name: str = ""
    utilizationGpuPercent: float | None = None
    utilizationMemoryPercent: float | None = None
    memoryUsedBytes: int | None = None
    memoryTotalBytes: int | None = None
    temperatureCelsius: float | None = None
    powerWatts: float | None = None
    performanceState: int | None = None  # P0 (fastest) .. P15; None when unknown
    # ECC error counts by OpenPAI's type label: volatile_single, volatile_double
    # (since the driver loaded), aggregated_single, aggregated_double (lifetime).
    # Empty where the board has no ECC or it is off.
    eccErrors: dict[str, int] = {}
    processes: list[GpuProcess] = []
    # Why some readings are missing ("memory: Not Supported", "GPU is lost", ...).
    errors: list[str] = []


class NodeSample(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    at: float  # wall-clock seconds of the sample
    cpuCount: int = 0
    cpuPercent: float = 0.0
    memoryUsedBytes: int = 0
    memoryTotalBytes: int = 0
    load1: float = 0.0
    load5: float = 0.0
    load15: float = 0.0
    # The file system holding PAI's data dir (task logs, the NATS store).
    diskPath: str = ""
    diskUsedBytes: int = 0
    diskTotalBytes: int = 0
    gpus: list[GpuSample] = []
    # Why `gpus` is empty when it is: "" with GPUs, else e.g. "NVML not available:
    # NVML Shared Library Not Found" (a node without GPUs is a normal node).
    gpuNote: str = ""
    # The PAI tasks running here and what they use; GPU processes of no task.
    tasks: list[TaskUsage] = []
    externalGpuProcesses: list[ExternalGpuProcess] = []
    # Which agent took the sample ("" before agents said so).
    agent: str = ""


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(NodeSample)


def encode_node_sample(sample: NodeSample) -> bytes:
    return _encoder.encode(sample)


def decode_node_sample(data: bytes) -> NodeSample:
    """Raises msgspec.ValidationError/DecodeError on a value that is not a NodeSample."""
    return _decoder.decode(data)
