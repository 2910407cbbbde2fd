"""`validate_state()`: the scheduler's invariants, checked from scratch (for tests)."""

from __future__ import annotations

from services.scheduler.core.cells import FREE, INSIDE, SPLIT, TAKEN, leaf_counts, node_of
from services.scheduler.core.jobs import JobRecord
from services.scheduler.core.lifecycle import check_state
from services.scheduler.core.queues import Queues
from services.scheduler.core.state import ClusterState, _holds


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def check_invariants(state: ClusterState, jobs: dict[str, JobRecord], queues: Queues) -> None:
    tree = state.tree
    # Counters: every cell's free/oppo equal what its leaves add up to.
    for cell in reversed(tree.all_cells):
        if cell.is_leaf:
            free, oppo = leaf_counts(cell)
        else:
            free = sum(child.free for child in cell.children)
            oppo = sum(child.oppo for child in cell.children)
        _require((cell.free, cell.oppo) == (free, oppo),
                 f"counters of {cell.address} are free={cell.free} oppo={cell.oppo}, expected {free}/{oppo}")

    for totals in tree.sku_totals.values():
        leaves = [leaf for leaf in tree.leaves_by_address.values() if leaf.sku == totals.sku]
        _require((totals.free, totals.oppo) == (sum(leaf.free for leaf in leaves), sum(leaf.oppo for leaf in leaves)),
                 f"{totals.address}: counters are off")

    # No over-allocation: a leaf holds at most one attempt, and exactly the one that lists it.
    owner: dict[int, JobRecord] = {}
    for job in jobs.values():
        for (role, index), leaves in job.placed.items():
            nodes = {node_of(leaf).name for leaf in leaves}
            _require(len(nodes) == 1, f"task {job.id} {role}[{index}] spans nodes {sorted(nodes)}")
            for leaf in leaves:
                _require(id(leaf) not in owner, f"cell {leaf.address} is given to both {owner.get(id(leaf))} and {job}")
                owner[id(leaf)] = job
                _require(leaf.job is job, f"cell {leaf.address} of {job} records {leaf.job}")
        for _, _, plan in job.reserved:
            for leaves in plan:
                for leaf in leaves:
                    _require(leaf.reserved_for is job, f"cell {leaf.address} reserved by {job} records {leaf.reserved_for}")
    for leaf in tree.leaves_by_address.values():
        if leaf.job is not None:
            _require(owner.get(id(leaf)) is leaf.job, f"cell {leaf.address} is held by {leaf.job}, which does not list it")
        if leaf.reserved_for is not None:
            _require(jobs.get(leaf.reserved_for.id) is leaf.reserved_for,
                     f"cell {leaf.address} is reserved for {leaf.reserved_for}, which is gone")

    # Guaranteed work stays inside its VC's bound (or pinned) cells.
    for job in jobs.values():
        if job.opportunistic:
            continue
        pins = {(task.role, task.index): task.pin for group in job.groups for task in group.tasks}
        for task, leaves in job.placed.items():
            pin = pins.get(task)
            for leaf in leaves:
                _require(leaf.unit is not None and leaf.unit.vc == job.vc,
                         f"guaranteed job {job.id} of VC {job.vc} runs on {leaf.address} outside its VC's cells")
                if pin is not None and leaf.unit is not None:
                    _require(leaf.unit.pinned_id == pin and leaf.unit.quota_key is None,
                             f"job {job.id} runs on {leaf.address} outside pinned cell {pin}")
        # Gang: a group placed together is there entirely or not at all (restored attempts excepted).
        if not job.restored:
            for group in (g for g in job.groups if g.gang):
                placed = sum((t.role, t.index) in job.placed or (t.role, t.index) in job.released_tasks
                             for t in group.tasks)
                _require(placed in (0, len(group.tasks)),
                         f"gang {group.name} of {job.id} has {placed} of {len(group.tasks)} tasks placed")

    # Quotas, bindings and held counts.
    for vc in state.vcs.values():
        for (chain_name, type_name), quota in vc.quotas.items():
            _require(len(quota.bound) <= quota.total, f"VC {vc.name} bound {len(quota.bound)} {type_name} cells of {quota.total}")
            for cell in quota.bound:
                _require(cell.buddy == TAKEN and cell.vc == vc.name and cell.type == type_name and cell.chain == chain_name,
                         f"{cell.address} is listed as bound to VC {vc.name} but is not")
                held = sum(_holds(leaf) for leaf in cell.leaves)
                _require(cell.held == held, f"{cell.address} held={cell.held}, expected {held}")
                _require(held > 0, f"{cell.address} stays bound to VC {vc.name} with nothing of it there")
                _require(all(leaf.unit is cell for leaf in cell.leaves), f"leaves of {cell.address} do not point to it")
        for cell in vc.pinned.values():
            _require(cell.buddy == TAKEN and cell.vc == vc.name, f"pinned cell {cell.address} is not VC {vc.name}'s")
            _require(cell.held == sum(_holds(leaf) for leaf in cell.leaves), f"pinned {cell.address} held count is off")

    # Buddy free lists: the states match the lists, and free buddies are merged.
    for chain in tree.chains.values():
        listed = {cell for cells in chain.free.values() for cell in cells}
        for top in chain.tops:
            stack = [(top, False)]
            while stack:
                cell, inside = stack.pop()
                if inside:
                    _require(cell.buddy == INSIDE, f"{cell.address} inside a free or taken cell has state {cell.buddy}")
                else:
                    _require(cell.buddy in (FREE, SPLIT, TAKEN), f"{cell.address} on the frontier has state {cell.buddy}")
                    _require((cell.buddy == FREE) == (cell in listed), f"{cell.address} free-list membership is wrong")
                    if cell.buddy == SPLIT:
                        _require(not all(child.buddy == FREE for child in cell.children),
                                 f"{cell.address} is split but all its children are free")
                for child in cell.children:
                    stack.append((child, inside or cell.buddy in (FREE, TAKEN)))
        unbound_free = sum(leaf.free for top in chain.tops for leaf in top.leaves if leaf.unit is None)
        unbound_oppo = sum(leaf.oppo for top in chain.tops for leaf in top.leaves if leaf.unit is None)
        _require((chain.unbound_free, chain.unbound_oppo) == (unbound_free, unbound_oppo),
                 f"chain {chain.name}: unbound counters are {chain.unbound_free}/{chain.unbound_oppo}, "
                 f"expected {unbound_free}/{unbound_oppo}")
        # VC safety: what every VC may still bind can be carved out of the free cells.
        _require(state.chain_is_safe(chain), f"chain {chain.name}: the VCs' unbound quota no longer fits its free cells")

    # The queues hold exactly the waiting attempts, in order, each in its lane and sku lists.
    queue = []
    for lane, lane_jobs in queues.lanes.items():
        keys = [job.key for job in lane_jobs]
        _require(keys == sorted(keys), f"the queue of {lane or 'opportunistic jobs'} is out of order")
        for job in lane_jobs:
            _require(queues.lane_of(job) == lane, f"{job} is queued in the wrong lane {lane}")
            for sku in job.skus if job.skus else (None,):
                _require(job in queues.by_sku.get((lane, sku), ()), f"{job} is missing from the {sku} list")
        queue.extend(lane_jobs)
    in_sku_lists = sum(len(jobs_of_sku) for jobs_of_sku in queues.by_sku.values())
    _require(in_sku_lists == sum(len(job.skus) or 1 for job in queue), "a sku list holds a job its lane does not")
    _require(len({id(job) for job in queue}) == len(queue), "a job is queued twice")
    for job in queue:
        _require(jobs.get(job.id) is job and job.waiting, f"{job} is queued but not waiting")
    queued = {id(job) for job in queue}
    for key, job in jobs.items():
        if job.waiting and not job.preempting:
            _require(job in queue, f"{job} waits but is not queued")
        _require(job.id == key, f"{job} is recorded as {key}")
        # Each state's promises (lifecycle.py): e.g. a PLACED attempt holds cells, a QUEUED one none.
        problem = check_state(job, id(job) in queued)
        _require(problem is None, f"{job} in state {job.state.value} {problem}")
