"""The read-only views: vc_status() for GET /api/v2/virtual-clusters, node_names()."""

from __future__ import annotations

import msgspec

from services.scheduler.core import VcSkuStatus

from .builders import Harness


def by_vc(h: Harness) -> dict[str, dict]:
    return {vc.name: {"skus": {s.sku: s for s in vc.skus}, "queued": vc.queued, "running": vc.running}
            for vc in h.core.vc_status()}


def test_idle_cluster_status_lists_each_vcs_guarantee_per_sku():
    status = by_vc(Harness("mixed-skus"))
    assert list(status) == ["research", "prod", "ops"]
    assert status["research"]["skus"]["V100"] == VcSkuStatus(sku="V100", guaranteed=4, used=0, opportunistic=0,
                                                            total=8, unhealthy=0)
    assert status["research"]["skus"]["T4"].guaranteed == 2
    assert {sku: s.guaranteed for sku, s in status["ops"]["skus"].items()} == {"CPU": 8, "T4": 2}


def test_status_counts_used_opportunistic_queued_running_and_unhealthy():
    h = Harness("mixed-skus")
    h.submit("a", vc="research", sku="V100", gpus=2)
    h.submit("b", vc="research", sku="V100", priority="oppo", gpus=4)
    h.submit("c", vc="research", sku="V100", gpus=4)
    h.node("10.0.1.1", False)
    status = by_vc(h)["research"]
    v100 = status["skus"]["V100"]
    assert (v100.used, v100.opportunistic) == (2, 4)
    assert (status["queued"], status["running"]) == (1, 2)
    assert status["skus"]["T4"].unhealthy == 2


def test_status_is_json_serialisable():
    h = Harness("two-racks")
    h.submit("a", vc="speech", gpus=1)
    data = msgspec.json.decode(msgspec.json.encode(h.core.vc_status()))
    assert data[1]["name"] == "speech" and data[1]["skus"][0]["used"] == 1


def test_node_names_follow_the_config():
    h = Harness("mixed-skus")
    assert h.core.node_names() == h.config.node_names() == [
        "10.0.0.1", "10.0.0.2", "10.0.1.1", "10.0.1.2", "10.0.2.1"]
