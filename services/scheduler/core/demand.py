"""What a job asks for, in leaf cells: affinity groups of tasks, each task on one node.

Leaf cells per task on a sku = max over gpu, cpu, memory of ceil(request / what one
leaf cell of the sku offers). A sku dimension of 0 is not accounted, except GPUs:
a sku without GPUs cannot host a task that asks for any. A role's `skuNumber`
(HiveD's leafCellNumber) asks for that many leaf cells per task: it is taken when
it is more than the resources need (never fewer cells than they need).

Affinity groups follow OpenPAI's rest server and HiveD (docs/scheduling.md): a group is
named within its job (OpenPAI names it `<user>~<job>/<affinityGroupName>`, so two jobs
naming the same group are never placed together). Without any name, the whole job is
one gang; once some role names a group, a role without one has no group: each of its
tasks is placed on its own. A role's pin (`pinnedCellId`, its own or the job's) goes
with its tasks: a group lives in one pinned cell, so the default gang is split per pin
as it is per sku.
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
    pin: str | None = None  # the pinned cell the task must run in (guaranteed work only)


class GroupDemand(msgspec.Struct, frozen=True, kw_only=True):
    """Tasks placed all together (a gang) or, without gang allocation, one at a time."""

    name: str
    sku: str | None
    tasks: list[TaskDemand]
    pin: str | None = None  # every task's pinned cell (one per group)
    # Placed all or nothing: a named affinity group always (HiveD places a group at once), the
    # job's default group as extras.gangAllocation says; else task by task.
    gang: bool = True


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

    No role names an affinity group: the roles form one group together (the whole job).
    Some do: each name is a group, placed all or nothing whatever extras.gangAllocation says,
    and every task of a role without one is a group of its own. Tasks of one group asking for
    different skus or pinned cells (only in the default group: named ones are refused at
    submit) are split into one group per sku and pin, since a gang lives on one sku, in one
    pinned cell.
    """
    named = any(role.affinityGroupName for role in spec.taskRoles)
    groups: dict[tuple[str, str | None, str | None], list[TaskDemand]] = {}
    for role in spec.taskRoles:
        sku = role.skuType or spec.skuType
        pin = spec.pin_of(role)
        for index in range(role.instances):
            if role.affinityGroupName or not named:
                group_name = role.affinityGroupName or "default"
            else:
                group_name = f"{role.name}/{index}"  # HiveD: a pod without an affinity group is its own
            tasks = groups.setdefault((group_name, sku, pin), [])
            tasks.append(TaskDemand(role=role.name, index=index, gpu=role.resources.gpu, cpu=role.resources.cpu,
                                    memoryMB=role.resources.memoryMB, sku=sku, cells=role.skuNumber, pin=pin))
    names = [name for name, _, _ in groups]
    return [
        GroupDemand(name=name if names.count(name) == 1 else f"{name}/{sku}" + (f"/{pin}" if pin else ""),
                    sku=sku, tasks=tasks, pin=pin, gang=named or spec.gangAllocation)
        for (name, sku, pin), tasks in groups.items()
        if tasks
    ]
