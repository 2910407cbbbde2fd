"""Job priority classes granted per group (issue 31): `prod` and `crit` preempt other jobs
of a VC, so only members of a group that grants them (and admins) may submit with them;
everyone may use `test` (the default) and `oppo`. Through rest's HTTP API, against a
real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.schedule import CLUSTER_VCS_KEY, ClusterView
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest.app import create_app, startup
from tests.component.test_identity import RUN, Api, unique
from tests.fixtures.settings import IN_PROCESS_ENV

ADMIN = f"prioadmin{RUN}"


@pytest.fixture(scope="module")
async def setup(nats_server, tmp_path_factory) -> AsyncIterator[tuple[Api, str]]:
    platform = await Bus.connect(nats_server.url, name="priority-platform", **nats_server.login("platform"))
    await platform.bootstrap()
    view = ClusterView(virtualClusters=[{"name": "default"}])
    await (await platform.kv(Bucket.CLUSTER)).put(CLUSTER_VCS_KEY, msgspec.json.encode(view))
    bus = await Bus.connect(nats_server.url, name="priority-rest", **nats_server.login("rest"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("priority")), admin_user=ADMIN)
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    await startup(ctx)
    admin_token = config.token_path.read_text().strip()
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    async with ClientSession() as session:
        yield Api(server, session), admin_token
    await server.close()
    await bus.close()
    await platform.close()


def job_yaml(name: str, priority_class: str | None) -> str:
    extras = f"extras:\n  hivedScheduler:\n    jobPriorityClass: {priority_class}\n" if priority_class else ""
    return (f"protocolVersion: 2\nname: {name}\ntype: job\n"
            "taskRoles:\n  main:\n    instances: 1\n    commands:\n      - echo hi\n" + extras)


async def submit(api: Api, token: str, priority_class: str | None) -> tuple[int, dict]:
    return await api.call(token, "POST", "/api/v2/jobs", job_yaml(unique("j"), priority_class), "text/yaml")


@pytest.mark.parametrize("priority_class", [None, "test", "oppo"], ids=["default-class", "test", "oppo"])
async def test_everyone_may_use_the_open_classes(setup, priority_class):
    api, admin = setup
    token = await api.login(await api.new_user(admin))
    status, body = await submit(api, token, priority_class)
    assert status == 202, body


@pytest.mark.parametrize("priority_class", ["prod", "crit"])
async def test_a_class_no_group_of_the_user_grants_is_refused_naming_what_to_do(setup, priority_class):
    api, admin = setup
    granting = unique("team")
    status, _ = await api.call(admin, "POST", "/api/v2/groups", {
        "groupname": granting, "extension": {"acls": {"virtualClusters": ["default"],
                                                      "priorityClasses": [priority_class]}}})
    assert status == 201
    name = await api.new_user(admin)
    token = await api.login(name)

    status, body = await submit(api, token, priority_class)

    assert (status, body["code"]) == (403, "ForbiddenUserError"), body
    assert repr(priority_class) in body["message"] and granting in body["message"]
    assert "ask an admin" in body["message"]
    error = body["details"]["errors"][0]
    assert error["path"] == "extras.hivedScheduler.jobPriorityClass"
    assert error["rule"] == "priority_class_not_granted" and granting in error["grantedBy"]
    status, jobs = await api.call(token, "GET", "/api/v2/jobs")
    assert status == 200 and not [job for job in jobs if job["username"] == name]  # nothing was stored


async def test_a_group_grants_prod_to_its_members_only(setup):
    api, admin = setup
    group = unique("vision")
    status, created = await api.call(admin, "POST", "/api/v2/groups", {
        "groupname": group, "extension": {"acls": {"virtualClusters": ["default"], "priorityClasses": ["prod"]}}})
    assert status == 201 and created["extension"]["acls"]["priorityClasses"] == ["prod"]
    member = await api.new_user(admin, grouplist=["default", group])
    outsider = await api.new_user(admin)
    member_token, outsider_token = await api.login(member), await api.login(outsider)

    assert (await submit(api, member_token, "prod"))[0] == 202
    assert (await submit(api, outsider_token, "prod"))[0] == 403
    status, body = await submit(api, member_token, "crit")  # prod is granted, not crit
    assert status == 403 and "'crit'" in body["message"] and group not in body["details"]["errors"][0]["grantedBy"]
    status, me = await api.call(member_token, "GET", "/api/v2/users/me")
    assert me["priorityClasses"] == ["prod", "test", "oppo"]

    # Taken back with PUT: the member's next prod job is refused.
    status, changed = await api.call(admin, "PUT", f"/api/v2/groups/{group}",
                                     {"extension": {"acls": {"virtualClusters": ["default"]}}})
    assert status == 200 and changed["extension"]["acls"]["priorityClasses"] == []
    for _ in range(50):  # rest forgets what it remembered of the group once its watch sees the change
        status, _ = await submit(api, member_token, "prod")
        if status == 403:
            break
    assert status == 403


@pytest.mark.parametrize("priority_class", ["crit", "prod"])
async def test_admins_may_use_any_class(setup, priority_class):
    api, admin = setup
    status, body = await submit(api, admin, priority_class)
    assert status == 202, body


@pytest.mark.parametrize("method", ["POST", "PUT"])
async def test_a_group_granting_an_unknown_class_is_400_naming_the_field(setup, method):
    api, admin = setup
    group = unique("bad")
    if method == "PUT":
        assert (await api.call(admin, "POST", "/api/v2/groups", {"groupname": group}))[0] == 201
        call = ("PUT", f"/api/v2/groups/{group}", {"extension": {"acls": {"priorityClasses": ["test", "urgent"]}}})
    else:
        call = ("POST", "/api/v2/groups", {"groupname": group,
                                           "extension": {"acls": {"priorityClasses": ["test", "urgent"]}}})
    status, body = await api.call(admin, *call)
    assert (status, body["code"]) == (400, "InvalidParametersError"), body
    assert body["details"]["errors"][0]["path"] == "extension.acls.priorityClasses[1]"
    assert "urgent" in body["message"]
