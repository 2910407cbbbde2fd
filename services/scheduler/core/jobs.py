"""The scheduler's record of one job attempt."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from libs.common.messages import TaskPlacement
from libs.common.protocol.model import OPPORTUNISTIC_PRIORITY, JobSpec
from services.scheduler.core.demand import GroupDemand, TaskDemand, affinity_groups
from services.scheduler.core.lifecycle import BEING_PREEMPTED_STATES, CANCELLED_STATES, AttemptState

if TYPE_CHECKING:
    from services.scheduler.core.cells import Cell


class QueueNotes:
    """The queue's own bookkeeping about one attempt: its place in the queue and what the passes
    learnt about it (queues.py, passes.py, fairness.py, waits.py). None of it is the job's: a new
    attempt starts with fresh notes."""

    __slots__ = ("_priority", "_order", "_fair", "key", "fair_demand", "bucket", "gang_deadline", "seen_epoch",
                 "failed_epoch", "behind", "fresh", "due", "blocking", "reason_key", "reason_text")

    def __init__(self, order: int, priority: int):
        self._priority = priority
        # Place in the queue among jobs of equal priority: arrival (seq), unless the core queues a preempted
        # opportunistic job again at the back (SchedulingPolicy.requeue_at_back).
        self._order = order
        # Fair share among the users of its VC (fairness.py): its user's dominant share of the VC once
        # their jobs ahead of it are placed, set by the core while it is queued (0: opportunistic, alone
        # in its priority, or off).
        self._fair = 0
        # Queue order (`JobRecord.key`), kept as a tuple: the queue's lists bisect by it, thousands of
        # comparisons per re-tag, each an attribute read in C rather than a call.
        self.key = (-priority, 0, order)
        # The leaf cells per sku its tag's successors counted for it (None: not counted since it was queued
        # or since its cells last changed, which is all that changes it).
        self.fair_demand: dict[str, int] | None = None
        self.bucket: tuple[object, ...] = ()  # which bucket of its queue lists it is in (Queues), set when queued
        self.gang_deadline = float("inf")  # when, still waiting, it starts to stop backfill behind it
        self.seen_epoch = -1  # the last scheduling pass that looked at it
        self.failed_epoch = -1  # the scheduling pass in which it last failed to fit
        self.behind: str | None = None  # the aged gang it waits behind, if any
        self.fresh = False  # queued, and no scheduling pass has looked at it since
        self.due = False  # a gang past its gang_deadline, queued, not yet holding back backfill (Queues.due)
        self.blocking = 0  # > 0: an aged gang that stops backfill behind it; the cells it needs
        self.reason_key: tuple[object, ...] | None = None  # what its reason is about (changes give a Wait)
        # Builds the reason text for a given number of jobs ahead in the queue (counts are read when called).
        self.reason_text: Callable[[int], str] | None = None

    @property
    def order(self) -> int:
        return self._order

    @order.setter
    def order(self, order: int) -> None:
        self._order = order
        self.key = (-self._priority, self._fair, order)

    @property
    def fair(self) -> int:
        return self._fair

    @fair.setter
    def fair(self, fair: int) -> None:
        self._fair = fair
        self.key = (-self._priority, fair, self._order)


class Told:
    """What the shell was told about one attempt (see waits.py and SchedulerCore.entry)."""

    __slots__ = ("sent", "wait_given", "reason_given", "reason_given_at")

    def __init__(self) -> None:
        self.sent: dict[tuple[str, int], TaskPlacement] = {}  # (role, index) -> placement given in a Place
        self.wait_given = False  # its wait was announced (a Wait that is `first`, or an Announce)
        self.reason_given = ""  # the reason text last given in a Wait
        self.reason_given_at = float("-inf")  # when (the core's clock) it was given


class JobRecord:
    """One attempt: the job's spec and what follows from it, its lifecycle and its cells.

    Its lifecycle is `state` (see lifecycle.py), changed only by `lifecycle.move()`; `placed`,
    `reserved` and `victims` are the cells and jobs the state is about. `opportunistic` is the
    job's class (a lazy downgrade, a shape fallback or a restore may change it, whatever the
    state); `restored` says where the attempt came from. The queue's own bookkeeping about the
    attempt is `queue` (QueueNotes); what the shell was told, `told` (Told).
    """

    __slots__ = (
        "id", "attempt", "spec", "vc", "priority", "opportunistic", "lazy", "seq", "queued_at", "submitted_at",
        "groups", "pending_groups", "placed", "reserved", "victims", "state", "history", "restored", "borrowed",
        "preemptions", "placed_at", "never", "skus", "skus_set", "held_skus", "shape", "queue", "told",
        "released_tasks",
    )

    def __init__(self, job: str, attempt: int, spec: JobSpec, *, seq: int, now: float,
                 submitted_at: float | None = None):
        self.id = job
        self.attempt = attempt
        self.spec = spec
        self.vc = spec.virtualCluster
        self.priority = spec.priority
        # Opportunistic jobs run on idle cells anywhere and may be preempted by any
        # guaranteed job; a lazily preempted guaranteed job becomes one.
        self.opportunistic = spec.priority <= OPPORTUNISTIC_PRIORITY
        self.lazy = spec.lazyPreemptionEnable
        self.seq = seq  # arrival order; kept across attempts so a requeued job keeps its place
        self.queued_at = now
        self.submitted_at = now if submitted_at is None else submitted_at  # for queue order after a restart
        self.groups: list[GroupDemand] = affinity_groups(spec)
        self.pending_groups: list[GroupDemand] = list(self.groups)
        self.placed: dict[tuple[str, int], list[Cell]] = {}  # (role, index) -> leaves
        # Tasks that ended for good and gave their cells back while the attempt goes on
        # (gangReleaseEnable: false): placed once, never again in this attempt.
        self.released_tasks: set[tuple[str, int]] = set()
        self.reserved: list[tuple[GroupDemand, list[TaskDemand], list[list[Cell]]]] = []
        self.victims: set[str] = set()  # attempts preempted for this one, not yet released
        self.state = AttemptState.QUEUED
        self.history: list[tuple[AttemptState, str]] = [(AttemptState.QUEUED, "queued")]
        self.restored = False
        # A guaranteed job's attempt placed outside its VC's quota (shape fallback): it runs as
        # opportunistic work; its next attempt is guaranteed again.
        self.borrowed = False
        self.preemptions = 0  # earlier attempts of the job ended by a preemption (kept across attempts)
        # When this attempt first got cells (-inf: restored, its start unknown, counted as long ago):
        # opportunistic victims are taken youngest first, so a preemption throws away the least work.
        self.placed_at: float | None = None
        self.never: str | None = None  # why the job can never be placed as submitted (set once)
        self.skus: list[str] = []  # every sku any of its groups may use
        self.skus_set: frozenset[str] = frozenset()
        self.held_skus: frozenset[str] = frozenset()  # skus of the cells it holds
        # (gpu, cpu, memoryMB, tasks needed at once, pinnedCellId) when the job is one group of equal
        # tasks, else None: a job whose shape is at least as large fails wherever this one failed.
        self.shape: tuple[int, int, int, int, str | None] | None = None
        self.queue = QueueNotes(seq, self.priority)
        self.told = Told()

    @property
    def key(self) -> tuple[int, int, int]:
        """Queue order: higher priority first, then the smaller fair share (`fair`), then arrival (`order`)."""
        return self.queue.key

    @property
    def preempting(self) -> bool:
        """A Preempt was given: its cells are on their way to another job."""
        return self.state in BEING_PREEMPTED_STATES

    @property
    def cancelled(self) -> bool:
        return self.state in CANCELLED_STATES

    @property
    def waiting(self) -> bool:
        return bool(self.pending_groups) and not self.cancelled

    @property
    def holds_cells(self) -> bool:
        return bool(self.placed)

    def leaves(self) -> list[Cell]:
        return [leaf for leaves in self.placed.values() for leaf in leaves]

    def __repr__(self) -> str:
        return f"JobRecord({self.id}#{self.attempt})"
