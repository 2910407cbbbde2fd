"""The HiveD-style cell scheduler core: pure, synchronous, deterministic (no I/O, injected clock).

    core = SchedulerCore(config, clock=clock)  # config: services.scheduler.cluster.load_cluster_config(path)
    core = SchedulerCore(config, clock=clock, policy=SchedulingPolicy(shape_fallback=None))  # other rules
    core.handle(Restore(...), ...)           # at start-up: attempts already running
    decisions = core.handle(Submit(...))     # -> [Place | Preempt | Wait | Announce, ...]
    core.waiting_reason(job)                 # why a job waits, with current counts
    core.vc_status()                         # per VC and sku: guaranteed/used/total cells, queue
    core.restore_warnings                    # what Restore could not bring back exactly

See `scheduler.py` for the policy (queues, anti-starvation, preemption) and
`cells.py` for buddy allocation and VC safety, `lifecycle.py` for the states of an
attempt. The core reads a `ClusterConfig` but never the file: loading is
`services.scheduler.cluster`'s job, and nothing here imports the loader or YAML.
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
