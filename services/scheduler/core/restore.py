"""Re-occupying the cells of attempts that were running before a restart or a reconfiguration.

Work-preserving: every leaf that still exists is taken again as it was. A
guaranteed job needs its leaves inside cells bound to its VC; those are bound
again here. When that is impossible under the (possibly new) config -- the VC is
gone, its quota shrank, the cell is now another VC's, or binding would break
another VC's guarantee -- the job keeps running as opportunistic work and a
warning says so. A guaranteed job placed outside its quota as borrowed work (the
core's shape fallback; `Restore.borrowed`, from its pai_schedule entry) is restored
as opportunistic work too, without trying to bind. (The launcher's own record does
not carry the mark: an attempt adopted from it alone is bound into its VC's quota
when that still can be done.) Leaves that no longer exist are reported and left out.
"""

from __future__ import annotations

from libs.common.messages import TaskPlacement
from services.scheduler.core.cells import Cell
from services.scheduler.core.jobs import JobRecord
from services.scheduler.core.state import ClusterState, Quota, VcRecord


def restore_attempt(state: ClusterState, record: JobRecord, tasks: list[TaskPlacement], *,
                    borrowed: bool = False, released: list[tuple[str, int]] | None = None) -> list[str]:
    """`borrowed`: a guaranteed job's attempt that ran outside its VC's quota (shape fallback); it
    stays opportunistic work, as before the restart, rather than be bound into the quota now.
    `released`: tasks whose cells went back early (gangReleaseEnable: false): not placed again."""
    warnings: list[str] = []
    known_tasks = {(task.role, task.index) for group in record.groups for task in group.tasks}
    record.released_tasks = {(str(role), int(index)) for role, index in released or ()} & known_tasks
    tasks = [task for task in tasks if (task.role, task.index) not in record.released_tasks]
    placed: dict[tuple[str, int], list[Cell]] = {}
    for task in tasks:
        key = (task.role, task.index)
        if key not in known_tasks:
            warnings.append(f"{record.id}: task {task.role}[{task.index}] is not in the job's spec; left out")
            continue
        leaves = []
        for address in task.leafCells:
            leaf = state.tree.leaves_by_address.get(address)
            if leaf is None:
                warnings.append(f"{record.id}: cell {address} of task {task.role}[{task.index}] no longer exists")
                continue
            if leaf.job is not None:
                warnings.append(f"{record.id}: cell {address} of task {task.role}[{task.index}] is already "
                                f"held by {leaf.job.id}")
                continue
            leaves.append(leaf)
        if leaves:
            placed[key] = leaves
    all_leaves = [leaf for leaves in placed.values() for leaf in leaves]
    if borrowed and not record.opportunistic:
        record.opportunistic = True
        record.borrowed = True
    if not record.opportunistic:
        pins = {(task.role, task.index): task.pin for group in record.groups for task in group.tasks}
        problem = _bind_for(state, record, [(pins.get(key), leaves) for key, leaves in placed.items()])
        if problem is not None:
            warnings.append(f"{record.id}: {problem}; it keeps running as an opportunistic job")
            record.opportunistic = True
    for key, leaves in placed.items():
        for leaf in leaves:
            state.set_leaf(leaf, job=record, reserved_for=None)
        record.placed[key] = leaves
    # Groups the launcher only partly restored get their missing tasks placed later.
    record.pending_groups = [group for group in record.groups
                             if not all((t.role, t.index) in record.placed or (t.role, t.index) in record.released_tasks
                                        for t in group.tasks)]
    for unit in dict.fromkeys(leaf.unit for leaf in all_leaves if leaf.unit is not None):
        state.unbind_if_idle(unit)
    return warnings


def _bind_for(state: ClusterState, record: JobRecord, tasks: list[tuple[str | None, list[Cell]]]) -> str | None:
    """Bind the VC cells these leaves need (each task's with its pin, if any); on failure nothing stays
    bound and the problem is returned. A pinned task's leaves must lie in its pinned cell."""
    vc = state.vcs.get(record.vc)
    if vc is None:
        return f"VC {record.vc} no longer exists"
    for pinned_id in dict.fromkeys(pin for pin, _ in tasks if pin is not None):
        pinned = vc.pinned.get(pinned_id)
        if pinned is None:
            return f"pinned cell {pinned_id} is no longer pinned to VC {vc.name}"
        outside = [leaf.address for pin, leaves in tasks if pin == pinned_id for leaf in leaves
                   if pinned not in leaf.ancestors]
        if outside:
            return f"cells {', '.join(outside)} are outside pinned cell {pinned_id}"
    leaves = [leaf for pin, task_leaves in tasks if pin is None for leaf in task_leaves]
    bound_now: list[tuple[Quota, Cell]] = []
    for leaf in leaves:
        if leaf.unit is not None:
            if leaf.unit.vc == vc.name and leaf.unit.quota_key is not None:
                continue
            _undo(state, vc, bound_now)
            return f"cell {leaf.address} now belongs to VC {leaf.unit.vc}"
        found = _bind_one(state, vc, leaf)
        if found is None:
            _undo(state, vc, bound_now)
            return f"cell {leaf.address} cannot be bound to VC {vc.name} within its quota"
        bound_now.append(found)
    return None


def _bind_one(state: ClusterState, vc: VcRecord, leaf: Cell) -> tuple[Quota, Cell] | None:
    for quota in vc.sku_quotas.get(leaf.sku, ()):
        if quota.chain.name != leaf.chain or quota.unbound <= 0:
            continue
        cell = next((c for c in leaf.ancestors if isinstance(c, Cell) and c.type == quota.type), None)
        if cell is None or not state.bindable_cell_for(cell):
            continue
        state.bind(vc, quota, cell)
        if state.chain_is_safe(quota.chain):
            return quota, cell
        _undo(state, vc, [(quota, cell)])
    return None


def _undo(state: ClusterState, vc: VcRecord, bound: list[tuple[Quota, Cell]]) -> None:
    for quota, cell in reversed(bound):
        state.release_unit(vc, quota, cell)
