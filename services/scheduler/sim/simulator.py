"""The virtual-clock event loop: replays a workload through one policy.

Time jumps from one event to the next; there is no waiting and no wall clock.
Everything that happens at the same virtual instant is handed to the policy in
one step, finished jobs first (so arrivals see the GPUs they free), then jobs
whose preemption completed, then arrivals, then wake-ups.

Completion: a job that starts finishes `duration` seconds later. Preemption: the
victim stops at once (no grace period) and its work is lost; it waits again and,
when placed again, runs its whole duration from scratch. Its queueing delay stays
the time to its first start; the lost time shows in its completion time (JCT),
in its preemption count and in the lost GPU-hours.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import msgspec

from services.scheduler.sim.allocation import AllocationTracker
from services.scheduler.sim.policies.base import Policy
from services.scheduler.sim.workload import SimJob

_FINISH, _REQUEUE, _ARRIVE, _WAKE = 0, 1, 2, 3
OVERALL = ""  # allocation key for the whole cluster


class JobOutcome(msgspec.Struct, kw_only=True):
    first_start: float | None = None
    finish: float | None = None
    preemptions: int = 0
    lost_gpu_seconds: float = 0.0
    job_class: str = ""
    never_reason: str | None = None  # why it never started, when it did not


class SimulationRun(msgspec.Struct, kw_only=True):
    policy: str
    outcomes: list[JobOutcome]
    allocation: AllocationTracker
    origin: float  # first arrival
    end: float  # last event


def simulate(jobs: list[SimJob], policy: Policy, *, interval: float = 3600.0, vcs: list[str],
             progress: Callable[[int], None] | None = None) -> SimulationRun:
    """Run every job through `policy`; `progress(jobs settled so far)` is called now and then."""
    outcomes = [JobOutcome() for _ in jobs]
    origin = jobs[0].submit if jobs else 0.0
    allocation = AllocationTracker(origin, interval, [OVERALL, *vcs])
    events: list[tuple[float, int, int, int, int]] = []  # (time, kind, sequence, job index, run number)
    sequence = 0
    for job in jobs:
        events.append((job.submit, _ARRIVE, sequence, job.index, 0))
        sequence += 1
    heapq.heapify(events)
    runs = [0] * len(jobs)  # starts so far; a finish event of an older run is stale
    running_since: list[float | None] = [None] * len(jobs)
    settled = 0
    now = origin
    steps = 0
    while events:
        now = events[0][0]
        finished: list[SimJob] = []
        requeued: list[SimJob] = []
        arrived: list[SimJob] = []
        woken: list[SimJob] = []
        while events and events[0][0] == now:
            _, kind, _, index, run = heapq.heappop(events)
            job = jobs[index]
            if kind == _FINISH:
                if run != runs[index] or running_since[index] is None:
                    continue  # the run was preempted
                running_since[index] = None
                outcomes[index].finish = now
                _hold(allocation, now, job, -job.gpus)
                settled += 1
                finished.append(job)
            elif kind == _REQUEUE:
                requeued.append(job)
            elif kind == _ARRIVE:
                arrived.append(job)
            else:
                woken.append(job)
        step = policy.step(now, finished=finished, requeued=requeued, arrived=arrived, woken=woken)
        for index in step.preempted:
            job = jobs[index]
            since = running_since[index]
            if since is None:
                raise AssertionError(f"policy {policy.name} preempted job {job.job_id}, which is not running")
            running_since[index] = None
            outcome = outcomes[index]
            outcome.preemptions += 1
            outcome.lost_gpu_seconds += (now - since) * job.gpus
            _hold(allocation, now, job, -job.gpus)
            heapq.heappush(events, (now, _REQUEUE, sequence, index, 0))
            sequence += 1
        for index in step.started:
            job = jobs[index]
            if running_since[index] is not None:
                raise AssertionError(f"policy {policy.name} started job {job.job_id} twice")
            runs[index] += 1
            running_since[index] = now
            outcome = outcomes[index]
            if outcome.first_start is None:
                outcome.first_start = now
            _hold(allocation, now, job, job.gpus)
            heapq.heappush(events, (now + job.duration, _FINISH, sequence, index, runs[index]))
            sequence += 1
        for at, index in step.wake_at:
            heapq.heappush(events, (at, _WAKE, sequence, index, 0))
            sequence += 1
        steps += 1
        if progress is not None and steps % 512 == 0:
            progress(settled)
    allocation.finish(now)
    for job, outcome in zip(jobs, outcomes, strict=True):
        outcome.job_class = policy.job_class(job)
        if outcome.finish is None:
            outcome.never_reason = policy.waiting_reason(job)
    if progress is not None:
        progress(settled)
    return SimulationRun(policy=policy.name, outcomes=outcomes, allocation=allocation, origin=origin, end=now)


def _hold(allocation: AllocationTracker, now: float, job: SimJob, delta: int) -> None:
    allocation.change(now, OVERALL, delta)
    allocation.change(now, job.vc, delta)
