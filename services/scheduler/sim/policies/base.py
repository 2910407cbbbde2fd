"""What the simulator's event loop asks of a scheduling policy.

The loop owns time and job durations; a policy only decides. At each virtual
instant the loop hands over, in this order, the jobs that finished, the jobs whose
preemption has completed (they wait again, to restart from scratch), the jobs that
arrived and the jobs whose wake-up time has come; the policy answers which jobs
start now and which running jobs it preempts.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from services.scheduler.sim.workload import SimJob

GUARANTEED, OPPORTUNISTIC = "guaranteed", "opportunistic"


class Step(msgspec.Struct, kw_only=True):
    started: list[int] = []  # job indices, in the order the policy placed them
    preempted: list[int] = []  # running job indices to stop; the loop hands them back as `requeued`
    wake_at: list[tuple[float, int]] = []  # (time, job index): call `step` then with the job in `woken`


class Policy(Protocol):
    name: str

    def step(self, now: float, *, finished: list[SimJob], requeued: list[SimJob], arrived: list[SimJob],
             woken: list[SimJob]) -> Step: ...

    def job_class(self, job: SimJob) -> str:
        """GUARANTEED or OPPORTUNISTIC, as the job was submitted."""
        ...

    def waiting_reason(self, job: SimJob) -> str:
        """Why a job that never started is still waiting when nothing else happens."""
        ...
