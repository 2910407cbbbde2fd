"""Priority classes granted per group (issue 31): what a user may use, and the refusal."""

from __future__ import annotations

import pytest

from libs.common.errors import BadInput, Forbidden
from services.rest.identity import core
from services.rest.records import Group, GroupAcls, GroupExtension, User


def group(name: str, *classes: str, admin: bool = False) -> Group:
    return Group(groupname=name, extension=GroupExtension(acls=GroupAcls(admin=admin, priorityClasses=list(classes))))


GROUPS = {g.groupname: g for g in (group("vision", "prod"), group("ops", "crit", "prod"), group("root", admin=True))}


@pytest.mark.parametrize(("grouplist", "classes"), [
    (["default"], ("test", "oppo")),
    ([], ("test", "oppo")),
    (["default", "vision"], ("prod", "test", "oppo")),
    (["ops"], ("crit", "prod", "test", "oppo")),
    (["root"], ("crit", "prod", "test", "oppo")),
    (["admin"], ("crit", "prod", "test", "oppo")),
    (["gone"], ("test", "oppo")),
], ids=["default-group", "no-group", "vision-grants-prod", "ops-grants-crit-and-prod", "admin-flag-group",
        "built-in-admin", "deleted-group"])
def test_groups_grant_priority_classes_beyond_the_open_ones(grouplist, classes):
    principal = core.resolve(User(username="u", grouplist=grouplist), GROUPS)
    assert principal.priorityClasses == classes
    assert all(core.may_use_priority_class(principal, c) == (c in classes) for c in ("crit", "prod", "test", "oppo"))


def test_the_refusal_names_the_class_the_granting_groups_and_what_to_do():
    principal = core.resolve(User(username="bob", grouplist=["default"]), GROUPS)
    refusal = core.priority_class_refused(principal, "prod", list(GROUPS.values()))
    assert isinstance(refusal, Forbidden)
    assert "'prod'" in refusal.message
    assert "groups that grant it: ops, vision" in refusal.message and "test, oppo" in refusal.message
    assert refusal.details["errors"][0]["grantedBy"] == ["ops", "vision"]
    nobody = core.priority_class_refused(principal, "crit", [group("vision", "prod")])
    assert "no group grants it yet" in nobody.message and "--priority-classes crit" in nobody.message


@pytest.mark.parametrize(("classes", "path"), [
    (["urgent"], "extension.acls.priorityClasses[0]"),
    (["prod", "PROD"], "extension.acls.priorityClasses[1]"),
], ids=["unknown", "case-matters"])
def test_a_group_may_grant_only_known_classes(classes, path):
    with pytest.raises(BadInput) as refused:
        core.check_group_acls(GroupAcls(priorityClasses=classes))
    assert refused.value.details["errors"][0]["path"] == path


def test_known_classes_are_accepted():
    core.check_group_acls(GroupAcls(priorityClasses=["crit", "prod", "test", "oppo"]))
