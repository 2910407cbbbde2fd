"""The HiveD-style cell scheduler core: pure, synchronous, deterministic (no I/O, injected clock)."""

from services.scheduler.cluster import ClusterConfig, ClusterConfigError, load_cluster_config, local_cluster_config
from services.scheduler.core.decisions import Decision, Place, Preempt, Wait
from services.scheduler.core.events import Cancel, NodeHealth, Release, Restore, SchedulerEvent, Submit, Tick
from services.scheduler.core.scheduler import GANG_PRIORITY_AFTER_S, SchedulerCore
from services.scheduler.core.status import VcSkuStatus, VcStatus

__all__ = [
    "GANG_PRIORITY_AFTER_S",
    "Cancel",
    "ClusterConfig",
    "ClusterConfigError",
    "Decision",
    "NodeHealth",
    "Place",
    "Preempt",
    "Release",
    "Restore",
    "SchedulerCore",
    "SchedulerEvent",
    "Submit",
    "Tick",
    "VcSkuStatus",
    "VcStatus",
    "Wait",
    "load_cluster_config",
    "local_cluster_config",
]
