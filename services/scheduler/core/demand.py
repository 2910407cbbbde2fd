"""What a job asks for, in leaf cells: affinity groups of tasks, each task on one node.

Leaf cells per task on a sku = max over gpu, cpu, memory of ceil(request / what one
leaf cell of the sku offers). A sku dimension of 0 is not accounted, except GPUs:
a sku without GPUs cannot host a task that asks for any. A role's `skuNumber`
(HiveD's leafCellNumber) asks for that many leaf cells per task: it is taken when
it is more than the resources need (never fewer cells than they need).
"""

from __future__ import annotations

import math

import msgspec

from libs.common.protocol.model import JobSpec
from services.scheduler.cluster.model import SkuType

NO_FIT = 1 << 30  # leaf cells of a task that a sku can never host


class TaskDemand(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    index: int
    gpu: int
    cpu: int
    memoryMB: int
    sku: str | None  # None: any sku the VC has
    cells: int | None = None  # the role's skuNumber: leaf cells asked for per task


class GroupDemand(msgspec.Struct, frozen=True, kw_only=True):
    """Tasks placed all together (a gang) or, without gang allocation, one at a time."""

    name: str
    sku: str | None
    tasks: list[TaskDemand]


def leaf_cells_for(task: TaskDemand, sku: SkuType) -> int:
    if task.gpu > 0 and sku.gpu == 0:
        return NO_FIT
    needed = 1
    if sku.gpu > 0:
        needed = max(needed, math.ceil(task.gpu / sku.gpu))
    if sku.cpu > 0:
        needed = max(needed, math.ceil(task.cpu / sku.cpu))
    if sku.memoryMB > 0:
        needed = max(needed, math.ceil(task.memoryMB / sku.memoryMB))
    if task.cells is not None:
        needed = max(needed, task.cells)
    return needed


def affinity_groups(spec: JobSpec) -> list[GroupDemand]:
    """The job's groups in role order.

    Roles without an affinityGroupName form one group together (the whole job by
    default). Tasks of one group asking for different skus are split into one
    group per sku, since a gang lives on one sku.
    """
    groups: dict[tuple[str, str | None], list[TaskDemand]] = {}
    for role in spec.taskRoles:
        group_name = role.affinityGroupName or "default"
        sku = role.skuType or spec.skuType
        tasks = groups.setdefault((group_name, sku), [])
        for index in range(role.instances):
            tasks.append(TaskDemand(role=role.name, index=index, gpu=role.resources.gpu, cpu=role.resources.cpu,
                                    memoryMB=role.resources.memoryMB, sku=sku, cells=role.skuNumber))
    names = [name for name, _ in groups]
    return [
        GroupDemand(name=name if names.count(name) == 1 else f"{name}/{sku}", sku=sku, tasks=tasks)
        for (name, sku), tasks in groups.items()
        if tasks
    ]
