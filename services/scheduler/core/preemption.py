"""Intra-VC preemption: which lower-priority guaranteed jobs of a VC give way to a job.

Lazy preemption first: lower-priority jobs that allow it are downgraded to
opportunistic one by one (they keep running, no longer counted in the VC's quota,
so the VC may bind other free cells). If the job then fits without touching their
cells, that is the answer and nobody is killed. Otherwise the downgrades are undone
exactly and victims are chosen for real: lowest priority first, then the most
recently started, adding one at a time until the job fits.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from services.scheduler.core.jobs import JobRecord
from services.scheduler.core.planner import Plan, plan_guaranteed
from services.scheduler.core.search import View
from services.scheduler.core.state import ClusterState, VcRecord


def plan_with_victims(state: ClusterState, record: JobRecord, vc: VcRecord, sku: str, sizes: list[int],
                      holding: Iterable[JobRecord], quota_free: int, *, pin: str | None = None) -> Plan | None:
    """A plan whose cells may be held by lower-priority jobs of the VC (they are the victims), or None.

    `quota_free`: leaf cells of the VC's quota its guaranteed work does not hold.
    """
    priority = record.priority
    lower = [job for job in holding
             if job.priority < priority and sku in job.held_skus and not job.opportunistic
             and not job.preempting and job.placed]
    if not lower:
        return None
    total = sum(sizes)
    held_by_lower = {job: sum(len(leaves) for leaves in job.placed.values() if leaves[0].sku == sku) for job in lower}
    if quota_free + sum(held_by_lower.values()) < total:
        return None  # not even with every lower-priority job gone
    lower.sort(key=lambda j: (j.priority, -j.seq))
    # A job still waiting for more tasks (incremental) is not downgraded: it would change queues.
    lazy = [job for job in lower if job.lazy and not job.waiting]
    if lazy and quota_free + sum(held_by_lower[job] for job in lazy) >= total:
        plan = _plan_with_downgrades(state, vc, sku, sizes, lazy, pin)
        if plan is not None:
            return plan
    # Whether it fits at all with every candidate gone, before looking for the fewest victims.
    everyone = View(take_oppo=True, extra_leaves=[leaf for job in lower for leaf in job.leaves()])
    plan = plan_guaranteed(state, vc, sku, sizes, everyone, pin=pin)
    if plan is None:
        return None
    plan.abandon()
    view = View(take_oppo=True)
    for job in lower:
        for leaf in job.leaves():
            view.add_extra(leaf)
        plan = plan_guaranteed(state, vc, sku, sizes, view, pin=pin)
        if plan is not None:
            return plan
    return None


def _plan_with_downgrades(state: ClusterState, vc: VcRecord, sku: str, sizes: list[int],
                          lazy: list[JobRecord], pin: str | None) -> Plan | None:
    downgraded: list[JobRecord] = []
    with state.unbinds_recorded() as unbound:
        for job in lazy:
            state.refresh_job_leaves(job, partial(setattr, job, "opportunistic", True))
            downgraded.append(job)
            excluded = [leaf for j in downgraded for leaf in j.leaves()]
            plan = plan_guaranteed(state, vc, sku, sizes, View(take_oppo=True, excluded=excluded), pin=pin)
            if plan is not None:
                return plan  # the downgraded jobs keep running as opportunistic work
        for vc_record, quota, cell in reversed(unbound):
            state.bind(vc_record, quota, cell)
        for job in reversed(downgraded):
            state.refresh_job_leaves(job, partial(setattr, job, "opportunistic", False))
        return None
