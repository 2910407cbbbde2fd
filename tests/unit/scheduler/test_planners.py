"""One table per placement mode's planner (services/scheduler/core/placing.py).

Each row sets up a cluster, then asks one planner where a job not yet submitted would go:
the nodes of its tasks and the jobs it would preempt, or None (the mode finds no room). A
change to one placement rule is a change to one planner and to its table here.

The cluster: two racks of two 4-GPU nodes (a1, a2 | b1, b2); VCs a and b are promised two
nodes each, and no VC's quota is a whole rack.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.scheduler.cluster import load_cluster_config
from services.scheduler.core import SchedulingPolicy
from services.scheduler.core.eligibility import candidate_skus
from services.scheduler.core.placing import PLANNERS, PlacementMode, candidates, modes_for
from tests.unit.scheduler.builders import Harness, role, spec

M = PlacementMode
HOURS = 3600.0


def _config():
    return load_cluster_config({
        "physicalCluster": {
            "skuTypes": {"gpu": {"gpu": 1}},
            "cellTypes": {"gpu-node": {"childCellType": "gpu", "childCellNumber": 4, "isNodeLevel": True},
                          "gpu-rack": {"childCellType": "gpu-node", "childCellNumber": 2}},
            "physicalCells": [{"cellType": "gpu-rack", "cellChildren": [{"cellAddress": "a1"}, {"cellAddress": "a2"}]},
                              {"cellType": "gpu-rack", "cellChildren": [{"cellAddress": "b1"}, {"cellAddress": "b2"}]}],
        },
        "virtualClusters": {"a": {"virtualCells": [{"cellType": "gpu-rack.gpu-node", "cellNumber": 2}]},
                            "b": {"virtualCells": [{"cellType": "gpu-rack.gpu-node", "cellNumber": 2}]}},
    })


Setup = Callable[[Harness], object]


def nothing(h: Harness) -> None:
    pass


def a_runs(*gpus: int, priority: str = "prod", vc: str = "a") -> Setup:
    """The VC's guaranteed jobs of these sizes run (named g0, g1, ... for VC a, h0, ... for b)."""
    def setup(h: Harness) -> None:
        for n, size in enumerate(gpus):
            h.submit(f"{'g' if vc == 'a' else 'h'}{n}", vc=vc, gpus=size, priority=priority)
    return setup


def borrowers(*gpus: int, vc: str = "b", hours: float = 0.0) -> Setup:
    """Opportunistic jobs of these sizes run (named o0, o1, ...); `hours` pass."""
    def setup(h: Harness) -> None:
        for n, size in enumerate(gpus):
            h.submit(f"o{n}", vc=vc, gpus=size, priority="oppo")
        h.clock.advance(hours * HOURS)
    return setup


def both(*setups: Setup) -> Setup:
    def setup(h: Harness) -> None:
        for each in setups:
            each(h)
    return setup


def probe(setup: Setup, mode: PlacementMode, *, preemptions: int = 0, policy: dict | None = None,
          config: str | None = None, **job) -> tuple[list[str], list[str]] | None:
    """Where the mode's planner would put a job submitted now: (nodes of its tasks, jobs it would
    preempt), or None. Nothing is committed. `config`: a fixture cluster instead of the racks."""
    h = Harness(config or _config(), **(policy or {}))
    setup(h)
    core = h.core
    record = core._new_record("alice~probe", 0, spec("probe", **job))
    record.preemptions = preemptions
    vc = core._state.vcs[record.vc]
    group = record.groups[0]
    skus = candidate_skus(core._state, record, vc, group)
    for cand in candidates(core._planning, record, vc, group.tasks, skus):
        plan = PLANNERS[mode](core._planning, record, vc, cand)
        if plan is not None:
            nodes = sorted(leaves[0].node.name for leaves in plan.leaves)
            victims = sorted({leaf.job.id.split("~")[1] for leaves in plan.leaves for leaf in leaves
                              if leaf.job is not None})
            plan.abandon()
            return nodes, victims
    return None


# (what the row shows, setup, job, expected)
IDLE = [
    ("an idle cluster: the best fitting cell no VC holds", nothing, {}, (["a1"], [])),
    ("a node's worth across the cluster, whole node first", nothing, {"gpus": 4}, (["a1"], [])),
    ("a gang of two nodes", nothing, {"gpus": 4, "instances": 2}, (["a1", "a2"], [])),
    ("VC a bound a1: a cell no VC holds (a2, best fit) before a1's holes", a_runs(1), {}, (["a2"], [])),
    ("every cell no VC holds is taken: a hole of a VC cell", both(a_runs(1), borrowers(4, 4, 4)), {},
     (["a1"], [])),
    ("over its preemption budget: only cells no VC holds", both(a_runs(1), borrowers(4, 4, 4)), {"preemptions": 2},
     None),
    ("half a node or more is a large borrower: only cells no VC holds", both(a_runs(1), borrowers(4, 4, 4)),
     {"gpus": 2}, None),
    ("a whole node is no large borrower", borrowers(4, 4, 4), {"gpus": 4}, (["b2"], [])),
    ("no idle cell big enough", borrowers(4, 4, 4, 2), {"gpus": 4}, None),
]

FREE_BOUND = [
    ("nothing bound yet: binds nothing, so no room", nothing, {}, None),
    ("a bound node's free GPUs", a_runs(1), {}, (["a1"], [])),
    ("larger than the bound node's room", a_runs(1), {"gpus": 4}, None),
    ("the quota is used up", a_runs(4, 4), {}, None),
    ("a borrower in the bound node's hole is not taken", both(a_runs(1), borrowers(4, 4, 4, 1)), {"gpus": 3}, None),
]

OPPO_BOUND = [
    ("no opportunistic work anywhere", a_runs(1), {"gpus": 4}, None),
    ("the borrower in the bound node's hole gives way", both(a_runs(1), borrowers(4, 4, 4, 1)), {"gpus": 3},
     (["a1"], ["o3"])),
    ("a borrower that ran 6 h x 1 GPU (6 GPU-h > 5) is kept while the VC may bind",
     both(a_runs(1), borrowers(4, 4, 4, 1, hours=6)), {"gpus": 3}, None),
    ("the quota is used up", a_runs(4, 4), {}, None),
]

FREE = [
    ("nothing bound: binds a node", nothing, {"gpus": 4}, (["a1"], [])),
    ("the bound node first", a_runs(1), {}, (["a1"], [])),
    ("binds a second node when the first is full", a_runs(4), {}, (["a2"], [])),
    ("free GPUs but none inside the VC's reach: a borrower on every node", borrowers(4, 4, 4, 4), {}, None),
    ("the quota is used up", a_runs(4, 4), {}, None),
]

TAKE_OPPO = [
    ("binds the node of the youngest borrower, which gives way", borrowers(4, 4, 4, 4), {"gpus": 4},
     (["b2"], ["o3"])),
    ("free GPUs first: no borrower taken", borrowers(1, 1, 1, 1), {"gpus": 1}, (["a2"], [])),
    ("no opportunistic work", a_runs(4), {"gpus": 4}, None),
    ("the quota is used up", both(a_runs(4, 4), borrowers(4)), {}, None),
]

VICTIMS = [
    ("a lower-priority job of the VC holds the quota: the most recent gives way", a_runs(4, 4, priority="test"),
     {"gpus": 4}, (["a2"], ["g1"])),
    ("one task's worth: still one whole victim", a_runs(4, 4, priority="test"), {"gpus": 1}, (["a2"], ["g1"])),
    ("the same priority is not preempted", a_runs(4, 4), {"gpus": 4}, None),
    ("nothing of the VC runs", nothing, {"gpus": 4}, None),
]

BORROW = [
    ("every VC cell has some of the VC's work: idle cells no VC holds", a_runs(3, 3), {"gpus": 2}, (["b1"], [])),
    ("over its quota in count: not a matter of shape", a_runs(3, 3), {"gpus": 4}, None),
    ("only cells no VC holds (unheld): none idle", both(a_runs(3, 3), a_runs(2, vc="b"), borrowers(4)),
     {"gpus": 2}, None),
    ("shape_fallback idle: a hole of another VC's cell will do",
     both(a_runs(3, 3), a_runs(2, vc="b"), borrowers(4)), {"gpus": 2, "policy": {"shape_fallback": "idle"}},
     (["b1"], [])),
    ("shape_fallback off", a_runs(3, 3), {"gpus": 2, "policy": {"shape_fallback": None}}, None),
]

TABLES = {M.IDLE: IDLE, M.FREE_BOUND: FREE_BOUND, M.OPPO_BOUND: OPPO_BOUND, M.FREE: FREE, M.TAKE_OPPO: TAKE_OPPO,
          M.VICTIMS: VICTIMS, M.BORROW: BORROW}


def _rows():
    for mode, table in TABLES.items():
        for what, setup, job, expected in table:
            yield pytest.param(mode, setup, job, expected, id=f"{mode.value}: {what}")


@pytest.mark.parametrize("mode, setup, job, expected", list(_rows()))
def test_planner(mode, setup, job, expected):
    job = dict(job)
    job.setdefault("vc", "b" if mode is M.IDLE else "a")
    job.setdefault("priority", "oppo" if mode is M.IDLE else "prod")
    assert probe(setup, mode, **job) == expected


def team_runs(*jobs: tuple[int, str | None, str]) -> Setup:
    """VC team's guaranteed jobs run: (gpus, pinned cell or None, priority), named g0, g1, ..."""
    def setup(h: Harness) -> None:
        for n, (gpus, pin, priority) in enumerate(jobs):
            h.submit(f"g{n}", vc="team", gpus=gpus, pinned=pin, priority=priority)
    return setup


# A group's pinned cell (its role's pinnedCellId) bounds where each planner looks: the cluster
# tests/fixtures/clusters/pinned-cells.yaml, VC team: pin-a = node p1, pin-b = node p2, and one
# virtual node (n1 or n2).
PINNED = [
    (M.FREE, "pinned: its pinned cell", nothing, {"gpus": 4, "pinned": "pin-a"}, (["p1"], [])),
    (M.FREE, "the other pin", nothing, {"gpus": 4, "pinned": "pin-b"}, (["p2"], [])),
    (M.FREE, "not pinned: never a pinned cell", nothing, {"gpus": 4}, (["n1"], [])),
    (M.FREE, "the role's pin, not the job's", nothing, {"pinned": "pin-a", "roles": [role("w", gpus=4, pinned="pin-b")]},
     (["p2"], [])),
    (M.FREE, "its pin is full: no room, though the VC's other cells are free", team_runs((4, "pin-a", "prod")),
     {"gpus": 1, "pinned": "pin-a"}, None),
    (M.FREE_BOUND, "a pinned cell binds nothing: its free leaves", team_runs((1, "pin-b", "prod")),
     {"gpus": 2, "pinned": "pin-b"}, (["p2"], [])),
    (M.VICTIMS, "a lower-priority job in its pin gives way", team_runs((4, "pin-a", "test"), (4, "pin-b", "test")),
     {"gpus": 4, "pinned": "pin-b"}, (["p2"], ["g1"])),
]


@pytest.mark.parametrize("mode, setup, job, expected",
                         [pytest.param(m, s, j, e, id=f"{m.value}: {w}") for m, w, s, j, e in PINNED])
def test_planner_in_a_pinned_cell(mode, setup, job, expected):
    assert probe(setup, mode, config="pinned-cells", vc="team", priority="prod", **job) == expected


def test_every_mode_has_a_planner_and_a_table():
    assert set(PLANNERS) == set(PlacementMode) == set(TABLES)


@pytest.mark.parametrize("priority, falling_back, compact, modes", [
    ("oppo", False, True, (M.IDLE,)),
    ("oppo", True, True, (M.IDLE,)),
    ("prod", False, True, (M.FREE_BOUND, M.OPPO_BOUND, M.FREE, M.TAKE_OPPO, M.VICTIMS)),
    ("prod", False, False, (M.FREE, M.TAKE_OPPO, M.VICTIMS)),
    ("prod", True, True, (M.BORROW,)),
])
def test_the_modes_a_job_tries_in_order(priority, falling_back, compact, modes):
    h = Harness(_config(), compact_before_binding=compact)
    record = h.core._new_record("alice~probe", 0, spec("probe", vc="a", priority=priority))
    assert modes_for(record, SchedulingPolicy(compact_before_binding=compact), falling_back=falling_back) == modes
