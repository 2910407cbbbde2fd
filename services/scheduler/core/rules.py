"""Small rules of the policy read about one attempt: pure functions of the policy, the attempt and
the cells (no bookkeeping of their own), shared by the pass walk, the planners and the core."""

from __future__ import annotations

from services.scheduler.cluster.model import ClusterConfig
from services.scheduler.core.cells import CellTree
from services.scheduler.core.demand import TaskDemand, leaf_cells_for
from services.scheduler.core.jobs import JobRecord
from services.scheduler.core.policy import SchedulingPolicy, ShapeFallback
from services.scheduler.core.state import VcRecord

# (gpu, cpu, memoryMB, tasks needed at once, pinnedCellId): see shape_of.
Shape = tuple[int, int, int, int, str | None]


def cells_for(config: ClusterConfig, tasks: list[TaskDemand], sku: str) -> int:
    """Leaf cells of the sku these tasks take together."""
    sku_type = config.skuTypes[sku]
    return sum(leaf_cells_for(task, sku_type) for task in tasks)


def over_budget(policy: SchedulingPolicy, record: JobRecord) -> bool:
    """An opportunistic job preempted often enough to be kept off cells a VC's quota holds."""
    return record.opportunistic and record.preemptions >= policy.opportunistic_preemption_budget


def large_borrower(policy: SchedulingPolicy, tree: CellTree, sku: str, largest_task: int) -> bool:
    """Opportunistic work with a task of half a node or more, not a whole one: only on cells no VC holds.

    Such a borrower can only take the holes of VC cells, which their VC takes back as soon
    as its guaranteed work grows (compaction); on the Philly replay at 8x, 4-GPU borrowers
    that had run for days in such holes were a third of the work thrown away. On cells no
    VC holds it is taken back only when a VC must bind a cell and no idle one is left.
    """
    node = tree.sku_max_node_leaves.get(sku, 0)
    return policy.large_borrowers_unheld and node > largest_task and largest_task * 2 >= node


def kept_unheld(policy: SchedulingPolicy, config: ClusterConfig, tree: CellTree, record: JobRecord) -> bool:
    """An opportunistic job kept to cells no VC holds on some sku it may use (over its budget, or a
    large borrower there): its failing tells nothing of jobs that may use a VC's idle cells."""
    if not record.opportunistic or not record.pending_groups:
        return False
    if over_budget(policy, record):
        return True
    tasks = record.pending_groups[0].tasks
    return any(large_borrower(policy, tree, sku, max(cells_for(config, [task], sku) for task in tasks))
               for sku in record.skus)


def fallback_kind(policy: SchedulingPolicy, record: JobRecord) -> ShapeFallback | None:
    """Where this guaranteed job may run as borrowed work when its VC's cells have no room for its
    shape (the BORROW placement mode): None (nowhere), idle cells or cells no VC holds. Known at
    submission (the bucket key holds it): a job placed all at once (one group, gang or a single
    task), not pinned, not restored; one preempted as often as an opportunistic job's budget
    allows goes only to cells no VC holds."""
    if policy.shape_fallback is None or record.opportunistic or record.restored or record.spec.pinned:
        return None
    if len(record.groups) != 1 or not (record.groups[0].gang or len(record.groups[0].tasks) == 1):
        return None
    if record.preemptions >= policy.opportunistic_preemption_budget:
        return ShapeFallback.UNHELD
    return policy.shape_fallback


def may_age(policy: SchedulingPolicy, record: JobRecord) -> bool:
    """Whether a gang past its deadline may come to hold back backfill: not one that can never fit,
    nor one over its preemption budget (its reason is no wait for room)."""
    return record.never is None and not over_budget(policy, record)


def quota_free(record: JobRecord, vc: VcRecord, sku: str, pin: str | None = None) -> int:
    """Leaf cells of the VC's quota (or of the pinned cell `pin`) its guaranteed work does not hold."""
    if record.opportunistic:
        return 0
    if pin is not None:
        pinned = vc.pinned.get(pin)
        return pinned.leaf_count - pinned.held if pinned is not None else 0
    return vc.sku_virtual.get(sku, 0) - vc.held.get(sku, 0)


def shape_of(record: JobRecord) -> Shape | None:
    """The job's shape when it is one group of equal tasks, else None: a job whose shape is at least
    as large fails wherever this one failed (see dominates)."""
    if len(record.groups) != 1:
        return None
    tasks = record.groups[0].tasks
    first = tasks[0]
    if any((t.gpu, t.cpu, t.memoryMB) != (first.gpu, first.cpu, first.memoryMB) for t in tasks):
        return None
    if any(t.cells is not None for t in tasks):
        return None  # a skuNumber: its size is not the resources' (no shape to compare by)
    at_once = len(tasks) if record.groups[0].gang else 1
    return (first.gpu, first.cpu, first.memoryMB, at_once, record.groups[0].pin)


def dominates(shape: Shape, failed: Shape) -> bool:
    """Whether a job of `shape` needs at least what a job of shape `failed` needed (same pinning)."""
    return (shape[4] == failed[4] and shape[0] >= failed[0] and shape[1] >= failed[1] and shape[2] >= failed[2]
            and shape[3] >= failed[3])


def bucket_of(policy: SchedulingPolicy, record: JobRecord) -> tuple[object, ...]:
    """Jobs of one bucket ask for the same thing: one fits only where the one before it fits."""
    if record.never is not None:
        return ("never",)
    if record.shape is None or not policy.bucketed:
        return ("one", record.seq, record.id)
    return ("same", record.vc if record.opportunistic else None, record.shape, tuple(sorted(record.skus_set)),
            over_budget(policy, record) if record.opportunistic else fallback_kind(policy, record))


def cell_hours_run(job: JobRecord, now: float) -> float:
    """The work a preemption of `job` would throw away: hours run x leaf cells held (GPU-hours for GPU skus).

    A restored attempt's start is unknown (`placed_at` is -inf): it counts as infinitely costly.
    """
    assert job.placed_at is not None, f"{job} holds no cells"
    return (now - job.placed_at) * sum(len(leaves) for leaves in job.placed.values()) / 3600
