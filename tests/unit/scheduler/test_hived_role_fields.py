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
    assert spec.pinnedCellId == "ops-t4"
    [place] = only(h.submit_spec(spec), Place)
    assert [(t.node, t.gpus) for t in place.tasks] == [("10.0.1.2", [0, 1])]


def test_without_the_pin_the_same_job_may_not_use_the_pinned_cell():
    h = Harness("mixed-skus")
    spec = parsed(job({"worker": {"gpu": 2}}, {"worker": {"skuType": "T4"}})).spec
    assert spec.pinnedCellId is None
    assert only(h.submit_spec(spec), Place) == []
    assert "only in its pinned cells (ops-t4)" in (h.core.waiting_reason("alice~hived") or "")


@pytest.mark.parametrize(("hived_roles", "job_pin", "refused_role"), [
    ({"ps": {"pinnedCellId": "ops-t4"}}, None, "worker"),  # one role pinned, the other not
    ({"ps": {"pinnedCellId": "ops-t4"}, "worker": {"pinnedCellId": "other"}}, None, "worker"),
    ({"worker": {"pinnedCellId": "other"}}, "ops-t4", "worker"),  # the role's against the job's
])
def test_roles_pinned_apart_are_refused_naming_the_role(hived_roles, job_pin, refused_role):
    extra = {"pinnedCellId": job_pin} if job_pin else {}
    with pytest.raises(ProtocolError) as refused:
        parsed(job({"ps": {}, "worker": {}}, hived_roles, **extra))
    assert [(e.path, e.rule) for e in refused.value.errors] == [
        (f"extras.hivedScheduler.taskRoles.{refused_role}.pinnedCellId", "pinned_cell_mismatch")]


def test_every_role_pinned_alike_is_one_pinned_job():
    spec = parsed(job({"ps": {}, "worker": {}}, {"ps": {"pinnedCellId": "ops-t4"},
                                                  "worker": {"pinnedCellId": "ops-t4"}})).spec
    assert spec.pinnedCellId == "ops-t4"


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
    ({"worker": "w"}, [("default", ["ps"]), ("w", ["worker", "worker"])]),
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
                                                         "affinityGroupName": "g", "skuType": "T4"}}))
    assert parsed_job.spec.ignoredFields == []
