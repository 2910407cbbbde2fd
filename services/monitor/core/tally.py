"""The monitor's view of jobs and nodes, built from events: what its gauges show.

Contracts:
- `handle(event)` is idempotent: handling an event a second time (JetStream
  redelivers an event whose ack was lost) returns no counter or histogram
  update and leaves every gauge as it was.
- A job's state only moves forward. Within an attempt the launcher's states
  go WAITING -> RUNNING -> STOPPING -> final; a new attempt starts at a higher
  attempt number. An event that is older than what the monitor already knows
  (redelivered late, or replayed from the stream after `restore` loaded a newer
  state from the launcher's records) does not move the job back.
- `pai_job_submit_to_running_seconds` gets one observation per job: the first
  time it runs. A retried job reaching RUNNING again would otherwise add its
  earlier attempts' run time to a queueing figure.
- `handle(*events)` takes a batch; a batch gives the same counter and histogram
  updates as its events one by one, and each touched gauge once, at its value
  after the batch (gauges are absolute, so only the last value matters).
- Finished jobs are held for a bounded while, as every service holds only live
  work (docs/architecture.md): at most `keep_finished` of them, none finished more
  than `keep_finished_seconds` before the latest event seen (the core's clock: it
  reads none of its own). A forgotten job leaves its state's gauge, which then
  counts the finished jobs still held, as a restart restoring the launcher's live
  records finds them. A redelivered event of a forgotten job changes nothing.
- Task exits are counted once each: successes from `TaskExited` (exit code 0),
  failures from the runtime's `TaskVerdict`, labelled with its phrase, so the
  label tells people what went wrong while staying a short, fixed vocabulary.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable

import msgspec

from libs.common.ids import EventId
from libs.common.messages import (
    Event,
    EventDeadLettered,
    JobState,
    JobStateChanged,
    JobSubmitted,
    NodeStatus,
    TaskExited,
    TaskVerdict,
)
from services.monitor.core.recent import DEFAULT_CAPACITY, RecentIds
from services.monitor.core.stored import StoredJob
from services.monitor.core.updates import (
    EventCounted,
    JobsGauge,
    NodeCount,
    NodeUp,
    RaiseAlert,
    SubmitToRunning,
    TaskExitCounted,
    Update,
)

# Order of the states within one attempt.
_RANK = {
    JobState.WAITING: 0,
    JobState.RUNNING: 1,
    JobState.STOPPING: 2,
    JobState.SUCCEEDED: 3,
    JobState.FAILED: 3,
    JobState.STOPPED: 3,
}

SUCCESS_OUTCOME = "success"
FAILURE_OUTCOME = "failure"  # a verdict without a phrase
MAX_OUTCOME_LENGTH = 64


class _Job(msgspec.Struct, frozen=True, kw_only=True):
    vc: str
    state: JobState
    attempt: int
    ran: bool = False  # its submit-to-running time was observed

    def is_behind(self, attempt: int, state: JobState) -> bool:
        """True when (attempt, state) is later than what this view holds."""
        return (self.attempt, _RANK[self.state]) < (attempt, _RANK[state])


class PartlyHandled(Exception):
    """An event of a batch raised: `updates` are those of the events before it."""

    def __init__(self, updates: list[Update], event_id: str):
        super().__init__(f"handling event {event_id} raised; {len(updates)} update(s) of the events before it")
        self.updates = updates


# As the live-record expiry's defaults (libs/common/config.py live_finished_job_*).
DEFAULT_KEEP_FINISHED = 10_000
DEFAULT_KEEP_FINISHED_SECONDS = 3600.0


class MonitorCore:
    def __init__(self, *, recent_capacity: int = DEFAULT_CAPACITY, keep_finished: int = DEFAULT_KEEP_FINISHED,
                 keep_finished_seconds: float = DEFAULT_KEEP_FINISHED_SECONDS):
        self._jobs: dict[str, _Job] = {}
        # Finished jobs held -> when they finished (0: not known), in the order they finished.
        self._finished: OrderedDict[str, float] = OrderedDict()
        self._keep_finished = max(0, keep_finished)
        self._keep_finished_seconds = keep_finished_seconds
        self._clock = 0.0  # the latest event time seen
        self._counts: Counter[tuple[str, JobState]] = Counter()
        self._vcs: set[str] = set()
        self._nodes: dict[str, tuple[float, bool]] = {}
        self._recent = RecentIds(recent_capacity)

    # --- inputs ---------------------------------------------------------------

    def restore(self, jobs: Iterable[StoredJob]) -> list[Update]:
        """Load the launcher's records before consuming: gauges right after a restart."""
        touched: set[tuple[str, JobState]] = set()
        # Earliest finished first, as events would have brought them (the bounds forget those first).
        for stored in sorted(jobs, key=lambda stored: stored.completedTime or 0.0):
            self._clock = max(self._clock, stored.completedTime or 0.0)
            current = self._jobs.get(stored.job)
            if current is not None and not current.is_behind(stored.attempt, stored.state):
                continue
            self._put(stored.job, _Job(vc=stored.vc, state=stored.state, attempt=stored.attempt), touched,
                      at=stored.completedTime or 0.0)
        self._forget_finished(touched)
        return self._gauges(touched)

    def handle(self, *events: Event) -> list[Update]:
        """The updates of `events` (a batch, in stream order): counters and histogram
        observations once per new fact, each touched gauge once, at its value after
        the whole batch.

        Raises `PartlyHandled` when an event raises (a bug): it carries the updates
        of the events before that one, which are applied already here and would be
        recognised as seen if handed again, so the shell must still apply them."""
        updates: list[Update] = []
        touched: set[tuple[str, JobState]] = set()
        for event in events:
            try:
                self._handle_one(event, updates, touched)
            except Exception as exc:
                raise PartlyHandled(updates + self._gauges(touched), event.id) from exc
        self._forget_finished(touched)
        return updates + self._gauges(touched)

    def _handle_one(self, event: Event, updates: list[Update], touched: set[tuple[str, JobState]]) -> None:
        fresh = self._recent.add(event.id)
        if fresh:
            updates.append(EventCounted(kind=str(event.__struct_config__.tag)))
            updates.extend(_task_exit(event))
            self._clock = max(self._clock, event.at)
        if not fresh and isinstance(event, JobSubmitted | JobStateChanged) and event.job not in self._jobs:
            return  # seen before, and its job forgotten since: it would come back as new
        match event:
            case JobSubmitted(spec=spec):
                self._submitted(event.job, spec.virtualCluster, touched)
            case JobStateChanged():
                self._state_changed(event, updates, touched)
            case NodeStatus(node=node, healthy=healthy):
                updates.extend(self._node_seen(node, event.at, healthy))
            case EventDeadLettered():
                # Raised again on a redelivery: the same id is stored once.
                updates.append(_dead_letter_alert(event))

    def node_sampled(self, node: str, at: float) -> list[Update]:
        """This monitor sampled `node` at `at`: it is up."""
        return self._node_seen(node, at, True)

    # --- queries --------------------------------------------------------------

    def jobs_in(self, vc: str, state: JobState) -> int:
        return self._counts[(vc, state)]

    def state_of(self, job: str) -> JobState | None:
        view = self._jobs.get(job)
        return view.state if view else None

    @property
    def job_count(self) -> int:
        return len(self._jobs)

    def validate_state(self) -> None:
        recount = Counter((view.vc, view.state) for view in self._jobs.values())
        live_counts = {key: n for key, n in self._counts.items() if n}
        assert live_counts == dict(recount), f"job counts {live_counts} != recount {dict(recount)}"
        assert all(n >= 0 for n in self._counts.values()), f"negative job count in {self._counts}"
        assert {view.vc for view in self._jobs.values()} <= self._vcs, "a job's VC has no gauges"

    # --- jobs -----------------------------------------------------------------

    def _submitted(self, job: str, vc: str, touched: set[tuple[str, JobState]]) -> None:
        if job not in self._jobs:
            self._put(job, _Job(vc=vc, state=JobState.WAITING, attempt=1), touched)

    def _state_changed(self, event: JobStateChanged, updates: list[Update], touched: set[tuple[str, JobState]]) -> None:
        current = self._jobs.get(event.job)
        vc = current.vc if current else event.vc
        ran = current.ran if current else False
        if event.state == JobState.RUNNING and not ran and event.sinceSubmit is not None:
            updates.append(SubmitToRunning(vc=vc, seconds=max(0.0, event.sinceSubmit)))
            ran = True
        if current is None or current.is_behind(event.attempt, event.state):
            self._put(event.job, _Job(vc=vc, state=event.state, attempt=event.attempt, ran=ran), touched,
                      at=event.at)
        elif ran != current.ran:
            self._jobs[event.job] = msgspec.structs.replace(current, ran=ran)

    def _put(self, job: str, view: _Job, touched: set[tuple[str, JobState]], *, at: float = 0.0) -> None:
        previous = self._jobs.get(job)
        if previous is not None:
            self._counts[(previous.vc, previous.state)] -= 1
            touched.add((previous.vc, previous.state))
        self._jobs[job] = view
        self._counts[(view.vc, view.state)] += 1
        touched.add((view.vc, view.state))
        self._finished.pop(job, None)
        if view.state.is_final:
            self._finished[job] = at

    def _forget_finished(self, touched: set[tuple[str, JobState]]) -> None:
        """Drop the finished jobs past the bounds, the earliest finished first (a job
        finished at an older time than one held is forgotten in its turn, not earlier)."""
        oldest_kept = self._clock - self._keep_finished_seconds
        while self._finished:
            job, at = next(iter(self._finished.items()))
            # A finish without its time (0: a record or event that leaves it out) is bounded by count only.
            if len(self._finished) <= self._keep_finished and (at >= oldest_kept or not at):
                break
            del self._finished[job]
            view = self._jobs.pop(job)
            self._counts[(view.vc, view.state)] -= 1
            touched.add((view.vc, view.state))

    def _gauges(self, touched: set[tuple[str, JobState]]) -> list[Update]:
        """Absolute gauge values for the touched pairs; every state of a VC seen for
        the first time, so its zeros show instead of missing series."""
        keys = set(touched)
        for vc in {vc for vc, _ in touched} - self._vcs:
            self._vcs.add(vc)
            keys.update((vc, state) for state in JobState)
        return [
            JobsGauge(vc=vc, state=str(state), count=self._counts[(vc, state)])
            for vc, state in sorted(keys)
        ]

    # --- nodes ----------------------------------------------------------------

    def _node_seen(self, node: str, at: float, healthy: bool) -> list[Update]:
        last = self._nodes.get(node)
        if last is not None and at < last[0]:
            return []  # an older report than the one shown
        self._nodes[node] = (at, healthy)
        return [NodeUp(node=node, up=healthy), NodeCount(count=len(self._nodes))]


DEAD_LETTER_RULE = "EventDeadLettered"


def _dead_letter_alert(event: EventDeadLettered) -> RaiseAlert:
    about = f"job {event.job}" if event.job else f"subject {event.subject}"
    return RaiseAlert(
        id=EventId(f"{event.id}/alert"),
        job=event.job,
        cause=event.id,
        rule=DEAD_LETTER_RULE,
        severity="critical",
        summary=(
            f"{event.consumer} gave up on {event.eventKind} event {event.eventId} ({about}) "
            f"after {event.deliveries} deliveries: {event.reason}"
        ),
        labels={"consumer": event.consumer, "kind": event.eventKind, "job": event.job},
    )


def _task_exit(event: Event) -> list[Update]:
    match event:
        case TaskExited(exitCode=0, vc=vc):
            return [TaskExitCounted(vc=vc, outcome=SUCCESS_OUTCOME)]
        case TaskVerdict(vc=vc, exitCode=code, spec=spec) if code != 0:
            outcome = (spec.phrase.strip() or FAILURE_OUTCOME)[:MAX_OUTCOME_LENGTH]
            return [TaskExitCounted(vc=vc, outcome=outcome)]
    return []
