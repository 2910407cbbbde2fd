"""rest's submit-time rule: a guaranteed job that can never fit its VC, even empty, is refused."""

from __future__ import annotations

import pytest

from libs.common.protocol.model import JobSpec, Resources, TaskRole
from libs.common.schedule import ClusterView
from services.rest.capacity import cells_per_instance, never_fits

CPU_SKU = {"gpu": 0, "cpu": 1, "memory": 2048, "maxLeafCellsPerNode": 8}
GPU_SKU = {"gpu": 1, "cpu": 4, "memory": 16384, "maxLeafCellsPerNode": 4}


def view(vc_skus: dict[str, int], sku_types=None, vc="default") -> ClusterView:
    return ClusterView(
        virtualClusters=[{"name": vc, "skus": [{"sku": s, "guaranteed": n} for s, n in vc_skus.items()]}],
        skuTypes={"cpu": CPU_SKU, "gpu": GPU_SKU} if sku_types is None else sku_types,
    )


def job(*roles: TaskRole, gang=True, priority=100, sku=None, pinned=None) -> JobSpec:
    return JobSpec(name="j", user="alice", taskRoles=list(roles), gangAllocation=gang, priority=priority,
                   skuType=sku, pinnedCellId=pinned)


def role(name="worker", instances=1, cpu=1, gpu=0, memory=512, sku=None, group=None) -> TaskRole:
    return TaskRole(name=name, instances=instances, resources=Resources(cpu=cpu, gpu=gpu, memoryMB=memory),
                    skuType=sku, affinityGroupName=group)


@pytest.mark.parametrize("task,sku,cells", [
    (role(cpu=1, memory=512), CPU_SKU, 1),
    (role(cpu=3, memory=512), CPU_SKU, 3),
    (role(cpu=1, memory=5000), CPU_SKU, 3),
    (role(gpu=2, cpu=1), GPU_SKU, 2),
    (role(gpu=1, cpu=10), GPU_SKU, 3),
    (role(gpu=1), CPU_SKU, None),
    (role(cpu=100), {"gpu": 1, "cpu": 0, "memory": 0}, 1),
], ids=["one-cpu", "three-cpus", "memory-decides", "two-gpus", "cpu-decides-on-gpu-sku", "gpu-on-cpu-sku",
        "unaccounted-cpu"])
def test_cells_per_instance(task, sku, cells):
    assert cells_per_instance(task, sku) == cells


@pytest.mark.parametrize("spec,cluster,fragment", [
    (job(role(instances=8)), view({"cpu": 8}), None),
    (job(role(instances=9)), view({"cpu": 8}), "needs 9 cpu cells at once (gang), but virtual cluster default has 8"),
    (job(role(instances=9), gang=False), view({"cpu": 8}), None),
    (job(role(cpu=9)), view({"cpu": 16}), "needs 9 cpu cells per instance on one node, but the largest cpu node has 8"),
    (job(role("server"), role("worker", instances=3)), view({"cpu": 3}), "task role server, worker needs 4 cpu cells"),
    (job(role(gpu=1, sku="gpu")), view({"cpu": 8}), "needs 1 gpu cells at once (gang), but virtual cluster default has 0"),
    (job(role(gpu=1)), view({"cpu": 8}), "asks for 1 GPUs per instance but sku cpu has none"),
    (job(role(gpu=1)), view({"cpu": 8, "gpu": 4}), None),
    (job(role(sku="tpu")), view({"cpu": 8}), "asks for sku tpu, which the cluster does not have"),
    (job(role(instances=9), priority=-1), view({"cpu": 8}), None),
    (job(role(instances=9), pinned="rack-1"), view({"cpu": 8}), None),
    (job(role(instances=9)), view({"cpu": 8}, sku_types={}), None),
    (job(role(instances=9)), view({"cpu": 8}, vc="other"), None),
    (job(role(instances=2)), view({}), "virtual cluster default has no cells at all"),
    (job(role("a", instances=5, group="x"), role("b", instances=5, group="y")), view({"cpu": 8}), None),
], ids=["exactly-fits", "gang-too-big", "no-gang-fits-one-by-one", "instance-bigger-than-a-node", "names-every-role",
        "sku-not-in-vc", "gpu-task-on-cpu-only-vc", "any-sku-picks-the-gpu-one", "unknown-sku", "opportunistic-skipped",
        "pinned-skipped", "no-sku-types-published", "unknown-vc-left-to-its-own-error", "empty-vc",
        "affinity-groups-each-fit"])
def test_never_fits(spec, cluster, fragment):
    problem = never_fits(spec, cluster)
    if fragment is None:
        assert problem is None
    else:
        assert problem is not None and fragment in problem.message
        assert problem.path == f"taskRoles.{spec.taskRoles[0].name}"


PINNED = [{"pinnedCellId": "pin-a", "sku": "gpu", "leafCells": 8, "nodeLeafCells": 4},
          {"pinnedCellId": "pin-b", "sku": "gpu", "leafCells": 4, "nodeLeafCells": 4}]


def pinned_view() -> ClusterView:
    return ClusterView(virtualClusters=[{"name": "default", "skus": [{"sku": "cpu", "guaranteed": 8},
                                                                     {"sku": "gpu", "guaranteed": 12}],
                                         "pinnedCells": PINNED}],
                       skuTypes={"cpu": CPU_SKU, "gpu": GPU_SKU})


def pinned_role(name="worker", instances=1, gpu=1, pin=None, group=None, sku_number=None) -> TaskRole:
    return TaskRole(name=name, instances=instances, resources=Resources(cpu=1, gpu=gpu, memoryMB=512),
                    pinnedCellId=pin, affinityGroupName=group, skuNumber=sku_number)


ROLE_PIN = "extras.hivedScheduler.taskRoles.{}.pinnedCellId"


@pytest.mark.parametrize("spec,path,fragment", [
    (job(pinned_role("ps", pin="pin-a"), pinned_role(pin="pin-b", instances=4)), None, None),
    (job(pinned_role(pin="nowhere")), ROLE_PIN.format("worker"),
     "pinned cell 'nowhere' is not one of virtual cluster default's pinned cells (pin-a, pin-b)"),
    (job(pinned_role(pin="pin-a"), pinned=None), None, None),
    (job(pinned_role(pin="elsewhere"), pinned="elsewhere"), "extras.hivedScheduler.pinnedCellId",
     "pinned cell 'elsewhere' is not one of"),
    (job(pinned_role(pin="pin-b", instances=5)), ROLE_PIN.format("worker"),
     "needs 5 gpu cells at once (gang), but pinned cell pin-b has 4 in all"),
    (job(pinned_role(pin="pin-b", instances=5), gang=False), None, None),
    (job(pinned_role(pin="pin-a", gpu=5)), ROLE_PIN.format("worker"),
     "needs 5 gpu cells per instance on one node, but the largest node of pinned cell pin-a has 4"),
    (job(pinned_role(pin="pin-a", sku_number=6)), ROLE_PIN.format("worker"), "needs 6 gpu cells per instance"),
    (job(pinned_role(pin="pin-a"), sku="cpu"), ROLE_PIN.format("worker"), "pinned cell pin-a has sku gpu, not cpu"),
    # With a named group, a role without one is placed task by task: 9 one-GPU tasks, no gang of 9.
    (job(pinned_role("ps", group="g"), pinned_role(instances=9)), None, None),
    (job(pinned_role("ps"), pinned_role(instances=12)), "taskRoles.ps", "needs 13 gpu cells at once (gang)"),
    (job(pinned_role(instances=13, group="g"), gang=False), "taskRoles.worker", "needs 13 gpu cells at once (gang)"),
], ids=["two-roles-two-pins", "unknown-pin", "one-pinned-role", "unknown-job-pin", "gang-bigger-than-the-pin",
        "no-gang-fits", "task-bigger-than-the-pins-nodes", "sku-number-counted", "pin-of-another-sku",
        "unnamed-role-beside-a-group-is-no-gang", "without-names-one-gang", "a-named-group-is-a-gang-anyway"])
def test_pins_checked_at_submit_name_the_field(spec, path, fragment):
    problem = never_fits(spec, pinned_view())
    if fragment is None:
        assert problem is None
    else:
        assert problem is not None and fragment in problem.message
        assert problem.path == path
