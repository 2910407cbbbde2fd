"""The scheduling policy's switches, in one frozen object (as kueue's options struct).

    core = SchedulerCore(config, clock=clock, policy=SchedulingPolicy(shape_fallback=None))

Every field has the default PAI runs with; a field is read where its rule is applied
(the planner of a placement mode in placing.py, the pass walk in passes.py, the core's
event handling in scheduler.py), never copied into flags. What each rule does and its
figures on the Philly replay: services/scheduler/cluster/README.md.

The rules:
- Queue order is priority (higher first), then arrival, in one lane per VC for
  guaranteed jobs and one lane for opportunistic jobs; in a VC's lane, within a
  priority, the user with the smallest dominant share of the VC goes first
  (`fair_share`; fairness.py), then arrival. Jobs asking for the same thing share a
  bucket (queues.py; `bucketed` False: each job a bucket of its own, the plain scan
  the bucketed pass is tested to decide as).
- Anti-starvation: a gang (an affinity group of two or more tasks placed together)
  that has waited `gang_priority_after_s` seconds stops the backfill behind it: later
  jobs of its VC (or, for an opportunistic gang, later opportunistic jobs of its VC)
  that compete for one of its skus wait until it is placed.
- Guaranteed jobs (priority >= 0) use only their VC's cells: cells bound to the VC
  (lazily, by buddy allocation) up to its quota, or its pinned cells. Opportunistic
  jobs (priority -1) use idle cells anywhere.
- Opportunistic admission (no thrash): idle cells no VC holds first, holes in VC
  cells only when none will do; a preempted job queues again at the back of the
  opportunistic lane (`requeue_at_back`); a job preempted
  `opportunistic_preemption_budget` times waits for cells no VC holds, and so does
  one with a task of half a node or more but less than a whole one
  (`large_borrowers_unheld`, with more than one VC).
- Compaction before binding (`compact_before_binding`): a guaranteed job goes into
  the free cells of the VC cells already bound, then takes opportunistic work in them
  (youngest first), and only then binds another of its quota's cells; compaction gives
  way to binding when its victims ran more than `compaction_cost_limit` GPU-hours.
- Binding where no VC needs the bigger cell (`bind_anywhere`): a VC cell may be cut
  out of any free bigger cell whose type no VC's quota asks for.
- Shape fallback (`shape_fallback`): a guaranteed job that its VC's unused quota holds
  in count but no cell of the VC has room for runs at once on idle cells outside its
  quota (anywhere, or only cells no VC holds), as borrowed work; tried in a second walk
  of the pass that preempts nothing.
- Adaptive idle reserve (`adaptive_reserve`, `reserve_after_waiting_s`, with more than
  one VC): in a sustained overload opportunistic work leaves idle as many cells no VC
  holds as the borrowers a guaranteed job killed after long runs recently held.
- Preemption, tried only when a job cannot be placed on free cells: first
  opportunistic work on the cells the job needs, the most recently started first and
  no more than needed, then guaranteed jobs of the same VC with a lower priority (lazy
  preemption first downgrades them). The preemptor's cells are reserved for it until
  the victims' Release arrives.
- An attempt's wait is announced (JobWaiting) once it has waited
  `announce_wait_after_s`: a burst's jobs, placed within a second or two, never are.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import cast

GANG_PRIORITY_AFTER_S = 600.0
# After this many preemptions an opportunistic job waits for cells no VC holds.
OPPORTUNISTIC_PREEMPTION_BUDGET = 2
# Compaction gives way to binding another cell of the quota when its victims ran longer than this many
# GPU-hours in all (see placing.costly_compaction).
COMPACTION_COST_LIMIT_GPU_H = 5.0
# How long the opportunistic job first in the queue must have waited (a sustained overload) before the
# adaptive reserve holds.
RESERVE_AFTER_WAITING_S = 6 * 3600.0
# An attempt's wait is announced (JobWaiting) once it has waited this long (see Announce): a burst's jobs,
# placed within a second or two, are never announced; the reason is stored when queued all the same.
ANNOUNCE_WAIT_AFTER_S = 5.0


class ShapeFallback(StrEnum):
    """Where a guaranteed job whose shape its VC's cells have no room for may run as borrowed work."""

    IDLE = "idle"  # idle cells anywhere
    UNHELD = "unheld"  # only idle cells no VC holds, where it is the least likely to be taken back


@dataclass(frozen=True, slots=True)
class AdaptiveReserve:
    """Opportunistic work leaves idle as many cells no VC holds as the borrowers a guaranteed job killed
    in the last `window_s` held, counting only kills that threw away `min_gpu_h` or more, at most
    `most_leaves` (see reserve.py)."""

    window_s: float = 48 * 3600.0
    min_gpu_h: float = 8.0
    most_leaves: int = 512


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    """The switches of the scheduler core; the defaults are PAI's. Frozen: one policy for a core's life."""

    gang_priority_after_s: float = GANG_PRIORITY_AFTER_S
    opportunistic_preemption_budget: int = OPPORTUNISTIC_PREEMPTION_BUDGET
    compact_before_binding: bool = True
    # None: a guaranteed job that fits its quota in count but in no shape its VC's cells allow waits.
    shape_fallback: ShapeFallback | None = ShapeFallback.UNHELD
    bucketed: bool = True
    bind_anywhere: bool = True
    large_borrowers_unheld: bool = True
    requeue_at_back: bool = True
    # None: compaction always comes before binding, whatever its victims ran.
    compaction_cost_limit: float | None = COMPACTION_COST_LIMIT_GPU_H
    # None: no reserve.
    adaptive_reserve: AdaptiveReserve | None = AdaptiveReserve()
    # None: the reserve holds whenever there were costly kills, not only in a sustained overload.
    reserve_after_waiting_s: float | None = RESERVE_AFTER_WAITING_S
    announce_wait_after_s: float = ANNOUNCE_WAIT_AFTER_S
    fair_share: bool = True

    def __post_init__(self) -> None:
        # Plain values (a test's "idle", a tuple for the reserve) become the policy's own types; anything
        # else is refused here, naming the field, rather than deep in a pass.
        fallback: object = self.shape_fallback  # typed as the policy's own, given as anything
        if fallback is not None and not isinstance(fallback, ShapeFallback):
            try:
                object.__setattr__(self, "shape_fallback", ShapeFallback(cast(str, fallback)))  # the enum checks it
            except ValueError:
                known = ", ".join(repr(kind.value) for kind in ShapeFallback)
                raise ValueError(f"shape_fallback: one of None, {known}, not {fallback!r}") from None
        reserve: object = self.adaptive_reserve
        if reserve is not None and not isinstance(reserve, AdaptiveReserve):
            window_s, min_gpu_h, most_leaves = cast("tuple[float, float, int]", reserve)  # a plain triple
            object.__setattr__(self, "adaptive_reserve", AdaptiveReserve(window_s, min_gpu_h, most_leaves))
        if self.opportunistic_preemption_budget < 0:
            raise ValueError(f"opportunistic_preemption_budget: at least 0, not {self.opportunistic_preemption_budget}")

    def for_cluster(self, vcs: int) -> SchedulingPolicy:
        """The policy as it applies to a cluster of `vcs` virtual clusters. With one VC every borrower is
        that VC's own work, taken back only by its own guaranteed jobs: there is nobody else's binding
        to keep idle cells for (no reserve), and keeping large borrowers off the VC's idle cells would
        only make them wait (`pai up`'s one-VC cluster)."""
        if vcs > 1:
            return self
        return dataclasses.replace(self, adaptive_reserve=None, large_borrowers_unheld=False)
