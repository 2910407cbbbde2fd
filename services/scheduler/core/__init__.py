"""The HiveD-style cell scheduler core: pure, synchronous, deterministic (no I/O, injected clock).

    core = SchedulerCore(config, clock=clock)  # config: services.scheduler.cluster.load_cluster_config(path)
    core = SchedulerCore(config, clock=clock, policy=SchedulingPolicy(shape_fallback=None))  # other rules
    core.handle(Restore(...), ...)           # at start-up: attempts already running
    decisions = core.handle(Submit(...))     # -> [Place | Preempt | Wait | Announce, ...]
    core.waiting_reason(job)                 # why a job waits, with current counts
    core.vc_status()                         # per VC and sku: guaranteed/used/total cells, queue
    core.restore_warnings                    # what Restore could not bring back exactly

The core reads a `ClusterConfig` but never the file: loading is
`services.scheduler.cluster`'s job, and nothing here imports the loader or YAML.

Where things are:

    policy.py      SchedulingPolicy: every switch of the policy, frozen; the rules in words
    scheduler.py   SchedulerCore: events in, decisions out; the core's books; committing a plan
    passes.py      SchedulingPass: one pass over the dirty queue lists (an object per pass)
    placing.py     PlacementMode and one planner per mode; Placed / Reserved outcomes
    rules.py       small rules about one attempt (budget, large borrower, fallback kind, bucket)
    borrowers.py   opportunistic work by age; the adaptive idle reserve
    waits.py       reasons, Wait and Announce, decisions given again after NotSent
    queues.py      queue order, lanes, sku lists and buckets; fairness.py: fair share in a VC
    jobs.py        JobRecord (spec, lifecycle, cells) with QueueNotes (the queue's bookkeeping)
                   and Told (what the shell was told); lifecycle.py: the states of an attempt
    state.py       ClusterState: VC quotas, bindings, every leaf change, freed-cell marks
    cells.py, buddy.py, planner.py, search.py, preemption.py: cells and how tasks fit them
    demand.py, eligibility.py, restore.py, truth.py, status.py, invariants.py, reasons.py

To change one placement rule: edit its planner in placing.py (the order modes are tried
in is `modes_for`) and its table in tests/unit/scheduler/test_planners.py; to add a switch,
add a field to SchedulingPolicy and read it where the rule is applied.
"""

from services.scheduler.cluster.model import ClusterConfig
from services.scheduler.core.decisions import Announce, Decision, Place, Preempt, Wait
from services.scheduler.core.events import (
    Cancel,
    NodeHealth,
    NotSent,
    RefreshReasons,
    Release,
    Restore,
    SchedulerEvent,
    Submit,
    Tick,
)
from services.scheduler.core.policy import (
    ANNOUNCE_WAIT_AFTER_S,
    GANG_PRIORITY_AFTER_S,
    AdaptiveReserve,
    SchedulingPolicy,
    ShapeFallback,
)
from services.scheduler.core.scheduler import SchedulerCore
from services.scheduler.core.status import VcSkuStatus, VcStatus

__all__ = [
    "ANNOUNCE_WAIT_AFTER_S",
    "GANG_PRIORITY_AFTER_S",
    "AdaptiveReserve",
    "Announce",
    "Cancel",
    "ClusterConfig",
    "Decision",
    "NodeHealth",
    "NotSent",
    "Place",
    "Preempt",
    "RefreshReasons",
    "Release",
    "Restore",
    "SchedulerCore",
    "SchedulerEvent",
    "SchedulingPolicy",
    "ShapeFallback",
    "Submit",
    "Tick",
    "VcSkuStatus",
    "VcStatus",
    "Wait",
]
