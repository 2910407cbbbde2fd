"""Read-only views of the scheduler for GET /api/v2/virtual-clusters and the portal."""

from __future__ import annotations

import msgspec


class VcSkuStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Leaf cells of one sku as seen by one VC."""

    sku: str
    guaranteed: int  # the VC's quota (virtual and pinned cells)
    used: int  # held by the VC's guaranteed jobs
    opportunistic: int  # held by the VC's opportunistic jobs, anywhere in the cluster
    total: int  # in the whole cluster
    unhealthy: int  # cells of the cluster on unhealthy nodes


class VcStatus(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    skus: list[VcSkuStatus]
    queued: int  # attempts waiting for (more) cells
    running: int  # attempts holding cells
