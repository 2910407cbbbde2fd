"""Placement modes: the ways a group of tasks may be placed, each decided by one planner.

A job's tasks are tried mode by mode, in the order `modes_for` gives, and within a mode
sku by sku (`Candidate`, in the order `candidates` gives); the first plan found wins:

    opportunistic job              IDLE
    guaranteed job                 FREE_BOUND, OPPO_BOUND, FREE, TAKE_OPPO, VICTIMS
      (compact_before_binding off) FREE, TAKE_OPPO, VICTIMS
    in the shape fallback's walk   BORROW

A planner reads the cells and the policy and returns a `Plan` (the leaves of each task,
the VC cells to bind) or None; it commits nothing: the core turns the chosen plan into
placements (`Placed`) or reservations while victims stop (`Reserved`). To change one
placement rule, change its planner here and its table in
tests/unit/scheduler/test_planners.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from libs.common.messages import TaskPlacement
from services.scheduler.core.borrowers import Borrowers, IdleReserve
from services.scheduler.core.demand import TaskDemand, leaf_cells_for
from services.scheduler.core.jobs import JobRecord
from services.scheduler.core.planner import Plan, plan_guaranteed, plan_opportunistic
from services.scheduler.core.policy import SchedulingPolicy, ShapeFallback
from services.scheduler.core.preemption import plan_with_victims
from services.scheduler.core.rules import cell_hours_run, fallback_kind, large_borrower, over_budget, quota_free
from services.scheduler.core.search import View
from services.scheduler.core.state import ClusterState, VcRecord


class PlacementMode(Enum):
    IDLE = "idle"  # opportunistic work: idle cells, those no VC holds first (budget and reserve permitting)
    FREE_BOUND = "free-bound"  # free leaves of the cells the VC holds, binding none
    OPPO_BOUND = "oppo-bound"  # ... and the youngest borrowers' leaves there, unless they ran too long
    FREE = "free"  # free leaves of the VC's cells, binding more of its quota
    TAKE_OPPO = "oppo"  # ... and the youngest borrowers' leaves, binding where that helps
    VICTIMS = "victims"  # lower-priority guaranteed work of the VC gives way (lazily downgraded first)
    BORROW = "borrow"  # shape fallback: idle cells outside the quota, as borrowed work


@dataclass(frozen=True, slots=True)
class Candidate:
    """One sku the tasks may go to: their sizes in leaf cells, largest first, and where each came from."""

    sku: str
    order: list[int]  # task index of each size
    sizes: list[int]
    quota_free: int  # leaf cells of the VC's quota (or pinned cell) its guaranteed work does not hold
    pin: str | None = None  # the pinned cell the tasks must go to (guaranteed work)

    @property
    def total(self) -> int:
        return sum(self.sizes)


@dataclass(slots=True)
class PlanContext:
    """What planners read besides the job: the cells, the policy, and the core's borrower books."""

    state: ClusterState
    policy: SchedulingPolicy
    clock: Callable[[], float]
    holding: Mapping[str, Mapping[JobRecord, None]]  # VC -> attempts holding cells of it
    borrowers: Borrowers
    reserve: IdleReserve


@dataclass(frozen=True, slots=True)
class Choice:
    """The plan a planner found: the tasks in the plan's order, on `sku`."""

    mode: PlacementMode
    sku: str
    tasks: list[TaskDemand]
    plan: Plan


@dataclass(frozen=True, slots=True)
class Placed:
    """The tasks run now: their placements."""

    tasks: list[TaskPlacement]


@dataclass(frozen=True, slots=True)
class Reserved:
    """The cells are reserved while these victims stop (Preempt given); placed on their Release."""

    victims: tuple[str, ...]


Outcome = Placed | Reserved | None  # None: the tasks wait
Planner = Callable[[PlanContext, JobRecord, VcRecord, Candidate], "Plan | None"]


# --- the planners ------------------------------------------------------------------------


def plan_idle(ctx: PlanContext, record: JobRecord, vc: VcRecord, cand: Candidate) -> Plan | None:
    """Opportunistic work: idle cells no VC holds first, then holes in VC cells; only the former for a
    job over its preemption budget or a large borrower; the adaptive reserve stays idle."""
    unheld_only = over_budget(ctx.policy, record) or large_borrower(ctx.policy, ctx.state.tree, cand.sku, cand.sizes[0])
    return plan_opportunistic(ctx.state, cand.sku, cand.sizes, View(), unheld_only=unheld_only,
                              reserve=ctx.reserve.for_sku(cand.sku))


def plan_free_bound(ctx: PlanContext, record: JobRecord, vc: VcRecord, cand: Candidate) -> Plan | None:
    """Compaction, first step: free leaves of the cells the VC holds already."""
    if cand.quota_free < cand.total:
        return None  # the VC's quota is used up: only preemption inside it can help
    return plan_guaranteed(ctx.state, vc, cand.sku, cand.sizes, View(), bind=False, pin=cand.pin)


def plan_oppo_bound(ctx: PlanContext, record: JobRecord, vc: VcRecord, cand: Candidate) -> Plan | None:
    """Compaction, second step: the youngest borrowers in the cells the VC holds give way, unless they
    ran more than compaction_cost_limit while the VC may still bind (then FREE or TAKE_OPPO, which
    may take younger borrowers where binding may)."""
    if cand.quota_free < cand.total or ctx.state.tree.sku_totals[cand.sku].oppo == 0:
        return None  # quota used up, or no opportunistic work to take: the same as the first try
    plan = plan_taking_youngest(ctx, record, vc, cand.sku, cand.sizes, bind=False, pin=cand.pin)
    if plan is not None and costly_compaction(ctx, record, vc, cand.sku, plan):
        return None
    return plan


def plan_free(ctx: PlanContext, record: JobRecord, vc: VcRecord, cand: Candidate) -> Plan | None:
    """Free leaves of the VC's cells, binding more of its quota (buddy allocation) when needed."""
    if cand.quota_free < cand.total:
        return None
    return plan_guaranteed(ctx.state, vc, cand.sku, cand.sizes, View(), bind=True, pin=cand.pin)


def plan_take_oppo(ctx: PlanContext, record: JobRecord, vc: VcRecord, cand: Candidate) -> Plan | None:
    """Free leaves plus those of the fewest youngest borrowers that make the job fit, binding allowed."""
    if cand.quota_free < cand.total or ctx.state.tree.sku_totals[cand.sku].oppo == 0:
        return None
    return plan_taking_youngest(ctx, record, vc, cand.sku, cand.sizes, bind=True, pin=cand.pin)


def plan_victims(ctx: PlanContext, record: JobRecord, vc: VcRecord, cand: Candidate) -> Plan | None:
    """Lower-priority guaranteed jobs of the VC give way (preemption.py); jobs lazily downgraded on the
    way are opportunistic work from now on."""
    holding = ctx.holding.get(vc.name, {})
    plan = plan_with_victims(ctx.state, record, vc, cand.sku, cand.sizes, holding, cand.quota_free, pin=cand.pin)
    if plan is not None:
        for job in holding:
            if job.opportunistic:
                ctx.borrowers.note(job)
    return plan


def plan_borrow(ctx: PlanContext, record: JobRecord, vc: VcRecord, cand: Candidate) -> Plan | None:
    """Shape fallback: the VC's unused quota holds the job in count, but every cell the VC holds has some
    of its work on it and it may bind no more, so no mode above found room. Rather than wait for
    one of its own jobs to end, it runs now on idle cells, as borrowed work: opportunistic while it
    runs (preemptible, not counted in the quota); a preemption queues it again as guaranteed."""
    kind = fallback_kind(ctx.policy, record)
    if kind is None or record.placed or record.reserved:
        return None
    if cand.quota_free < cand.total:
        return None  # over its quota: not a shape problem
    return plan_opportunistic(ctx.state, cand.sku, cand.sizes, View(), unheld_only=kind is ShapeFallback.UNHELD)


PLANNERS: dict[PlacementMode, Planner] = {
    PlacementMode.IDLE: plan_idle,
    PlacementMode.FREE_BOUND: plan_free_bound,
    PlacementMode.OPPO_BOUND: plan_oppo_bound,
    PlacementMode.FREE: plan_free,
    PlacementMode.TAKE_OPPO: plan_take_oppo,
    PlacementMode.VICTIMS: plan_victims,
    PlacementMode.BORROW: plan_borrow,
}

_COMPACTING = (PlacementMode.FREE_BOUND, PlacementMode.OPPO_BOUND, PlacementMode.FREE, PlacementMode.TAKE_OPPO,
               PlacementMode.VICTIMS)
_BINDING = (PlacementMode.FREE, PlacementMode.TAKE_OPPO, PlacementMode.VICTIMS)


def modes_for(record: JobRecord, policy: SchedulingPolicy, *, falling_back: bool) -> tuple[PlacementMode, ...]:
    """The modes tried for the job, in order. In the shape fallback's walk a guaranteed job found no
    room in its VC earlier in the pass (nor would the rest of its bucket): only BORROW is left."""
    if record.opportunistic:
        return (PlacementMode.IDLE,)
    if falling_back:
        return (PlacementMode.BORROW,)
    return _COMPACTING if policy.compact_before_binding else _BINDING


def candidates(ctx: PlanContext, record: JobRecord, vc: VcRecord, tasks: list[TaskDemand],
               skus: list[str]) -> list[Candidate]:
    """The skus the tasks may go to, in the order to try them, each with the tasks' sizes there."""
    state = ctx.state
    if len(skus) > 1:
        # Any sku will do: the one with the most free cells first (shortest wait, spreads the load).
        if record.opportunistic:
            totals = state.tree.sku_totals
            skus = sorted(skus, key=lambda sku: -totals[sku].free)
        else:
            skus = sorted(skus, key=lambda sku: vc.held.get(sku, 0) - vc.sku_virtual.get(sku, 0))
    max_node = state.tree.sku_max_node_leaves
    pin = None if record.opportunistic else tasks[0].pin  # the tasks come from one group: one pin
    found = []
    for sku in skus:
        sku_type = state.config.skuTypes[sku]
        cells = [leaf_cells_for(task, sku_type) for task in tasks]
        order = sorted(range(len(tasks)), key=lambda i: -cells[i])
        sizes = [cells[i] for i in order]
        if sizes[0] <= max_node.get(sku, 0):
            found.append(Candidate(sku, order, sizes, quota_free(record, vc, sku, pin), pin))
    return found


def choose(ctx: PlanContext, record: JobRecord, vc: VcRecord, tasks: list[TaskDemand], skus: list[str], *,
           falling_back: bool) -> Choice | None:
    """The first plan of the first mode that finds one, trying every candidate sku in each mode."""
    found = candidates(ctx, record, vc, tasks, skus)
    for mode in modes_for(record, ctx.policy, falling_back=falling_back):
        planner = PLANNERS[mode]
        for cand in found:
            plan = planner(ctx, record, vc, cand)
            if plan is not None:
                return Choice(mode, cand.sku, [tasks[i] for i in cand.order], plan)
    return None


# --- what the planners share -------------------------------------------------------------


def plan_taking_youngest(ctx: PlanContext, record: JobRecord, vc: VcRecord, sku: str, sizes: list[int], *,
                         bind: bool = True, pin: str | None = None) -> Plan | None:
    """Free cells plus those of the fewest most recently started opportunistic jobs that make the job fit.

    Opportunistic work restarts from scratch when preempted, so taking the youngest
    jobs throws away the least GPU time. A longer prefix of the youngest-first list
    only adds usable leaves, so the shortest prefix that fits is found by doubling,
    then bisection: O(log n) searches for n running opportunistic jobs.
    """
    state = ctx.state
    # A tried plan binds cells and gives them back, which reorders the buddy free lists; they are put
    # back in order after each try, so every try (and the final plan) starts from the same state.
    # Without binding, no free list is touched: nothing to put back.
    chains = state.tree.sku_chains.get(sku, ()) if bind else ()
    order = [(chain, {name: list(cells) for name, cells in chain.free.items()}) for chain in chains]

    def put_back() -> None:
        for chain, lists in order:
            chain.free = {name: dict.fromkeys(cells) for name, cells in lists.items()}

    # Whether it fits at all with every opportunistic job gone (counters only, no list to build).
    plan = plan_guaranteed(state, vc, sku, sizes, View(take_oppo=True), bind=bind, pin=pin)
    if plan is None:
        return None
    plan.abandon()
    put_back()
    name = vc.name

    def usable(job: JobRecord) -> bool:
        # Only leaves bound to no VC or to this one can become the job's.
        return any(leaf.sku == sku and ((bind and leaf.unit is None)
                                        or (leaf.unit is not None and leaf.unit.vc == name))
                   for leaf in job.leaves())

    takeable = (job for job in ctx.borrowers.youngest()
                  if job.opportunistic and not job.preempting and sku in job.held_skus and usable(job))
    running: list[JobRecord] = []

    def take(count: int) -> int:
        """Make the youngest-first list at least `count` long if there are so many; its length."""
        while len(running) < count:
            job = next(takeable, None)
            if job is None:
                break
            running.append(job)
        return len(running)

    def plan_with(count: int) -> Plan | None:
        extra = [leaf for job in running[:count] for leaf in job.leaves() if leaf.sku == sku]
        return plan_guaranteed(state, vc, sku, sizes, View(extra_leaves=extra), bind=bind, pin=pin)

    def fits(count: int) -> bool:
        plan = plan_with(count)
        if plan is not None:
            plan.abandon()
        put_back()
        return plan is not None

    # The shortest prefix that fits: doubling, then bisection; the list is only read as far as needed.
    failed, enough = 0, take(1)
    while True:
        if enough == 0:
            return None
        if fits(enough):
            break
        longer = take(enough * 2)
        if longer == enough:
            return None  # even with every usable opportunistic job gone it does not fit
        failed, enough = enough, longer
    while enough - failed > 1:
        middle = (failed + enough) // 2
        if fits(middle):
            enough = middle
        else:
            failed = middle
    return plan_with(enough)


def costly_compaction(ctx: PlanContext, record: JobRecord, vc: VcRecord, sku: str, plan: Plan) -> bool:
    """Whether compaction's victims threw away more GPU time than the limit while the VC may still bind.

    Compaction takes the youngest borrowers in the VC's own cells, but those may be all old:
    a 4-GPU borrower whose unheld node the VC bound later can sit in its hole for days and
    then be killed for a 1-GPU job (Philly 8x: most of the work lost was of this kind, with a
    borrower on cells no VC holds started minutes before). Giving way, the job binds a free
    cell or takes the youngest borrowers of the VC's cells and cells no VC holds together.
    """
    limit = ctx.policy.compaction_cost_limit
    if limit is None or not vc.may_bind(sku):
        return False
    now = ctx.clock()
    victims = {leaf.job for leaves in plan.leaves for leaf in leaves if leaf.job not in (None, record)}
    return sum(cell_hours_run(job, now) for job in victims if job is not None) > limit
