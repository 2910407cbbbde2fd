"""The `hived` and `private` policies: PAI's own scheduler core, driven through its public API.

Trace jobs become JobSpecs with one task role (`tasks` instances of
`gpus_per_task` GPUs, gang allocation). Which priority a job gets when the trace
gives none is the policy's rule:

- `hived` ("quota" rule): a job is guaranteed (OpenPAI's default class, `test`)
  when its VC's guaranteed jobs, waiting or running, plus this one ask for no more
  GPUs than the VC's quota; otherwise it is submitted as opportunistic. This is how
  PAI is meant to be used: stay within your quota with guaranteed jobs and put the
  surplus on idle cells anywhere, where it may be preempted.
- `private` ("guaranteed" rule): every job is guaranteed, so each VC runs only on
  its own cells, as if it were a private cluster of its quota (HiveD's VC safety).
  Trace-given opportunistic jobs are raised to priority 0.

A job keeps the priority it was submitted with, also when it restarts after a
preemption. Gang jobs wake the core once they have waited its anti-starvation
delay, as the service's periodic Tick would.
"""

from __future__ import annotations

from libs.common.protocol.model import OPPORTUNISTIC_PRIORITY, PRIORITY_CLASSES, JobSpec, Resources, TaskRole
from services.scheduler.core import (
    GANG_PRIORITY_AFTER_S,
    Place,
    Preempt,
    Release,
    SchedulerCore,
    SchedulingPolicy,
    Submit,
    Tick,
)
from services.scheduler.sim.cluster import SimCluster
from services.scheduler.sim.policies.base import GUARANTEED, OPPORTUNISTIC, Step
from services.scheduler.sim.workload import SimJob

GUARANTEED_PRIORITY = PRIORITY_CLASSES["test"]  # OpenPAI's default class
_CLASS_OF = {value: name for name, value in PRIORITY_CLASSES.items()}
_USER = "trace"

PRIORITY_RULES = ("quota", "guaranteed")


class CorePolicy:
    """One SchedulerCore for the whole cluster; the virtual clock is the loop's `now`."""

    def __init__(self, name: str, cluster: SimCluster, *, priority_rule: str):
        if priority_rule not in PRIORITY_RULES:
            raise ValueError(f"unknown priority rule {priority_rule!r} (known: {', '.join(PRIORITY_RULES)})")
        self.name = name
        self._rule = priority_rule
        self._quota = dict(cluster.vc_quota)
        self._now = 0.0
        # `private` runs each VC on its own cells only: no guaranteed job falls back onto idle cells
        # outside its quota (the core's shape fallback), or it would not be the private-cluster baseline.
        policy = SchedulingPolicy(shape_fallback=None) if priority_rule == "guaranteed" else SchedulingPolicy()
        self.core = SchedulerCore(cluster.config, clock=lambda: self._now, policy=policy)
        self._index_of: dict[str, int] = {}
        self._attempt: dict[int, int] = {}
        self._priority: dict[int, int] = {}
        self._guaranteed_gpus = {vc: 0 for vc in cluster.vc_quota}  # waiting or running, per VC
        self._waiting: set[int] = set()  # submitted or requeued, not placed yet

    @staticmethod
    def core_job_id(job: SimJob) -> str:
        return f"{_USER}~j{job.index}"

    def step(self, now: float, *, finished: list[SimJob], requeued: list[SimJob], arrived: list[SimJob],
             woken: list[SimJob]) -> Step:
        self._now = now
        events: list = []
        for job in finished:
            if self._priority[job.index] > OPPORTUNISTIC_PRIORITY:
                self._guaranteed_gpus[job.vc] -= job.gpus
            events.append(Release(job=self.core_job_id(job), attempt=self._attempt[job.index], requeue=False))
        step = Step(started=[], preempted=[], wake_at=[])
        for job in requeued:
            events.append(Release(job=self.core_job_id(job), attempt=self._attempt[job.index], requeue=True))
            self._waiting.add(job.index)
            self._wake_if_gang(job, now, step)
        for job in arrived:
            events.append(Submit(job=self.core_job_id(job), attempt=1, spec=self._spec(job)))
            self._attempt[job.index] = 1
            self._waiting.add(job.index)
            self._wake_if_gang(job, now, step)
        if any(job.index in self._waiting for job in woken):
            events.append(Tick())
        if not events:
            return step
        for decision in self.core.handle(*events):
            match decision:
                case Place(partial=False):  # one role, gang allocation: the whole job is placed at once
                    index = self._index_of[decision.job]
                    self._attempt[index] = decision.attempt
                    self._waiting.discard(index)
                    step.started.append(index)
                case Preempt():
                    step.preempted.append(self._index_of[decision.job])
        return step

    def _wake_if_gang(self, job: SimJob, now: float, step: Step) -> None:
        if job.tasks > 1:
            step.wake_at.append((now + GANG_PRIORITY_AFTER_S, job.index))

    def _spec(self, job: SimJob) -> JobSpec:
        priority = self._choose_priority(job)
        self._priority[job.index] = priority
        self._index_of[self.core_job_id(job)] = job.index
        role = TaskRole(name="worker", instances=job.tasks,
                        resources=Resources(gpu=job.gpus_per_task, cpu=0, memoryMB=0))
        return JobSpec(name=f"j{job.index}", user=_USER, virtualCluster=job.vc, priority=priority,
                       priorityClass=_CLASS_OF.get(priority, "test"), gangAllocation=True, taskRoles=[role])

    def _choose_priority(self, job: SimJob) -> int:
        if self._rule == "guaranteed":
            priority = GUARANTEED_PRIORITY if job.priority is None else max(job.priority, 0)
        elif job.priority is not None:
            priority = job.priority
        elif self._guaranteed_gpus[job.vc] + job.gpus <= self._quota[job.vc]:
            priority = GUARANTEED_PRIORITY
        else:
            priority = OPPORTUNISTIC_PRIORITY
        if priority > OPPORTUNISTIC_PRIORITY:
            self._guaranteed_gpus[job.vc] += job.gpus
        return priority

    def job_class(self, job: SimJob) -> str:
        return OPPORTUNISTIC if self._priority[job.index] <= OPPORTUNISTIC_PRIORITY else GUARANTEED

    def waiting_reason(self, job: SimJob) -> str:
        return self.core.waiting_reason(self.core_job_id(job)) or "waiting (the scheduler core gave no reason)"
