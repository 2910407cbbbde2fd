"""pai_vc_gpus and pai_cluster_gpus: a VC's GPU capacity as the scheduler sees it
(services/scheduler/metrics.py), from the core's VC status on a real cluster file."""

from __future__ import annotations

from prometheus_client import REGISTRY

from services.scheduler import metrics
from services.scheduler.cluster.published import sku_types_view
from tests.unit.scheduler.builders import Harness


def gpus(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_vc_gpus_count_quota_use_and_opportunistic_work_in_gpus():
    h = Harness("mixed-skus")
    h.submit("train", vc="research", priority="prod", gpus=4, sku="V100")
    skus = sku_types_view(h.config)
    metrics.record_capacity(h.core.vc_status(), skus)
    research = next(vc for vc in h.core.vc_status() if vc.name == "research")
    v100 = next(s for s in research.skus if s.sku == "V100")
    per_leaf = skus["V100"]["gpu"]
    assert gpus("pai_vc_gpus", vc="research", sku="V100", kind="guaranteed") == v100.guaranteed * per_leaf > 0
    assert gpus("pai_vc_gpus", vc="research", sku="V100", kind="used") == 4  # the job's 4 GPUs
    assert gpus("pai_vc_gpus", vc="research", sku="V100", kind="opportunistic") == 0
    assert gpus("pai_cluster_gpus", sku="V100", kind="total") == v100.total * per_leaf
    assert gpus("pai_cluster_gpus", sku="V100", kind="unhealthy") == 0

    # A cluster file without the VC any more: its series go.
    metrics.record_capacity([vc for vc in h.core.vc_status() if vc.name != "research"], skus)
    assert gpus("pai_vc_gpus", vc="research", sku="V100", kind="guaranteed") is None
