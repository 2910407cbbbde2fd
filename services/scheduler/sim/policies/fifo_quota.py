"""`fifo-quota`: a quota-based FIFO scheduler without cells, in the manner of YARN's capacity scheduler.

- One shared pool of nodes; a VC's quota is a number of GPUs, not particular cells.
- Each VC's jobs start in arrival order: the first job that does not fit holds up
  the rest of its VC (first in, first out; big jobs are not starved).
- VCs are served in order of how much of their quota they use (least first), so a
  VC below its quota gets free GPUs before one above it.
- Elastic: a VC may run beyond its quota on GPUs nobody else is using, and nothing
  is ever preempted to give them back. This is what lets one VC's long jobs keep
  another VC's quota busy: the sharing anomaly that cells and preemption prevent.
"""

from __future__ import annotations

from collections import deque

from services.scheduler.sim.cluster import SimCluster
from services.scheduler.sim.policies.base import GUARANTEED, OPPORTUNISTIC, Step
from services.scheduler.sim.policies.nodepool import NodePool
from services.scheduler.sim.workload import SimJob


class QuotaFifoPolicy:
    def __init__(self, cluster: SimCluster, *, name: str = "fifo-quota"):
        self.name = name
        self._pool = NodePool(cluster.node_gpus)
        self._quota = dict(cluster.vc_quota)
        self._order = {vc: position for position, vc in enumerate(cluster.vc_quota)}
        self._used = {vc: 0 for vc in cluster.vc_quota}
        self._queues: dict[str, deque[SimJob]] = {vc: deque() for vc in cluster.vc_quota}
        self._nodes: dict[int, list[int]] = {}
        self._beyond_quota: set[int] = set()  # started while its VC was at or over its quota
        self._never: dict[int, str] = {}

    def step(self, now: float, *, finished: list[SimJob], requeued: list[SimJob], arrived: list[SimJob],
             woken: list[SimJob]) -> Step:
        for job in finished:
            self._pool.release(self._nodes.pop(job.index), job.gpus_per_task)
            self._used[job.vc] -= job.gpus
        for job in arrived:
            if not self._pool.could_ever_fit(job.tasks, job.gpus_per_task):
                self._never[job.index] = (f"needs {job.tasks} x {job.gpus_per_task} GPUs but the cluster has "
                                          f"{self._pool.total} GPUs on {len(self._pool.capacity)} nodes")
                continue
            self._queues[job.vc].append(job)
        started: list[int] = []
        if finished or arrived:
            self._fill(started)
        return Step(started=started, preempted=[], wake_at=[])

    def _fill(self, started: list[int]) -> None:
        pool = self._pool
        ready = [vc for vc, queue in self._queues.items() if queue]
        while ready and pool.free_total > 0:
            vc = min(ready, key=lambda name: (self._used[name] / max(self._quota[name], 1), self._order[name]))
            queue = self._queues[vc]
            job = queue[0]
            nodes = pool.place(job.tasks, job.gpus_per_task)
            if nodes is None:
                ready.remove(vc)  # its head waits; the VC's later jobs wait behind it
                continue
            queue.popleft()
            if self._used[vc] + job.gpus > self._quota[vc]:
                self._beyond_quota.add(job.index)
            self._used[vc] += job.gpus
            self._nodes[job.index] = nodes
            started.append(job.index)
            if not queue:
                ready.remove(vc)

    def job_class(self, job: SimJob) -> str:
        """Jobs that ran (at least partly) beyond their VC's quota count as opportunistic."""
        return OPPORTUNISTIC if job.index in self._beyond_quota else GUARANTEED

    def waiting_reason(self, job: SimJob) -> str:
        return self._never.get(job.index, f"waiting in VC {job.vc}'s queue")
