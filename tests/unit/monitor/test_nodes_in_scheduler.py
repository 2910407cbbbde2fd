"""What the monitor's NodeStatus does in the scheduler core: an unhealthy node gets
no new work, its reason reaches the waiting reason people read, and a healthy
report brings it back."""

from __future__ import annotations

from services.scheduler.core import NodeHealth, Place
from tests.unit.scheduler.builders import Harness, only, placed_jobs


def test_a_cordoned_node_is_avoided_and_its_reason_shows_in_the_wait():
    # Shape fallback off: with it the job would run meanwhile on another VC's idle, healthy node as
    # borrowed work (see the test below); here it waits, so its reason can be read.
    h = Harness("eight-gpu-node", shape_fallback=None)
    h.handle(NodeHealth(node="plain-1", healthy=False, reason="cordoned by admin: replacing GPU 3"))
    h.handle(NodeHealth(node="plain-2", healthy=False, reason="lost: no sample from its agent for 31 s (limit 30 s)"))
    assert placed_jobs(h.submit("job", vc="small", gpus=1)) == []
    reason = h.reason("job")
    assert "plain-1: cordoned by admin: replacing GPU 3" in reason
    assert "plain-2: lost: no sample from its agent" in reason

    decisions = h.handle(NodeHealth(node="plain-1", healthy=True, reason=""))
    [place] = only(decisions, Place)
    assert {task.node for task in place.tasks} == {"plain-1"}


def test_with_its_vcs_nodes_cordoned_a_job_runs_meanwhile_on_borrowed_healthy_cells():
    h = Harness("eight-gpu-node")
    h.handle(NodeHealth(node="plain-1", healthy=False, reason="cordoned by admin: replacing GPU 3"))
    h.handle(NodeHealth(node="plain-2", healthy=False, reason="lost: no sample from its agent for 31 s (limit 30 s)"))
    [place] = only(h.submit("job", vc="small", gpus=1), Place)
    assert not {task.node for task in place.tasks} & {"plain-1", "plain-2"}
