"""What a job may use (skus, cells) and whether it can ever be placed as submitted.

"Never" is judged on the config alone (unknown VC, sku or pinned cell, a task
bigger than any node, a gang bigger than the VC's quota or the whole cluster), so
it is decided once per attempt; node health is a matter of waiting, not of never.
"""

from __future__ import annotations

from services.scheduler.cluster.model import ClusterConfig
from services.scheduler.core.demand import NO_FIT, GroupDemand, leaf_cells_for
from services.scheduler.core.jobs import JobRecord
from services.scheduler.core.state import ClusterState, VcRecord


def candidate_skus(state: ClusterState, record: JobRecord, vc: VcRecord, group: GroupDemand) -> list[str]:
    """The skus a group may be placed on: the one it names, else any the job may use."""
    if group.sku is not None:
        return [group.sku]
    if record.opportunistic:
        return list(state.tree.sku_chains)
    if group.pin is not None:
        pinned = vc.pinned.get(group.pin)
        return [pinned.sku] if pinned is not None else []
    return vc.skus


def never_fits(config: ClusterConfig, state: ClusterState, record: JobRecord) -> str | None:
    """Why the attempt can never be placed under this config, or None."""
    vc = state.vcs.get(record.vc)
    if vc is None:
        known = ", ".join(sorted(state.vcs)) or "none"
        return f"VC {record.vc} does not exist (VCs: {known})"
    if not record.spec.taskRoles:
        return "the job has no task roles"
    for pinned_id in dict.fromkeys(group.pin for group in record.groups if group.pin is not None):
        if not record.opportunistic and pinned_id not in vc.pinned:
            have = ", ".join(sorted(vc.pinned)) or "none"
            return f"pinned cell {pinned_id} is not pinned to VC {vc.name} (its pinned cells: {have})"
    for group in record.pending_groups:
        problem = _group_never_fits(config, state, record, vc, group)
        if problem is not None:
            return problem
    return None


def _group_never_fits(config: ClusterConfig, state: ClusterState, record: JobRecord, vc: VcRecord,
                      group: GroupDemand) -> str | None:
    tree = state.tree
    guaranteed = not record.opportunistic
    pinned_id = group.pin
    if group.sku is not None:
        if group.sku not in tree.sku_chains:
            return f"no sku {group.sku} in the cluster (skus: {', '.join(tree.sku_chains) or 'none'})"
        if guaranteed and pinned_id is None and group.sku not in vc.sku_virtual:
            pins = [pin for pin, cell in vc.pinned.items() if cell.sku == group.sku]
            if pins:
                return (f"sku {group.sku} of VC {vc.name} is only in its pinned cells ({', '.join(pins)}); "
                        f"name one with pinnedCellId")
            have = ", ".join(vc.skus) or "no cells"
            return f"no sku {group.sku} in VC {vc.name} (it has {have}); submit as opportunistic to use idle cells"
        if guaranteed and pinned_id is not None and vc.pinned[pinned_id].sku != group.sku:
            return f"pinned cell {pinned_id} has sku {vc.pinned[pinned_id].sku}, not {group.sku}"
    skus = candidate_skus(state, record, vc, group)
    if not skus:
        return f"VC {vc.name} has no cells"
    problems = []
    for sku in skus:
        problem = _sku_never_fits(config, state, record, vc, group, sku)
        if problem is None:
            return None
        problems.append(problem)
    return "; ".join(problems)


def _sku_never_fits(config: ClusterConfig, state: ClusterState, record: JobRecord, vc: VcRecord,
                    group: GroupDemand, sku: str) -> str | None:
    sku_type = config.skuTypes[sku]
    tree = state.tree
    largest_node = tree.sku_max_node_leaves.get(sku, 0)
    sizes = []
    for task in group.tasks:
        size = leaf_cells_for(task, sku_type)
        if size == NO_FIT:
            return f"task role {task.role} asks for {task.gpu} GPUs but sku {sku} has none"
        if size > largest_node:
            return (f"task {task.role}[{task.index}] needs {size} {sku} cells on one node but the largest "
                    f"{sku} node has {largest_node}")
        sizes.append(size)
    needed = sum(sizes) if group.gang else max(sizes)
    pinned_id = group.pin
    if record.opportunistic:
        capacity, where = tree.sku_leaves.get(sku, 0), "the cluster has"
    elif pinned_id is not None:
        capacity, where = vc.pinned[pinned_id].leaf_count, f"pinned cell {pinned_id} has"
    else:
        capacity, where = vc.sku_virtual.get(sku, 0), f"VC {vc.name} is guaranteed"
    if needed > capacity:
        return f"needs {needed} {sku} cells at once but {where} only {capacity}"
    return None
