"""The identity core: who may do what, what groups grant, passwords, names, token lifetimes."""

from __future__ import annotations

import pytest

from libs.common.errors import BadInput, Forbidden, ForbiddenKey
from services.rest.identity import core
from services.rest.identity.core import Action
from services.rest.records import Group, GroupAcls, GroupExtension, TokenKind, TokenRecord, User


def group(name: str, *vcs: str, admin: bool = False) -> Group:
    return Group(groupname=name, extension=GroupExtension(acls=GroupAcls(admin=admin, virtualClusters=list(vcs))))


GROUPS = {g.groupname: g for g in (*core.BUILTIN_GROUPS.values(), group("vision", "vc1", "vc2"), group("nlp", "vc3"))}


def principal(name: str = "alice", *groups: str, legacy_admin: bool = False) -> core.Principal:
    return core.resolve(User(username=name, grouplist=list(groups or ["default"]), admin=legacy_admin), GROUPS)


@pytest.mark.parametrize(("grouplist", "admin", "vcs"), [
    (["default"], False, ("default",)),
    (["default", "vision"], False, ("default", "vc1", "vc2")),
    (["vision", "nlp"], False, ("vc1", "vc2", "vc3")),
    (["default", "admin"], True, ("default",)),
    (["gone"], False, ()),
    ([], False, ()),
], ids=["default-group", "plus-vision", "two-groups-no-default", "admin-group", "deleted-group", "no-group"])
def test_groups_grant_admin_and_virtual_clusters(grouplist, admin, vcs):
    p = core.resolve(User(username="u", grouplist=grouplist), GROUPS)
    assert (p.admin, p.virtualClusters) == (admin, vcs)


def test_built_in_groups_grant_before_they_are_stored_and_as_changed_after():
    user = User(username="u", grouplist=["default"])
    assert core.resolve(user, {}).virtualClusters == ("default",)
    assert core.resolve(user, {"default": group("default", "vc9")}).virtualClusters == ("vc9",)


def test_a_record_from_before_groups_keeps_its_admin_flag():
    assert principal("old", "default", legacy_admin=True).admin


@pytest.mark.parametrize(("grouplist", "vc", "allowed"), [
    (["default"], "default", True),
    (["default"], "vc1", False),
    (["vision"], "vc1", True),
    (["vision"], "default", False),
    (["admin"], "any-vc", True),
], ids=["default-to-default", "default-to-vc1", "vision-to-vc1", "vision-to-default", "admin-anywhere"])
def test_who_may_submit_to_a_vc(grouplist, vc, allowed):
    assert core.may_submit_to(principal("u", *grouplist), vc) is allowed


OWNER, OTHER, ADMIN = principal("alice"), principal("bob"), principal("root", "default", "admin")


@pytest.mark.parametrize("action", list(Action), ids=[a.name for a in Action])
@pytest.mark.parametrize(("caller", "caller_id"), [(OWNER, "owner"), (OTHER, "other"), (ADMIN, "admin")],
                         ids=["owner", "other", "admin"])
def test_authorization_table(action, caller, caller_id):
    everyone = {Action.LIST_JOBS, Action.READ_JOB, Action.READ_GROUPS}
    owner_only = {Action.READ_JOB_OUTPUT, Action.CHANGE_JOB, Action.WATCH_EVENTS, Action.READ_USER,
                  Action.CHANGE_OWN_PROFILE, Action.MANAGE_OWN_TOKENS}
    expected = caller_id == "admin" or action in everyone or (action in owner_only and caller_id == "owner")
    assert core.may(caller, action, "alice") is expected


def test_a_refusal_names_who_may_and_who_asked():
    with pytest.raises(Forbidden, match=r"only alice or an admin may stop or tag alice~job; bob is not allowed"):
        core.require(OTHER, Action.CHANGE_JOB, "alice", what="alice~job")
    with pytest.raises(Forbidden, match="only an admin may create, change or delete users"):
        core.require(OTHER, Action.MANAGE_USERS)


@pytest.mark.parametrize(("password", "problem"), [
    ("short", "at least 8 characters"),
    ("x" * 257, "at most 256 characters"),
    ("Alice", "at least 8"),
    ("aaaaaaaaab", "3 different characters"),
    ("alice123", None),
    ("correct horse battery", None),
], ids=["short", "long", "short-username", "two-characters", "ok", "passphrase"])
def test_password_policy(password, problem):
    found = core.password_problem(password, "alice")
    assert (found is None) if problem is None else (problem in found)


def test_a_password_equal_to_the_username_is_refused():
    assert core.password_problem("Alice-2024", "alice-2024") == "a password must not be the username"


@pytest.mark.parametrize(("name", "rule"), [
    ("u" * 33, "maxLength"), ("has.dot", "pattern"), ("", "pattern"), ("me", "reserved"), ("a b", "pattern"),
])
def test_bad_usernames_name_the_rule(name, rule):
    with pytest.raises(BadInput) as caught:
        core.check_username(name)
    assert caught.value.details["errors"][0] == {"path": "username", "rule": rule,
                                                 "message": caught.value.details["errors"][0]["message"]}


@pytest.mark.parametrize(("email", "ok"), [("a@b.c", True), ("", True), ("no-at", False), ("a @b", False),
                                            ("a@" + "b" * 260, False)])
def test_emails(email, ok):
    if ok:
        core.check_email(email)
    else:
        with pytest.raises(BadInput):
            core.check_email(email)


POLICY = core.TokenPolicy(login_seconds=100.0, application_seconds=1000.0, max_seconds=5000.0)


@pytest.mark.parametrize(("kind", "requested", "expires"), [
    (TokenKind.LOGIN, None, 1100.0),
    (TokenKind.APPLICATION, None, 2000.0),
    (TokenKind.APPLICATION, 30, 1030.0),
    (TokenKind.LOGIN, 5000, 6000.0),
    (TokenKind.PLATFORM, None, None),
], ids=["login-default", "application-default", "asked", "at-the-cap", "platform-never"])
def test_token_expiry(kind, requested, expires):
    assert core.token_expiry(kind, 1000.0, POLICY, requested) == expires


@pytest.mark.parametrize(("requested", "rule"), [(0, "minimum"), (-5, "minimum"), (5001, "maximum")])
def test_token_expiry_out_of_bounds_names_the_limit(requested, rule):
    with pytest.raises(BadInput) as caught:
        core.token_expiry(TokenKind.APPLICATION, 0.0, POLICY, requested)
    assert caught.value.details["errors"][0]["path"] == "expiration"
    assert caught.value.details["errors"][0]["rule"] == rule


@pytest.mark.parametrize(("expires", "now", "live"), [(None, 1e12, True), (10.0, 9.99, True), (10.0, 10.0, False)])
def test_token_liveness(expires, now, live):
    assert core.is_live(TokenRecord(user="u", kind=TokenKind.LOGIN, createdAt=0.0, expiresAt=expires), now) is live


def test_an_admin_cannot_lock_themselves_out():
    with pytest.raises(ForbiddenKey, match="cannot delete themselves"):
        core.check_user_change(ADMIN, "root", new_admin=None, deleting=True)
    with pytest.raises(ForbiddenKey, match="own admin rights"):
        core.check_user_change(ADMIN, "root", new_admin=False)
    core.check_user_change(ADMIN, "alice", new_admin=False, deleting=True)  # another user: fine
    core.check_user_change(ADMIN, "root", new_admin=True)


def test_built_in_groups_stay():
    with pytest.raises(ForbiddenKey):
        core.check_group_change("default", deleting=True)
    with pytest.raises(ForbiddenKey):
        core.check_group_change("admin", acls=GroupAcls(admin=False))
    core.check_group_change("admin", acls=GroupAcls(admin=True, virtualClusters=["vc1"]))
    core.check_group_change("vision", deleting=True)


@pytest.mark.parametrize(("grouplist", "admin", "expected"), [
    (["default"], True, ["default", "admin"]),
    (["admin", "default"], True, ["default", "admin"]),
    (["default", "admin"], False, ["default"]),
    ([], False, []),
])
def test_admin_flag_is_admin_group_membership(grouplist, admin, expected):
    assert core.grouplist_with_admin(grouplist, admin) == expected


def test_the_core_imports_no_io():
    import subprocess
    import sys

    code = ("import sys, services.rest.identity.core; "
            "bad = [m for m in ('asyncio', 'nats', 'aiohttp') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_login_throttle_refuses_a_name_after_too_many_failures_until_the_window_passes():
    throttle = core.LoginThrottle(max_failures=3, window=60.0)
    for t in (0.0, 10.0, 20.0):
        assert throttle.retry_after("alice", t) == 0.0
        throttle.failed("alice", t)
    assert throttle.retry_after("alice", 21.0) == 39.0  # the first failure leaves the window at 60
    assert throttle.retry_after("bob", 21.0) == 0.0  # per name
    assert throttle.retry_after("alice", 60.0) == 0.0  # one failure fewer in the window


def test_login_throttle_forgets_after_a_success():
    throttle = core.LoginThrottle(max_failures=2, window=60.0)
    throttle.failed("alice", 0.0)
    throttle.succeeded("alice")
    throttle.failed("alice", 1.0)
    assert throttle.retry_after("alice", 2.0) == 0.0


def test_login_throttle_memory_is_bounded():
    throttle = core.LoginThrottle(max_failures=2, window=60.0, max_names=100)
    for i in range(1000):
        throttle.failed(f"name{i}", float(i) / 100)
    assert len(throttle._failures) <= 100
