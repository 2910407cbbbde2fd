"""Every metric the scheduler exports."""

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

DECISIONS = Counter("pai_scheduler_decisions_total", "Scheduling decisions by kind", ["kind"])
BATCH_EVENTS = Histogram(
    "pai_scheduler_batch_events",
    "Events handled together in one core call (one fetched batch)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
ENTRIES_WRITTEN = Counter(
    "pai_scheduler_schedule_writes_total", "Entries of pai_schedule stored or deleted (one per touched job per batch)"
)
# A VC's GPUs per sku: its quota (guaranteed: virtual and pinned cells), what its
# guaranteed jobs hold (used), and what its opportunistic jobs hold anywhere.
VC_GPUS = Gauge("pai_vc_gpus", "GPUs of a virtual cluster per sku, by kind: guaranteed (its quota), used (by its "
                "guaranteed jobs), opportunistic (held by its opportunistic jobs anywhere).", ["vc", "sku", "kind"])
# The cluster's GPUs per sku: all of them, and those on unhealthy nodes.
CLUSTER_GPUS = Gauge("pai_cluster_gpus", "GPUs of the cluster per sku: total, and unhealthy (on unhealthy nodes).",
                     ["sku", "kind"])
_VC_KINDS = ("guaranteed", "used", "opportunistic")


def record_capacity(vcs: Iterable[Any], sku_types: Mapping[str, Mapping[str, Any]]) -> None:
    """Set the capacity gauges from the core's VC status (leaf cells) and each sku's
    GPUs per leaf cell; a VC or sku no longer in the cluster file is dropped."""
    VC_GPUS.clear()
    CLUSTER_GPUS.clear()
    for vc in vcs:
        for sku in vc.skus:
            gpus = int(sku_types.get(sku.sku, {}).get("gpu", 0))
            for kind in _VC_KINDS:
                VC_GPUS.labels(vc.name, sku.sku, kind).set(getattr(sku, kind) * gpus)
            CLUSTER_GPUS.labels(sku.sku, "total").set(sku.total * gpus)
            CLUSTER_GPUS.labels(sku.sku, "unhealthy").set(sku.unhealthy * gpus)
