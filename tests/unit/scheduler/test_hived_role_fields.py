"""HiveD's per-role fields (`extras.hivedScheduler.taskRoles.<role>`) honoured as HiveD
does, from the job file through the protocol into the scheduler core: pinnedCellId,
skuNumber, affinityGroupName, and gangReleaseEnable (true: what PAI does)."""

from __future__ import annotations

import pytest
import yaml

from libs.common.protocol import ProtocolError
from libs.common.protocol.parse import parse_job
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


def test_affinity_groups_are_placed_each_all_or_nothing():
    h = Harness("eight-gpu-node")  # 8 GPUs: group a (4) fits, group b (8) does not beside it
    spec = parsed(job({"ps": {"gpu": 4}, "worker": {"gpu": 8}},
                      {"ps": {"affinityGroupName": "a"}, "worker": {"affinityGroupName": "b"}}, vc="team")).spec
    [place] = only(h.submit_spec(spec), Place)
    assert [t.role for t in place.tasks] == ["ps"] and place.partial


@pytest.mark.parametrize(("where", "value", "ignored"), [
    ("role", True, False),
    ("job", True, False),
    ("role", False, True),  # HiveD's per-task release: kept, said not done
    ("job", False, True),
])
def test_gang_release(where, value, ignored):
    hived_roles = {"worker": {"gangReleaseEnable": value}} if where == "role" else {"worker": {}}
    extra = {"gangReleaseEnable": value} if where == "job" else {}
    parsed_job = parsed(job({"worker": {}}, hived_roles, **extra))
    path = ("extras.hivedScheduler.taskRoles.worker.gangReleaseEnable" if where == "role"
            else "extras.hivedScheduler.gangReleaseEnable")
    assert (path in parsed_job.spec.ignoredFields) is ignored


def test_the_fields_are_no_longer_reported_as_not_acted_on():
    parsed_job = parsed(job({"worker": {}}, {"worker": {"pinnedCellId": "ops-t4", "skuNumber": 2,
                                                         "affinityGroupName": "g"}}))
    assert parsed_job.spec.ignoredFields == []
