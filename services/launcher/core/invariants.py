"""Invariants of the launcher's records; `LauncherCore.validate_state()` checks them."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

from libs.common.messages import JobState
from libs.common.records import EndOutcome, JobRecord
from services.launcher.core.ports import ports_held
from services.launcher.core.transitions import is_legal


class InvariantViolation(AssertionError):
    """The records are in a state the lifecycle must never produce: a launcher bug."""


def check_invariants(records: Iterable[JobRecord], *, port_range: tuple[int, int]) -> None:
    problems: list[str] = []
    port_owner: dict[tuple[str, int], str] = {}
    for record in records:
        problems.extend(_job_problems(record))
        if not ports_held(record):
            continue
        for task in record.current.tasks:
            for ports in task.ports.values():
                for port in ports:
                    owner = f"{record.job} {task.role}[{task.index}]"
                    if not port_range[0] <= port < port_range[1]:
                        problems.append(f"{owner}: port {port} outside {port_range}")
                    slot = (task.node or "", port)
                    if slot in port_owner:
                        problems.append(f"port {port} on node {slot[0]} held by {port_owner[slot]} and {owner}")
                    port_owner[slot] = owner
    if problems:
        raise InvariantViolation("; ".join(problems))


def _job_problems(record: JobRecord) -> list[str]:
    job = record.job
    problems: list[str] = []
    if not record.attempts:
        return [f"{job}: no attempt"]
    numbers = [a.attempt for a in record.attempts]
    if numbers[0] != 1 or any(b <= a for a, b in pairwise(numbers)):
        problems.append(f"{job}: attempt numbers {numbers} do not increase from 1")
    if numbers[-1] != record.attempt:
        problems.append(f"{job}: current attempt {record.attempt} is not the last one {numbers[-1]}")
    if record.retries > max(record.spec.jobRetryCount, 0):
        problems.append(f"{job}: {record.retries} counted retries exceed jobRetryCount {record.spec.jobRetryCount}")
    if not record.history or record.history[-1].to != record.state:
        problems.append(f"{job}: history does not end in the state {record.state}")
    for step in record.history[1:]:
        if step.from_ is None or not is_legal(step.from_, step.to):
            problems.append(f"{job}: illegal step {step.from_} -> {step.to} in history")
    for attempt in record.attempts:
        slots = [(t.role, t.index) for t in attempt.tasks]
        if len(slots) != len(set(slots)):
            problems.append(f"{job} attempt {attempt.attempt}: a task appears twice")
        live = [f"{t.role}[{t.index}]" for t in attempt.tasks if t.live]
        if live and (attempt is not record.current or attempt.ended):
            problems.append(f"{job} attempt {attempt.attempt} is over but has live tasks {live}")
        if live and record.state.is_final:
            problems.append(f"{job} is {record.state} but has live tasks {live}")
        for task in attempt.tasks:
            if task.verdictPending and task.exitCode in (None, 0):
                problems.append(f"{job} {task.role}[{task.index}]: waits for a verdict without a failure")
    if record.state.is_final and not record.current.ended:
        problems.append(f"{job} is {record.state} but its attempt {record.attempt} has not ended")
    if record.state == JobState.STOPPING:
        ending = record.current.ending
        if ending is None or ending.outcome != EndOutcome.STOPPED:
            problems.append(f"{job} is STOPPING without a decided stop")
    return problems
