"""HiveD's per-role fields (`extras.hivedScheduler.taskRoles.<role>`) honoured as HiveD
does, from the job file through the protocol into the scheduler core: pinnedCellId (roles
pinned to different cells), skuNumber, affinityGroupName, and gangReleaseEnable (false: each
task's cells go back as it ends for good)."""

from __future__ import annotations

import msgspec
import pytest
import yaml

from libs.common.protocol import ProtocolError
from libs.common.protocol.parse import parse_job
from services.scheduler.core import Release, Restore
from services.scheduler.core.demand import affinity_groups

from .builders import Harness, Place, only


def job(roles: dict[str, dict], hived_roles: dict[str, dict], *, vc: str = "ops", **hived: object) -> dict:
    return {
        "protocolVersion": 2, "name": "hived", "type": "job",
        "defaults": {"virtualCluster": vc},
        "taskRoles": {name: {"instances": r.get("instances", 1), "commands": ["true"],
                             "resourcePerInstance": {"gpu": r.get("gpu", 1), "cpu": 1, "memoryMB": 1024}}
                      for name, r in roles.items()},
        "extras": {"hivedScheduler": {**hived, "taskRoles": hived_roles}},
    }


def parsed(doc: dict):
    return parse_job(yaml.safe_dump(doc), user="alice")


def test_a_roles_pinned_cell_places_it_there():
    h = Harness("mixed-skus")
    spec = parsed(job({"worker": {"gpu": 2}}, {"worker": {"pinnedCellId": "ops-t4"}})).spec
    assert spec.role("worker").pinnedCellId == "ops-t4"
    [place] = only(h.submit_spec(spec), Place)
    assert [(t.node, t.gpus) for t in place.tasks] == [("10.0.1.2", [0, 1])]


def test_without_the_pin_the_same_job_may_not_use_the_pinned_cell():
    h = Harness("mixed-skus")
    spec = parsed(job({"worker": {"gpu": 2}}, {"worker": {"skuType": "T4"}})).spec
    assert spec.role("worker").pinnedCellId is None
    assert only(h.submit_spec(spec), Place) == []
    assert "only in its pinned cells (ops-t4)" in (h.core.waiting_reason("alice~hived") or "")


# Roles pinned apart, as HiveD places them: each role's tasks in its own pinned cell of the
# VC, a role without a pin on the VC's other cells (tests/fixtures/clusters/pinned-cells.yaml:
# VC team has pin-a = node p1, pin-b = node p2 and one virtual node, n1 or n2).
@pytest.mark.parametrize(("hived_roles", "job_pin", "nodes"), [
    ({"ps": {"pinnedCellId": "pin-a"}, "worker": {"pinnedCellId": "pin-b"}}, None,
     {"ps": {"p1"}, "worker": {"p2"}}),
    ({"ps": {"pinnedCellId": "pin-a"}}, None, {"ps": {"p1"}, "worker": {"n1"}}),  # worker: the VC's virtual node
    ({"worker": {"pinnedCellId": "pin-b"}}, "pin-a", {"ps": {"p1"}, "worker": {"p2"}}),  # the job's pin: a default
    ({}, "pin-b", {"ps": {"p2"}, "worker": {"p2"}}),
], ids=["two-pins", "one-pinned-one-not", "role-over-job", "job-pin"])
def test_roles_pinned_to_different_cells_run_each_in_its_own(hived_roles, job_pin, nodes):
    h = Harness("pinned-cells")
    extra = {"pinnedCellId": job_pin} if job_pin else {}
    spec = parsed(job({"ps": {"gpu": 1}, "worker": {"gpu": 1, "instances": 2}}, hived_roles, vc="team",
                      **extra)).spec
    [place] = only(h.submit_spec(spec), Place)
    assert {role: {t.node for t in place.tasks if t.role == role} for role in nodes} == nodes
    assert not place.partial


def test_a_pinned_role_waits_for_its_cell_while_the_other_runs():
    h = Harness("pinned-cells")
    h.submit("holder", vc="team", gpus=4, pinned="pin-b")  # pin-b is full
    spec = parsed(job({"ps": {"gpu": 1}, "worker": {"gpu": 2}},
                      {"ps": {"pinnedCellId": "pin-a", "affinityGroupName": "ps"},
                       "worker": {"pinnedCellId": "pin-b", "affinityGroupName": "w"}}, vc="team")).spec
    [place] = only(h.submit_spec(spec), Place)
    assert [(t.role, t.node) for t in place.tasks] == [("ps", "p1")] and place.partial
    reason = h.core.waiting_reason("alice~hived") or ""
    assert "0 free of 4 guaranteed" in reason  # pin-b's own cells counted, not the VC's
    [place] = only(h.release("holder"), Place)
    assert [(t.role, t.node) for t in place.tasks] == [("worker", "p2")]


@pytest.mark.parametrize(("hived_roles", "never"), [
    ({"worker": {"pinnedCellId": "nowhere"}}, "pinned cell nowhere is not pinned to VC team"),
    ({"ps": {"pinnedCellId": "pin-a"}, "worker": {"pinnedCellId": "ops-t4"}},
     "pinned cell ops-t4 is not pinned to VC team"),
    ({"worker": {"pinnedCellId": "pin-a"}}, "needs 6 GPU cells at once but pinned cell pin-a has only 4"),
])
def test_a_pin_that_can_never_hold_its_role_is_said_so(hived_roles, never):
    h = Harness("pinned-cells")
    spec = parsed(job({"ps": {"gpu": 1}, "worker": {"gpu": 3, "instances": 2}}, hived_roles, vc="team")).spec
    assert only(h.submit_spec(spec), Place) == []
    assert never in (h.core.waiting_reason("alice~hived") or "")


def test_a_job_with_roles_pinned_apart_is_restored_in_its_cells():
    h = Harness("pinned-cells")
    spec = parsed(job({"ps": {"gpu": 1}, "worker": {"gpu": 2}},
                      {"ps": {"pinnedCellId": "pin-a"}, "worker": {"pinnedCellId": "pin-b"}}, vc="team")).spec
    h.submit_spec(spec)
    tasks = h.placed["alice~hived"]
    fresh = Harness("pinned-cells")
    fresh.restore("alice~hived", spec, tasks)
    assert fresh.core.restore_warnings == []
    assert fresh.core.vc_status()[0].skus[0].used == 3  # guaranteed again, in its pinned cells


@pytest.mark.parametrize(("hived_roles", "path", "rule"), [
    ({"worker": {"skuType": "GPU", "pinnedCellId": "pin-a"}},
     "extras.hivedScheduler.taskRoles.worker.pinnedCellId", "sku_and_pin"),
    ({"ps": {"affinityGroupName": "g", "pinnedCellId": "pin-a"}, "worker": {"affinityGroupName": "g"}},
     "extras.hivedScheduler.taskRoles.worker.pinnedCellId", "affinity_group_mismatch"),
    ({"ps": {"affinityGroupName": "g", "pinnedCellId": "pin-a"},
      "worker": {"affinityGroupName": "g", "pinnedCellId": "pin-b"}},
     "extras.hivedScheduler.taskRoles.worker.pinnedCellId", "affinity_group_mismatch"),
    ({"ps": {"affinityGroupName": "g", "skuType": "V100"}, "worker": {"affinityGroupName": "g", "skuType": "T4"}},
     "extras.hivedScheduler.taskRoles.worker.skuType", "affinity_group_mismatch"),
], ids=["sku-and-pin", "group-pinned-and-not", "group-two-pins", "group-two-skus"])
def test_what_openpai_refuses_is_refused_naming_the_field(hived_roles, path, rule):
    with pytest.raises(ProtocolError) as refused:
        parsed(job({"ps": {}, "worker": {}}, hived_roles))
    assert [(e.path, e.rule) for e in refused.value.errors] == [(path, rule)]


@pytest.mark.parametrize(("gpu", "sku_number", "cells"), [
    (1, None, 1),  # what the resources need
    (1, 2, 2),  # more, as asked: HiveD's leafCellNumber
    (1, 4, 4),
    (2, 1, 2),  # never fewer than the resources need
])
def test_sku_number_is_the_leaf_cells_of_each_task(gpu, sku_number, cells):
    h = Harness("eight-gpu-node")
    settings = {"skuNumber": sku_number} if sku_number else {}
    spec = parsed(job({"worker": {"gpu": gpu, "instances": 2}}, {"worker": settings}, vc="team")).spec
    assert spec.role("worker").skuNumber == sku_number
    [place] = only(h.submit_spec(spec), Place)
    assert [len(t.leafCells) for t in place.tasks] == [cells, cells]
    assert [len(t.gpus) for t in place.tasks] == [cells, cells]  # the task's cells' GPUs, as HiveD binds


@pytest.mark.parametrize("sku_number", [0, -1, "two", 1025])
def test_a_bad_sku_number_is_refused_naming_the_field(sku_number):
    with pytest.raises(ProtocolError) as refused:
        parsed(job({"worker": {}}, {"worker": {"skuNumber": sku_number}}))
    assert refused.value.errors[0].path == "extras.hivedScheduler.taskRoles.worker.skuNumber"


@pytest.mark.parametrize(("groups", "expected"), [
    ({}, [("default", ["ps", "worker", "worker"])]),  # one gang: the whole job
    ({"ps": "a", "worker": "b"}, [("a", ["ps"]), ("b", ["worker", "worker"])]),
    ({"ps": "a", "worker": "a"}, [("a", ["ps", "worker", "worker"])]),
    # Once a role names a group, a role without one has none (OpenPAI's affinityGroup: null):
    # HiveD places each of its tasks on its own.
    ({"worker": "w"}, [("ps/0", ["ps"]), ("w", ["worker", "worker"])]),
    ({"ps": "a"}, [("a", ["ps"]), ("worker/0", ["worker"]), ("worker/1", ["worker"])]),
])
def test_affinity_group_names_make_the_gangs(groups, expected):
    hived_roles = {role: {"affinityGroupName": name} for role, name in groups.items()}
    spec = parsed(job({"ps": {}, "worker": {"instances": 2}}, hived_roles)).spec
    assert [(g.name, [t.role for t in g.tasks]) for g in affinity_groups(spec)] == expected


@pytest.mark.parametrize(("group", "placed"), [
    (None, 2),  # gangAllocation: false, no group named: task by task, two of the three fit
    ("g", 0),  # a named group is HiveD's affinity group: all at once or not at all, whatever gangAllocation says
])
def test_a_named_group_is_a_gang_even_without_gang_allocation(group, placed):
    h = Harness("eight-gpu-node")  # VC team: 8 GPUs; three tasks of 4 cannot all fit
    settings = {"affinityGroupName": group} if group else {}
    doc = job({"worker": {"gpu": 4, "instances": 3}}, {"worker": settings}, vc="team")
    doc["extras"]["gangAllocation"] = False
    places = only(h.submit_spec(parsed(doc).spec), Place)
    assert sum(len(p.tasks) for p in places) == placed


def test_affinity_groups_are_placed_each_all_or_nothing():
    h = Harness("eight-gpu-node")  # 8 GPUs: group a (4) fits, group b (8) does not beside it
    spec = parsed(job({"ps": {"gpu": 4}, "worker": {"gpu": 8}},
                      {"ps": {"affinityGroupName": "a"}, "worker": {"affinityGroupName": "b"}}, vc="team")).spec
    [place] = only(h.submit_spec(spec), Place)
    assert [t.role for t in place.tasks] == ["ps"] and place.partial


@pytest.mark.parametrize(("hived_roles", "job_level", "expected"), [
    ({}, None, {"ps": True, "worker": True}),  # PAI's default: released with the attempt
    ({"worker": {"gangReleaseEnable": False}}, None, {"ps": True, "worker": False}),
    ({}, False, {"ps": False, "worker": False}),  # OpenPAI's job-level field: every role's default
    ({"ps": {"gangReleaseEnable": True}}, False, {"ps": True, "worker": False}),
])
def test_gang_release_is_read_per_role_and_never_reported_as_ignored(hived_roles, job_level, expected):
    extra = {"gangReleaseEnable": job_level} if job_level is not None else {}
    parsed_job = parsed(job({"ps": {}, "worker": {}}, hived_roles, **extra))
    assert {r.name: r.gangReleaseEnable for r in parsed_job.spec.taskRoles} == expected
    assert parsed_job.spec.ignoredFields == [] and parsed_job.warnings == []


# VC team of eight-gpu-node has 8 GPUs: two 4-GPU tasks fill it, and a second job of one 4-GPU task waits.
# Tasks of the first end for good, one release each (the launcher's job.released naming the task):
@pytest.mark.parametrize(("gang_release", "released", "second_placed"), [
    (True, [], False),  # the default: nothing frees until the attempt's own release
    (False, [("worker", 0)], True),  # HiveD's per-pod release: its cells go to the waiting job now
    (False, [("worker", 0), ("worker", 0)], True),  # a redelivered release changes nothing more
    (False, [("worker", 0), ("worker", 1)], True),  # the attempt's last cells stay until its own release
], ids=["gang-release", "per-task", "redelivered", "last-task-kept"])
def test_a_task_released_alone_frees_its_cells_while_the_attempt_goes_on(gang_release, released, second_placed):
    h = Harness("eight-gpu-node")
    first = parsed(job({"worker": {"gpu": 4, "instances": 2}}, {"worker": {"gangReleaseEnable": gang_release}},
                       vc="team")).spec
    assert only(h.submit_spec(first), Place)
    second = msgspec.structs.replace(parsed(job({"worker": {"gpu": 4}}, {}, vc="team")).spec, name="second")
    assert only(h.submit_spec(second), Place) == []
    decisions = []
    for task in released:
        decisions += h.handle(Release(job="alice~hived", attempt=0, tasks=[task]))
    assert bool(only(decisions, Place)) is second_placed
    entry = h.core.entry("alice~hived")
    assert entry is not None and entry.placed
    kept = [(t.role, t.index) for t in entry.tasks]
    assert kept == ([("worker", 1)] if gang_release is False else [("worker", 0), ("worker", 1)])
    assert entry.releasedTasks == ([("worker", 0)] if gang_release is False else [])
    h.release("hived")  # the attempt's own release frees the rest
    assert h.core.entry("alice~hived") is None


def test_a_task_released_alone_is_never_placed_again_nor_held_after_a_restart():
    h = Harness("eight-gpu-node")
    spec = parsed(job({"worker": {"gpu": 2, "instances": 3}}, {"worker": {"gangReleaseEnable": False}}, vc="team",
                      )).spec
    spec = msgspec.structs.replace(spec, gangAllocation=False)
    h.submit_spec(spec)
    h.handle(Release(job="alice~hived", attempt=0, tasks=[("worker", 2)]))
    entry = h.core.entry("alice~hived")
    assert entry is not None and entry.releasedTasks == [("worker", 2)]
    fresh = Harness("eight-gpu-node")
    decisions = fresh.handle(Restore(job=entry.job, attempt=entry.attempt, spec=entry.spec, tasks=entry.tasks,
                                     released=list(entry.releasedTasks)))
    assert only(decisions, Place) == [] and not fresh.core.waiting_reason("alice~hived")
    assert fresh.core.vc_status()[0].skus[0].used == 4  # two tasks of 2 GPUs held, the released one not


def test_the_fields_are_no_longer_reported_as_not_acted_on():
    parsed_job = parsed(job({"worker": {}}, {"worker": {"pinnedCellId": "ops-t4", "skuNumber": 2,
                                                         "affinityGroupName": "g"}}))
    assert parsed_job.spec.ignoredFields == []
