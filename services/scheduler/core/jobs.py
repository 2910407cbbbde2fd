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


class JobRecord:
    """One attempt. Its lifecycle is `state` (see lifecycle.py), changed only by `lifecycle.move()`.

    The other marks are not lifecycle and stay plain fields: `opportunistic` is the job's
    class (a lazy downgrade or a restore may change it, whatever the state); `fresh`,
    `blocking`, `behind`, `failed_epoch` and `seen_epoch` are the queue policy's notes;
    `restored` says where the attempt came from; `sent`, `wait_given` and `reason_given`
    record what was announced to the shell; `placed`, `reserved` and `victims` are the
    cells and jobs the state is about.
    """

    __slots__ = (
        "id", "attempt", "spec", "vc", "priority", "opportunistic", "lazy", "seq", "queued_at", "groups",
        "placed", "pending_groups", "state", "history", "victims", "reserved", "reason_key",
        "restored", "never", "skus", "skus_set", "held_skus", "gang_deadline", "shape", "bucket", "seen_epoch", "behind", "fresh", "failed_epoch", "blocking", "reason_text",
        "submitted_at", "sent", "wait_given", "reason_given", "reason_given_at", "placed_at", "preemptions",
        "borrowed", "order", "due", "fair", "fair_demand",
    )

    def __init__(self, job: str, attempt: int, spec: JobSpec, *, seq: int, now: float, submitted_at: float | None = None):
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
        self.groups: list[GroupDemand] = affinity_groups(spec)
        self.placed: dict[tuple[str, int], list[Cell]] = {}  # (role, index) -> leaves
        self.pending_groups: list[GroupDemand] = list(self.groups)
        self.state = AttemptState.QUEUED
        self.history: list[tuple[AttemptState, str]] = [(AttemptState.QUEUED, "queued")]
        self.victims: set[str] = set()  # attempts preempted for this one, not yet released
        self.reserved: list[tuple[GroupDemand, list[TaskDemand], list[list[Cell]]]] = []
        self.reason_key: tuple | None = None
        # Builds the reason text for a given number of jobs ahead in the queue (counts are read when called).
        self.reason_text: Callable[[int], str] | None = None
        self.never: str | None = None  # why the job can never be placed as submitted (set once)
        self.skus: list[str] = []  # every sku any of its groups may use
        self.skus_set: frozenset[str] = frozenset()
        self.failed_epoch = -1  # the scheduling pass in which it last failed to fit
        self.blocking = 0  # > 0: an aged gang that stops backfill behind it; the cells it needs
        self.held_skus: frozenset[str] = frozenset()  # skus of the cells it holds
        self.gang_deadline = float("inf")  # when, still waiting, it starts to stop backfill behind it
        # (gpu, cpu, memoryMB, tasks needed at once, pinnedCellId) when the job is one group of equal
        # tasks, else None: a job whose shape is at least as large fails wherever this one failed.
        self.shape: tuple | None = None
        self.bucket: tuple = ()  # which bucket of its queue lists it is in (Queues), set when queued
        self.seen_epoch = -1  # the last scheduling pass that looked at it
        self.behind: str | None = None  # the aged gang it waits behind, if any
        self.fresh = False  # queued, and no scheduling pass has looked at it since
        self.due = False  # a gang past its gang_deadline, queued, not yet holding back backfill (Queues.due)
        self.restored = False
        self.submitted_at = now if submitted_at is None else submitted_at  # for queue order after a restart
        self.sent: dict[tuple[str, int], TaskPlacement] = {}  # (role, index) -> placement given in a Place
        self.wait_given = False  # its wait was announced (a Wait that is `first`, or an Announce)
        self.reason_given = ""  # the reason text last given in a Wait
        self.reason_given_at = float("-inf")  # when (the core's clock) it was given
        # When this attempt first got cells (-inf: restored, its start unknown, counted as long ago):
        # opportunistic victims are taken youngest first, so a preemption throws away the least work.
        self.placed_at: float | None = None
        self.preemptions = 0  # earlier attempts of the job ended by a preemption (kept across attempts)
        # A guaranteed job's attempt placed outside its VC's quota (shape fallback): it runs as
        # opportunistic work; its next attempt is guaranteed again.
        self.borrowed = False
        # Place in the queue among jobs of equal priority: arrival (seq), unless the core queues a preempted
        # opportunistic job again at the back (SchedulerCore's requeue_at_back).
        self.order = seq
        # Fair share among the users of its VC (fairness.py): its user's dominant share of the VC once
        # their jobs ahead of it are placed, set by the core while it is queued (0: opportunistic, or off).
        self.fair = 0
        self.fair_demand: dict[str, int] = {}  # the leaf cells per sku its tag's successors counted for it

    @property
    def key(self) -> tuple[int, int, int]:
        """Queue order: higher priority first, then the smaller fair share (`fair`), then arrival (`order`)."""
        return (-self.priority, self.fair, self.order)

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
