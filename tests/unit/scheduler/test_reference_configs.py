"""Behaviour on HiveD's own example configs (skipped when the reference files are absent)."""

from __future__ import annotations

import pytest

from services.scheduler.cluster import load_cluster_config

from .builders import Harness, Place, only, quota_leaves, reference_hived
from .test_config import REFERENCE_CONFIGS


@pytest.mark.parametrize("name", REFERENCE_CONFIGS)
def test_every_vc_gets_exactly_its_quota_on_reference_configs(name):
    config = load_cluster_config(reference_hived(name))
    h = Harness(config)
    count = 0
    for vc_name in config.virtualClusters:
        for sku, leaves in quota_leaves(config, vc_name).items():
            placed = 0
            while True:
                count += 1
                if not only(h.submit(f"j{count}", vc=vc_name, sku=sku, gpus=1), Place):
                    break
                placed += 1
            assert placed == leaves, f"VC {vc_name} got {placed} {sku} cells of {leaves}"
            assert f"(0 free of {leaves} guaranteed)" in h.reason(f"j{count}")


@pytest.mark.parametrize("name,vc,pin,node", [
    ("hived-config-1.yaml", "vc2", "VC2-K80", "10.151.41.25"),
    ("hived-config-8.yaml", "vc1", "VC1-K80", "10.151.41.25"),
], ids=["config-1-vc2", "config-8-vc1"])
def test_pinned_cells_of_reference_configs(name, vc, pin, node):
    h = Harness(load_cluster_config(reference_hived(name)))
    [place] = only(h.submit("pinned", vc=vc, pinned=pin, gpus=4), Place)
    assert place.tasks[0].node == node
    [other] = only(h.submit("unpinned", vc=vc, gpus=4), Place)
    assert other.tasks[0].node != node


def test_design_config_places_on_a_node_shared_by_two_gpu_models():
    h = Harness(load_cluster_config(reference_hived("design-hivedscheduler.yaml")))
    [place] = only(h.submit("ct1", vc="VC1", pinned="VC1-YQW-CT1", gpus=1), Place)
    assert (place.tasks[0].node, place.tasks[0].gpus) == ("1.0.0.2", [8])
