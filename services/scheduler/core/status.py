"""Read-only views of the scheduler for GET /api/v2/virtual-clusters and the portal."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from services.scheduler.core.jobs import JobRecord
    from services.scheduler.core.state import ClusterState


class VcSkuStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Leaf cells of one sku as seen by one VC."""

    sku: str
    guaranteed: int  # the VC's quota (virtual and pinned cells)
    used: int  # held by the VC's guaranteed jobs
    opportunistic: int  # held by the VC's opportunistic jobs, anywhere in the cluster
    total: int  # in the whole cluster
    unhealthy: int  # cells of the cluster on unhealthy nodes


class PinnedCellStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One pinned cell of a VC: what rest checks a job's pinnedCellId against at submit."""

    pinnedCellId: str
    sku: str
    leafCells: int  # in the whole pinned cell
    nodeLeafCells: int  # on its largest node: the most one task may have there


class VcStatus(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    skus: list[VcSkuStatus]
    queued: int  # attempts waiting for (more) cells
    running: int  # attempts holding cells
    pinnedCells: list[PinnedCellStatus] = []


def vc_status(state: ClusterState, jobs: Iterable[JobRecord]) -> list[VcStatus]:
    tree = state.tree
    used: dict[tuple[str, str], int] = {}
    oppo: dict[tuple[str, str], int] = {}
    queued: dict[str, int] = {}
    running: dict[str, int] = {}
    for job in jobs:
        counts = oppo if job.opportunistic else used
        for leaf in job.leaves():
            counts[(job.vc, leaf.sku)] = counts.get((job.vc, leaf.sku), 0) + 1
        if job.waiting:
            queued[job.vc] = queued.get(job.vc, 0) + 1
        if job.holds_cells:
            running[job.vc] = running.get(job.vc, 0) + 1
    result = []
    for name, vc in state.vcs.items():
        skus = list(vc.sku_guaranteed) + sorted({sku for (v, sku) in oppo if v == name} - set(vc.sku_guaranteed))
        result.append(VcStatus(
            name=name,
            skus=[VcSkuStatus(sku=sku, guaranteed=vc.sku_guaranteed.get(sku, 0), used=used.get((name, sku), 0),
                              opportunistic=oppo.get((name, sku), 0), total=tree.sku_leaves.get(sku, 0),
                              unhealthy=state.unhealthy_leaves.get(sku, 0)) for sku in skus],
            queued=queued.get(name, 0),
            running=running.get(name, 0),
            pinnedCells=[PinnedCellStatus(pinnedCellId=pin, sku=cell.sku, leafCells=cell.leaf_count,
                                          nodeLeafCells=cell.leaf_count if cell.in_node else
                                          max((node.leaf_count for node in cell.node_cells), default=0))
                         for pin, cell in vc.pinned.items()],
        ))
    return result
