"""Can a job ever fit its virtual cluster? Decided at submit, from the scheduler's
published `ClusterView` (pure; table-tested in tests/unit/test_rest_capacity.py).

A guaranteed job whose gang needs more cells than its VC has in all, even with
the VC empty, would wait forever; rest refuses it with a 400 naming the task
role, the cells it needs and the VC's total. The scheduler applies the same rule
again (it is the judge: this is an early answer, and the cluster may change);
where the view says nothing (no sku types published yet, an opportunistic job
that may use any idle cell) rest lets the scheduler decide.

A role's pinnedCellId must be one of its VC's pinned cells, and what the role's
affinity group asks of it must fit there (its largest node, the whole cell); the
problem names the field to change, `extras.hivedScheduler.taskRoles.<role>.pinnedCellId`
(or the job's `extras.hivedScheduler.pinnedCellId` where the pin is the job's). Affinity
groups are HiveD's (services/scheduler/core/demand.py): without any name the job is one
gang; with names, a role without one is placed task by task.

Cells per task follow HiveD: the leaf cells of a sku whose cpu, memory and gpu
together cover the task's request (a dimension the sku does not account is free).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from libs.common.protocol.model import JobSpec, TaskRole
from libs.common.schedule import ClusterView


class FitProblem(msgspec.Struct, frozen=True, kw_only=True):
    path: str  # the job field to change, e.g. "taskRoles.worker"
    message: str


def cells_per_instance(role: TaskRole, sku: dict[str, Any]) -> int | None:
    """Leaf cells of `sku` one instance of `role` takes; None when the sku has no GPU it asks for."""
    gpu, cpu, memory = int(sku.get("gpu", 0)), int(sku.get("cpu", 0)), int(sku.get("memory", 0))
    wanted = role.resources
    if wanted.gpu > 0 and gpu == 0:
        return None
    cells = 1
    if gpu > 0:
        cells = max(cells, math.ceil(wanted.gpu / gpu))
    if cpu > 0:
        cells = max(cells, math.ceil(wanted.cpu / cpu))
    if memory > 0:
        cells = max(cells, math.ceil(wanted.memoryMB / memory))
    return max(cells, role.skuNumber or 0)  # skuNumber: HiveD's leafCellNumber, never fewer than needed


def never_fits(spec: JobSpec, view: ClusterView) -> FitProblem | None:
    """Why `spec` can never be placed in its VC even when the VC is empty, or None."""
    if spec.priority < 0 or not view.skuTypes:
        return None
    vc = next((v for v in view.virtualClusters if v.get("name") == spec.virtualCluster), None)
    if vc is None:
        return None  # an unknown VC is refused on its own (NoVirtualClusterError)
    guaranteed = {s["sku"]: int(s.get("guaranteed", 0)) for s in vc.get("skus", [])}
    named = any(role.affinityGroupName for role in spec.taskRoles)
    groups: dict[tuple[str, str | None, str | None], list[TaskRole]] = {}
    for role in spec.taskRoles:
        # With names, a role without one is no gang: each task alone (HiveD's affinityGroup: null).
        name = role.affinityGroupName or ("" if not named else f"{role.name}/")
        groups.setdefault((name, role.skuType or spec.skuType, spec.pin_of(role)), []).append(role)
    for (name, sku_name, pin), roles in groups.items():
        # A named group is placed all at once whatever gangAllocation says (HiveD's affinity group).
        gang = (spec.gangAllocation or named) and not name.endswith("/")
        if pin is not None:
            problem = _pinned_never_fits(spec, roles, pin, vc, view.skuTypes, gang=gang)  # the cell's sku
        else:
            problem = _group_never_fits(spec, roles, sku_name, guaranteed, view.skuTypes, gang=gang)
        if problem is not None:
            return problem
    return None


def _pinned_never_fits(spec: JobSpec, roles: list[TaskRole], pin: str, vc: dict[str, Any],
                       sku_types: dict[str, dict[str, Any]], *, gang: bool) -> FitProblem | None:
    if "pinnedCells" not in vc:
        return None  # a view from a scheduler that does not list pinned cells: it decides
    role = roles[0]
    path = ("extras.hivedScheduler.pinnedCellId" if role.pinnedCellId in (None, spec.pinnedCellId)
            else f"extras.hivedScheduler.taskRoles.{role.name}.pinnedCellId")
    cells = {str(c.get("pinnedCellId")): c for c in vc["pinnedCells"]}
    cell = cells.get(pin)
    if cell is None:
        have = ", ".join(sorted(cells)) or "none"
        return FitProblem(path=path, message=f"pinned cell {pin!r} is not one of virtual cluster "
                                             f"{spec.virtualCluster}'s pinned cells ({have})")
    sku = str(cell.get("sku"))
    wanted = role.skuType or spec.skuType
    if wanted is not None and wanted != sku:
        return FitProblem(path=path, message=f"pinned cell {pin} has sku {sku}, not {wanted} (skuType)")
    sku_type = sku_types.get(sku)
    if sku_type is None:
        return None
    sizes: list[int] = []
    for each in roles:
        size = cells_per_instance(each, sku_type)
        if size is None:
            return FitProblem(path=path, message=f"task role {each.name} asks for {each.resources.gpu} GPUs per "
                                                 f"instance but pinned cell {pin} ({sku}) has none")
        if size > int(cell.get("nodeLeafCells", 0)):
            return FitProblem(path=path, message=f"task role {each.name} needs {size} {sku} cells per instance on "
                                                 f"one node, but the largest node of pinned cell {pin} has "
                                                 f"{cell.get('nodeLeafCells')}")
        sizes.extend([size] * each.instances)
    needed = sum(sizes) if gang else max(sizes)
    if needed > int(cell.get("leafCells", 0)):
        names = ", ".join(each.name for each in roles)
        return FitProblem(path=path, message=f"task role {names} needs {needed} {sku} cells at once (gang), but "
                                             f"pinned cell {pin} has {cell.get('leafCells')} in all")
    return None


def _group_never_fits(spec: JobSpec, roles: list[TaskRole], sku_name: str | None, guaranteed: dict[str, int],
                      sku_types: dict[str, dict[str, Any]], *, gang: bool) -> FitProblem | None:
    path = f"taskRoles.{roles[0].name}"
    names = ", ".join(role.name for role in roles)
    if sku_name is not None and sku_name not in sku_types:
        return FitProblem(path=path, message=f"task role {names} asks for sku {sku_name}, which the cluster does "
                                             f"not have (skus: {', '.join(sorted(sku_types)) or 'none'})")
    candidates = [sku_name] if sku_name is not None else [s for s, n in guaranteed.items() if n > 0]
    if not candidates:
        return FitProblem(path=path, message=f"virtual cluster {spec.virtualCluster} has no cells at all; "
                                             f"task role {names} can never start there")
    reasons = []
    for sku in candidates:
        reason = _sku_never_fits(spec, roles, sku, guaranteed.get(sku, 0), sku_types[sku], gang=gang)
        if reason is None:
            return None
        reasons.append(reason)
    return FitProblem(path=path, message="; ".join(reasons))


def _sku_never_fits(spec: JobSpec, roles: list[TaskRole], sku: str, total: int, sku_type: dict[str, Any], *,
                    gang: bool) -> str | None:
    per_node = int(sku_type.get("maxLeafCellsPerNode", 0))
    sizes: list[int] = []
    for role in roles:
        size = cells_per_instance(role, sku_type)
        if size is None:
            return f"task role {role.name} asks for {role.resources.gpu} GPUs per instance but sku {sku} has none"
        if per_node and size > per_node:
            return (f"task role {role.name} needs {size} {sku} cells per instance on one node, "
                    f"but the largest {sku} node has {per_node}")
        sizes.extend([size] * role.instances)
    needed = sum(sizes) if gang else max(sizes)
    if needed > total:
        names = ", ".join(role.name for role in roles)
        at_once = "at once (gang)" if gang else "for its largest instance"
        return (f"task role {names} needs {needed} {sku} cells {at_once}, but virtual cluster "
                f"{spec.virtualCluster} has {total} {sku} cells in all, even when empty")
    return None
