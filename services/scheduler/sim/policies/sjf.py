"""`sjf`: shortest job first with known durations, each VC alone on its quota (a reference point).

Each VC is a private cluster of its quota's nodes (plain GPU counts, no cells).
Waiting jobs are tried shortest first (then by arrival) and every one that fits
starts, so a job that does not fit does not hold up shorter or later ones. Nothing
is preempted. Nobody knows durations in advance in a real cluster: this is a
yardstick for what ordering alone could buy, not a policy PAI offers.
"""

from __future__ import annotations

from bisect import insort

from services.scheduler.sim.cluster import SimCluster
from services.scheduler.sim.policies.base import GUARANTEED, Step
from services.scheduler.sim.policies.nodepool import NodePool
from services.scheduler.sim.workload import SimJob


class ShortestFirstPolicy:
    def __init__(self, cluster: SimCluster, *, name: str = "sjf"):
        self.name = name
        self._pools = {vc: NodePool(nodes) for vc, nodes in cluster.vc_nodes.items()}
        self._queues: dict[str, list[tuple[float, int]]] = {vc: [] for vc in cluster.vc_nodes}
        self._jobs: dict[int, SimJob] = {}
        self._nodes: dict[int, list[int]] = {}
        self._never: dict[int, str] = {}

    def step(self, now: float, *, finished: list[SimJob], requeued: list[SimJob], arrived: list[SimJob],
             woken: list[SimJob]) -> Step:
        changed: dict[str, None] = {}
        for job in finished:
            self._pools[job.vc].release(self._nodes.pop(job.index), job.gpus_per_task)
            changed[job.vc] = None
        for job in arrived:
            self._jobs[job.index] = job
            pool = self._pools[job.vc]
            if not pool.could_ever_fit(job.tasks, job.gpus_per_task):
                self._never[job.index] = (f"needs {job.tasks} x {job.gpus_per_task} GPUs but VC {job.vc}'s private "
                                          f"cluster has {pool.total} GPUs on {len(pool.capacity)} nodes")
                continue
            insort(self._queues[job.vc], (job.duration, job.index))
            changed[job.vc] = None
        started: list[int] = []
        for vc in changed:
            self._fill(vc, started)
        return Step(started=started, preempted=[], wake_at=[])

    def _fill(self, vc: str, started: list[int]) -> None:
        pool = self._pools[vc]
        queue = self._queues[vc]
        kept: list[tuple[float, int]] = []
        failed: list[tuple[int, int]] = []  # shapes that did not fit: larger ones cannot fit either
        for position, entry in enumerate(queue):
            if pool.free_total == 0:
                kept.extend(queue[position:])
                break
            job = self._jobs[entry[1]]
            shape = (job.tasks, job.gpus_per_task)
            if any(shape[0] >= tasks and shape[1] >= per for tasks, per in failed):
                kept.append(entry)
                continue
            nodes = pool.place(job.tasks, job.gpus_per_task)
            if nodes is None:
                failed.append(shape)
                kept.append(entry)
                continue
            self._nodes[job.index] = nodes
            started.append(job.index)
        self._queues[vc] = kept

    def job_class(self, job: SimJob) -> str:
        return GUARANTEED

    def waiting_reason(self, job: SimJob) -> str:
        return self._never.get(job.index, "waiting for GPUs in its VC")
