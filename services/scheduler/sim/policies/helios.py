"""`helios-fifo` and `helios-sjf`: the published method of HeliosArtifact (Hu et al., SC'21).

HeliosArtifact's simulator (the artifact of *Characterization and Prediction of Deep
Learning Workloads in Large-Scale GPU Datacenters*, MIT licence) replays Philly with
these rules, reimplemented here from their description so that PAI's report carries
a row made the published way:

- Each VC is a private cluster of its quota's nodes; VCs never share GPUs and nothing
  is preempted.
- FIFO orders a VC's queue by arrival, SJF by run time (known in advance), then by
  arrival. Strict head of line: a pass starts jobs from the head of the queue and
  stops at the first one that does not fit, even when later jobs would (no backfill).
- Consolidated placement: a job of at most one node's GPUs goes on the fullest node
  that still has room for all of it (its GPUs never span nodes); a bigger job takes
  whole empty nodes, as many as its GPUs need.

Differences from PAI's own `private` and `sjf` rows are deliberate: those let later
jobs past a head that does not fit and spread a gang's tasks over partly used nodes.
"""

from __future__ import annotations

import heapq
import math

from services.scheduler.sim.cluster import SimCluster
from services.scheduler.sim.policies.base import GUARANTEED, Step
from services.scheduler.sim.policies.nodepool import NodePool
from services.scheduler.sim.workload import SimJob

ORDERS = ("fifo", "sjf")


class HeliosPolicy:
    def __init__(self, cluster: SimCluster, *, order: str, name: str | None = None):
        if order not in ORDERS:
            raise ValueError(f"unknown order {order!r} (known: {', '.join(ORDERS)})")
        self.name = name or f"helios-{order}"
        self._order = order
        self._pools = {vc: NodePool(nodes) for vc, nodes in cluster.vc_nodes.items()}
        # Per VC, a heap of (sort key, arrival index): the head is the next job to start.
        self._queues: dict[str, list[tuple[float, int]]] = {vc: [] for vc in cluster.vc_nodes}
        self._jobs: dict[int, SimJob] = {}
        self._held: dict[int, tuple[list[int], int]] = {}  # job -> (nodes, GPUs taken on each)
        self._never: dict[int, str] = {}

    def step(self, now: float, *, finished: list[SimJob], requeued: list[SimJob], arrived: list[SimJob],
             woken: list[SimJob]) -> Step:
        changed: dict[str, None] = {}
        for job in finished:
            nodes, per_node = self._held.pop(job.index)
            self._pools[job.vc].release(nodes, per_node)
            changed[job.vc] = None
        for job in arrived:
            self._jobs[job.index] = job
            pool = self._pools[job.vc]
            if not _could_ever_fit(pool, job.gpus):
                self._never[job.index] = (f"needs {job.gpus} GPUs but VC {job.vc}'s private cluster has "
                                          f"{pool.total} GPUs on {len(pool.capacity)} nodes")
                continue
            key = job.duration if self._order == "sjf" else float(job.index)
            heapq.heappush(self._queues[job.vc], (key, job.index))
            changed[job.vc] = None
        started: list[int] = []
        for vc in changed:
            self._fill(vc, started)
        return Step(started=started, preempted=[], wake_at=[])

    def _fill(self, vc: str, started: list[int]) -> None:
        pool = self._pools[vc]
        queue = self._queues[vc]
        while queue:
            job = self._jobs[queue[0][1]]
            taken = _place_consolidated(pool, job.gpus)
            if taken is None:
                return  # strict head of line: nobody passes the head
            heapq.heappop(queue)
            self._held[job.index] = taken
            started.append(job.index)

    def job_class(self, job: SimJob) -> str:
        return GUARANTEED

    def waiting_reason(self, job: SimJob) -> str:
        return self._never.get(job.index, f"waiting at or behind the head of VC {job.vc}'s queue")


def _node_size(pool: NodePool) -> int:
    return max(pool.capacity, default=0)


def _could_ever_fit(pool: NodePool, gpus: int) -> bool:
    size = _node_size(pool)
    if gpus <= size:
        return gpus == 0 or any(capacity >= gpus for capacity in pool.capacity)
    return sum(1 for capacity in pool.capacity if capacity == size) >= math.ceil(gpus / size)


def _place_consolidated(pool: NodePool, gpus: int) -> tuple[list[int], int] | None:
    """(nodes, GPUs taken on each) by HeliosArtifact's consolidation, or None with nothing taken."""
    if gpus == 0:
        return [], 0
    size = _node_size(pool)
    if gpus <= size:
        nodes = pool.place(1, gpus)  # best fit: the fullest node with room for the whole job
        return (nodes, gpus) if nodes is not None else None
    # Whole empty nodes; a job of 12 GPUs on 8-GPU nodes holds two nodes (the rest of the second idles).
    count = math.ceil(gpus / size)
    nodes = pool.place(count, size)
    return (nodes, size) if nodes is not None else None
