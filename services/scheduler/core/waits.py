"""Why attempts wait, and what the shell was told about it (Wait, Announce, given again after NotSent).

A job that does not fit gets a reason (`fail`, or `set_reason` with one of reasons.py's),
given in a Wait when it changes. An attempt's wait is announced once it has waited
`announce_wait_after_s` (the first Wait after that, or an Announce); decisions the shell
could not carry out are given again as they stand now (`again`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from services.scheduler.core import reasons
from services.scheduler.core.borrowers import IdleReserve, unheld_idle
from services.scheduler.core.decisions import Announce, Decision, Place, Preempt, Wait
from services.scheduler.core.demand import GroupDemand, TaskDemand
from services.scheduler.core.eligibility import candidate_skus
from services.scheduler.core.jobs import JobRecord
from services.scheduler.core.policy import SchedulingPolicy
from services.scheduler.core.queues import Queues
from services.scheduler.core.rules import cells_for, large_borrower, over_budget
from services.scheduler.core.state import ClusterState


class Waits:
    def __init__(self, policy: SchedulingPolicy, *, clock: Callable[[], float], state: ClusterState,
                 queues: Queues, jobs: dict[str, JobRecord], reserve: IdleReserve):
        self._policy = policy
        self._clock = clock
        self._state = state
        self._queues = queues
        self._jobs = jobs
        self._reserve = reserve
        # (queued_at, job, attempt) of attempts queued while announcements wait, oldest first.
        self._unannounced: collections.deque[tuple[float, str, int]] = collections.deque()
        self.not_sent: dict[tuple[str, str], Decision] = {}  # (kind, job) -> decision to give again

    def queued(self, record: JobRecord) -> None:
        """A new attempt: its wait is announced once it has waited long enough."""
        if self._policy.announce_wait_after_s > 0:
            self._unannounced.append((record.queued_at, record.id, record.attempt))

    def fail(self, record: JobRecord, group: GroupDemand, tasks: list[TaskDemand], decisions: list[Decision]) -> None:
        """The tasks did not fit in this pass: the job's reason says what it waits for."""
        state = self._state
        record.queue.failed_epoch = state.epoch
        vc = state.vcs[record.vc]
        skus = candidate_skus(state, record, vc, group)
        cells = cells_for(state.config, tasks, skus[0])
        if over_budget(self._policy, record):
            key: tuple[object, ...] = ("unheld", tuple(skus), cells)
            if key != record.queue.reason_key or record.queue.reason_text is None:
                self.set_reason(record, reasons.unheld_only(cells, skus, record.preemptions, self._idle_counts(skus)),
                                decisions)
            return
        key = ("idle", tuple(skus), cells) if record.opportunistic else ("vc", vc.name, tuple(skus), cells)
        if key != record.queue.reason_key or record.queue.reason_text is None:
            if record.opportunistic and large_borrower(self._policy, state.tree, skus[0],
                                                       max(cells_for(state.config, [t], skus[0]) for t in tasks)):
                reason = reasons.unheld_large(cells, skus, self._idle_counts(skus))
            else:
                reason = reasons.waiting_for_room(state, record, vc, skus, cells,
                                                  lambda: self._reserve.held_back(skus), group.pin)
            self.set_reason(record, reason, decisions)

    def _idle_counts(self, skus: list[str]) -> Callable[[], tuple[int, int, int]]:
        tree = self._state.tree

        def counts() -> tuple[int, int, int]:
            unheld = sum(unheld_idle(tree, sku) for sku in skus)
            idle = sum(tree.sku_totals[sku].free for sku in skus if sku in tree.sku_totals)
            return unheld, idle, self._reserve.held_back(skus)

        return counts

    def set_reason(self, record: JobRecord, reason: reasons.Reason, decisions: list[Decision]) -> None:
        key, text = reason
        record.queue.reason_text = text
        if key[0] != "behind":
            record.queue.behind = None
        if key != record.queue.reason_key:
            record.queue.reason_key = key
            decisions.append(self.wait(record))

    def wait(self, record: JobRecord) -> Wait:
        """The Wait to give now; it also announces the wait of an attempt not yet placed that has
        waited long enough and was not announced (else announcements_due does, when it has)."""
        assert record.queue.reason_text is not None
        reason = record.queue.reason_text(self._queues.position(record))
        now = self._clock()
        told = record.told
        first = not told.wait_given and not told.sent and now - record.queued_at >= self._policy.announce_wait_after_s
        told.wait_given = told.wait_given or first
        told.reason_given = reason
        told.reason_given_at = now
        return Wait(job=record.id, attempt=record.attempt, vc=record.vc, reason=reason, first=first)

    def announcements_due(self) -> list[Decision]:
        """Announce the attempts, queued long enough ago, that still wait for their first cells
        with a reason given and not yet announced. One queued without a reason given yet is dropped
        here: its first Wait, later than this, announces it (see wait)."""
        due = self._clock() - self._policy.announce_wait_after_s
        announcements: list[Decision] = []
        while self._unannounced and self._unannounced[0][0] <= due:
            _, job, attempt = self._unannounced.popleft()
            record = self._jobs.get(job)
            if (record is None or record.attempt != attempt or record.told.wait_given or record.told.sent
                    or not record.waiting or record.told.reason_given_at == float("-inf")):
                continue
            record.told.wait_given = True
            announcements.append(_announce(record))
        return announcements

    def refreshed_reasons(self, older_than: float) -> list[Decision]:
        """Waits whose reason text changed since given, for reasons given more than `older_than` ago."""
        waits: list[Decision] = []
        given_before = self._clock() - older_than
        for record in self._jobs.values():
            text, told = record.queue.reason_text, record.told
            if told.sent or not record.waiting or text is None or told.reason_given_at > given_before:
                continue
            if text(self._queues.position(record)) != told.reason_given:
                waits.append(self.wait(record))
        return waits

    def again(self) -> list[Decision]:
        """The decisions the shell could not carry out, as they stand now (see NotSent)."""
        decisions: list[Decision] = []
        for (_, job), decision in self.not_sent.items():
            record = self._jobs.get(job)
            if record is None or record.attempt != decision.attempt:
                continue  # released meanwhile: nothing left to say
            match decision:
                case Place() if record.told.sent:
                    decisions.append(Place(job=job, attempt=record.attempt, vc=record.vc,
                                           tasks=list(record.told.sent.values()), partial=bool(record.pending_groups)))
                case Preempt() if record.preempting:
                    decisions.append(decision)
                case Wait() if not record.told.sent and record.queue.reason_text is not None:
                    record.told.wait_given = record.told.wait_given and not decision.first
                    decisions.append(self.wait(record))
                case Announce() if not record.told.sent and record.waiting:
                    decisions.append(_announce(record))
        self.not_sent.clear()
        return decisions


def _announce(record: JobRecord) -> Announce:
    return Announce(job=record.id, attempt=record.attempt, vc=record.vc, reason=record.told.reason_given)
