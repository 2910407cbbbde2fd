"""The attempt's state table (lifecycle.py): every (state, next state) pair is legal or raises with the history."""

from __future__ import annotations

import itertools

import pytest

from services.scheduler.core.jobs import JobRecord
from services.scheduler.core.lifecycle import (
    CANCELLED_FROM,
    PREEMPTED_FROM,
    TRANSITIONS,
    AttemptState,
    IllegalTransition,
    move,
)

from .builders import Harness, spec

S = AttemptState

LEGAL = {
    (S.QUEUED, S.PARTLY_PLACED), (S.QUEUED, S.PLACED), (S.QUEUED, S.PREEMPTING), (S.QUEUED, S.RELEASED),
    (S.PARTLY_PLACED, S.PLACED), (S.PARTLY_PLACED, S.PREEMPTING), (S.PARTLY_PLACED, S.BEING_PREEMPTED),
    (S.PARTLY_PLACED, S.CANCELLED), (S.PARTLY_PLACED, S.RELEASED),
    (S.PREEMPTING, S.QUEUED), (S.PREEMPTING, S.PARTLY_PLACED), (S.PREEMPTING, S.PLACED),
    (S.PREEMPTING, S.BEING_PREEMPTED), (S.PREEMPTING, S.CANCELLED), (S.PREEMPTING, S.RELEASED),
    (S.PLACED, S.BEING_PREEMPTED), (S.PLACED, S.CANCELLED), (S.PLACED, S.RELEASED),
    (S.BEING_PREEMPTED, S.BEING_PREEMPTED_CANCELLED), (S.BEING_PREEMPTED, S.RELEASED),
    (S.CANCELLED, S.BEING_PREEMPTED_CANCELLED), (S.CANCELLED, S.RELEASED),
    (S.BEING_PREEMPTED_CANCELLED, S.RELEASED),
}


def _record_in(state: AttemptState) -> JobRecord:
    record = JobRecord("alice~job", 3, spec("job", vc="prod"), seq=0, now=0.0)
    record.state = state
    record.history = [(S.QUEUED, "queued"), (state, "set up by the test")]
    return record


@pytest.mark.parametrize(("start", "to"), list(itertools.product(S, S)), ids=lambda s: s.name)
def test_every_pair_is_legal_or_raises_with_the_history(start, to):
    record = _record_in(start)
    if (start, to) in LEGAL:
        move(record, to, "the event")
        assert record.state is to
        assert record.history[-1] == (to, "the event")
    else:
        with pytest.raises(IllegalTransition) as raised:
            move(record, to, "the event")
        message = str(raised.value)
        assert "alice~job#3" in message
        assert f"{start.value} -> {to.value} (the event) is not a legal move" in message
        assert "history: queued (queued) -> " + f"{start.value} (set up by the test)" in message
        assert record.state is start and len(record.history) == 2


def test_the_table_is_the_one_tested():
    assert {(start, to) for start, targets in TRANSITIONS.items() for to in targets} == LEGAL


def test_cancel_and_preempt_only_lead_to_legal_moves():
    for table in (CANCELLED_FROM, PREEMPTED_FROM):
        for start, to in table.items():
            assert start is to or (start, to) in LEGAL


def _states(h: Harness, job: str) -> list[AttemptState]:
    return [state for state, _ in h.core._jobs[f"alice~{job}"].history]


def test_a_preemption_walks_the_table():
    h = Harness("mixed-skus")
    h.submit("spill", vc="research", priority="oppo", gpus=4, instances=2, sku="V100")
    assert _states(h, "spill") == [S.QUEUED, S.PLACED]
    decisions = h.submit("owner", vc="prod", gpus=4)
    assert _states(h, "spill") == [S.QUEUED, S.PLACED, S.BEING_PREEMPTED]
    assert _states(h, "owner") == [S.QUEUED, S.PREEMPTING]
    assert h.core._jobs["alice~owner"].history[-1][1] == "preempting alice~spill"
    h.cancel("spill")
    assert _states(h, "spill")[-1] is S.BEING_PREEMPTED_CANCELLED
    victim = h.core._jobs["alice~spill"]
    h.finish_preempted(decisions)
    assert victim.state is S.RELEASED
    assert not h.core.knows("alice~spill")  # cancelled: its Release queues no next attempt
    assert _states(h, "owner") == [S.QUEUED, S.PREEMPTING, S.PLACED]


def test_cancel_of_a_placed_job_waits_for_its_release():
    h = Harness("mixed-skus")
    h.submit("job", vc="prod", gpus=4)
    record = h.core._jobs["alice~job"]
    h.cancel("job")
    assert record.state is S.CANCELLED and record.holds_cells
    h.release("job", requeue=True)
    assert record.state is S.RELEASED and not h.core.knows("alice~job")


def test_validate_state_checks_what_each_state_promises():
    h = Harness("mixed-skus")
    h.submit("job", vc="prod", gpus=4)
    record = h.core._jobs["alice~job"]
    record.state = S.QUEUED  # a placed attempt that claims to hold nothing
    with pytest.raises(AssertionError, match="in state queued .*is not queued"):
        h.core.validate_state()
    record.state = S.CANCELLED
    h.core.validate_state()  # a cancelled attempt holds its cells until its Release
