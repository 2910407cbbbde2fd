"""What the scheduler publishes in KV for others to read.

Bucket pai_schedule, key `user.name`: where a job's current attempt stands in the
scheduler (waiting with a reason, or placed). Bucket pai_cluster, key `vcs`: the
per-VC view for GET /api/v2/virtual-clusters, key `nodes`: node names and health.
"""

from __future__ import annotations

from typing import Any

import msgspec

from libs.common.messages import TaskPlacement
from libs.common.protocol.model import JobSpec

CLUSTER_VCS_KEY = "vcs"


class ScheduleEntry(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    attempt: int
    vc: str
    placed: bool = False
    reason: str = ""  # why it waits, in words a person can act on
    tasks: list[TaskPlacement] = []  # the placement, once placed (for recovery)
    updatedAt: float = 0.0
    # What the scheduler needs to queue the job again after its own restart.
    spec: JobSpec | None = None
    queuedAt: float = 0.0
    # A guaranteed job's attempt placed outside its VC's quota as opportunistic work (the core's shape
    # fallback): a restarted scheduler restores it as such, not bound into the quota.
    borrowed: bool = False
    # Tasks whose cells went back while the attempt goes on (a role with gangReleaseEnable: false):
    # a restarted scheduler neither holds their cells nor places them again.
    releasedTasks: list[tuple[str, int]] = []


class ClusterView(msgspec.Struct, frozen=True, kw_only=True):
    """Free-form per-VC status as the scheduler core reports it."""

    virtualClusters: list[dict[str, Any]] = []
    # {name, cells: [{address, cellType, sku, leafCells, pinnedCellId}]} per node
    nodes: list[dict[str, Any]] = []
    # sku -> {gpu, cpu, memory (MB), maxLeafCellsPerNode}: what one leaf cell offers
    skuTypes: dict[str, dict[str, Any]] = {}
    updatedAt: float = 0.0
