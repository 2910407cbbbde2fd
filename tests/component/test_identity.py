"""Users, groups, sign-in and tokens over rest's HTTP API, rest logged in to a real
nats-server as `rest` (its production permissions on the pai_users bucket)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus, all_keys
from libs.common.config import load_config
from libs.common.schedule import CLUSTER_VCS_KEY, ClusterView
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest.app import create_app, startup
from tests.fixtures.settings import IN_PROCESS_ENV, TEST_ENV

RUN = uuid.uuid4().hex[:6]
ADMIN = f"idadmin{RUN}"
PASSWORD = "correct horse battery"


def unique(prefix: str) -> str:
    return f"{prefix}{RUN}{uuid.uuid4().hex[:4]}"


class Api:
    def __init__(self, server: TestServer, session: ClientSession):
        self.server, self.session = server, session

    async def call(self, token: str | None, method: str, path: str, body: Any = None,
                   content_type: str = "application/json") -> tuple[int, Any]:
        headers = {"Content-Type": content_type}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        async with self.session.request(method, self.server.make_url(path), data=data, headers=headers) as resp:
            raw = await resp.read()
            try:
                return resp.status, json.loads(raw)
            except ValueError:
                return resp.status, raw.decode(errors="replace")

    async def login(self, username: str, password: str = PASSWORD, **extra: Any) -> str:
        status, body = await self.call(None, "POST", "/api/v2/authn/basic/login",
                                       {"username": username, "password": password, **extra})
        assert status == 200, body
        return body["token"]

    async def new_user(self, admin_token: str, **fields: Any) -> str:
        name = fields.pop("username", None) or unique("user")
        status, body = await self.call(admin_token, "POST", "/api/v2/users",
                                       {"username": name, "password": PASSWORD, **fields})
        assert status == 201, body
        return name


@pytest.fixture(scope="module")
async def platform(nats_server) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats_server.url, name="identity-platform", **nats_server.login("platform"))
    await bus.bootstrap()
    yield bus
    await bus.close()


@pytest.fixture(scope="module")
async def setup(nats_server, platform, tmp_path_factory) -> AsyncIterator[tuple[Api, str]]:
    bus = await Bus.connect(nats_server.url, name="identity-rest", **nats_server.login("rest"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("identity")), admin_user=ADMIN)
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    await startup(ctx)  # the built-in groups and the admin, as at rest's first start
    admin_token = config.token_path.read_text().strip()
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    async with ClientSession() as session:
        yield Api(server, session), admin_token
    await server.close()
    await bus.close()


def job_yaml(name: str, vc: str = "default") -> str:
    return (f"protocolVersion: 2\nname: {name}\ntype: job\ndefaults:\n  virtualCluster: {vc}\n"
            "taskRoles:\n  main:\n    instances: 1\n    commands:\n      - echo hi\n")


# --- sign in and out --------------------------------------------------------------------------


async def test_login_gives_a_token_that_works_until_logout(setup):
    api, admin = setup
    name = await api.new_user(admin, email="a@example.com")
    status, body = await api.call(None, "POST", "/api/v2/authn/basic/login", {"username": name, "password": PASSWORD})
    assert status == 200 and body["user"] == name and body["admin"] is False
    token = body["token"]
    assert body["expiresTime"] > time.time() * 1000 + 6 * 86400 * 1000  # the 7-day default
    status, me = await api.call(token, "GET", "/api/v2/users/me")
    assert (status, me["username"], me["email"], me["virtualCluster"]) == (200, name, "a@example.com", ["default"])
    assert "passwordHash" not in me and PASSWORD not in json.dumps(me)

    status, _ = await api.call(token, "DELETE", "/api/v2/authn/basic/logout")
    assert status == 200
    status, body = await api.call(token, "GET", "/api/v2/users/me")
    assert (status, body["code"]) == (401, "UnauthorizedUserError")


@pytest.mark.parametrize("who", ["wrong-password", "no-such-user"])
async def test_a_wrong_password_or_name_is_one_401(setup, who):
    api, admin = setup
    name = await api.new_user(admin)
    username, password = (name, "not the password") if who == "wrong-password" else (unique("nobody"), PASSWORD)
    status, body = await api.call(None, "POST", "/api/v2/authn/basic/login", {"username": username, "password": password})
    assert (status, body["code"], body["message"]) == (401, "IncorrectPasswordError", "wrong username or password")


async def test_repeated_failed_sign_ins_are_refused_for_a_while(setup, monkeypatch):
    from services.rest.identity import routes

    api, admin = setup
    monkeypatch.setattr(routes, "LOGIN_THROTTLE", routes.core.LoginThrottle(max_failures=3, window=300.0))
    name = await api.new_user(admin)
    for _ in range(3):
        status, body = await api.call(None, "POST", "/api/v2/authn/basic/login", {"username": name, "password": "guess1234"})
        assert (status, body["code"]) == (401, "IncorrectPasswordError")
    status, body = await api.call(None, "POST", "/api/v2/authn/basic/login", {"username": name, "password": PASSWORD})
    assert (status, body["code"]) == (429, "TooManyRequestsError") and "try again in" in body["message"]


async def test_a_login_body_is_checked(setup):
    api, _ = setup
    status, body = await api.call(None, "POST", "/api/v2/authn/basic/login", {"username": "x"})
    assert (status, body["code"]) == (400, "InvalidParametersError")
    assert body["details"]["errors"][0]["path"] == "$" and "password" in body["message"]


async def test_a_user_made_without_a_password_cannot_sign_in_with_an_empty_one(setup):
    api, admin = setup
    name = unique("tokenonly")
    status, created = await api.call(admin, "POST", "/api/v2/users", {"username": name})
    assert status == 201 and created["token"].startswith(f"{name}.")
    status, body = await api.call(None, "POST", "/api/v2/authn/basic/login", {"username": name, "password": ""})
    assert (status, body["code"]) == (401, "IncorrectPasswordError")


# --- tokens --------------------------------------------------------------------------------------


async def test_a_token_expires(setup):
    api, admin = setup
    name = await api.new_user(admin)
    short = await api.login(name, expiration=1)
    assert (await api.call(short, "GET", "/api/v2/users/me"))[0] == 200
    await asyncio.sleep(1.5)
    status, body = await api.call(short, "GET", "/api/v2/users/me")
    assert (status, body["code"]) == (401, "UnauthorizedUserError") and "expired" in body["message"]


async def test_application_tokens_are_listed_by_id_and_revoked(setup):
    api, admin = setup
    name = await api.new_user(admin)
    session = await api.login(name)
    status, made = await api.call(session, "POST", "/api/v2/tokens", {"expiration": 3600, "description": "ci"})
    assert status == 201 and made["token"].startswith(f"{name}.")
    app_token = made["token"]
    status, listed = await api.call(app_token, "GET", "/api/v2/tokens")
    ids = {t["id"]: t for t in listed["tokens"]}
    assert made["id"] in ids and ids[made["id"]]["description"] == "ci" and ids[made["id"]]["kind"] == "application"
    assert app_token not in json.dumps(listed) and session not in json.dumps(listed)  # ids only, never tokens

    # Another user cannot revoke it, nor learn it exists.
    other = await api.login(await api.new_user(admin))
    status, body = await api.call(other, "DELETE", f"/api/v2/tokens/{made['id']}")
    assert (status, body["code"]) == (404, "NoTokenError")
    status, body = await api.call(other, "DELETE", f"/api/v2/tokens/{app_token}")
    assert (status, body["code"]) == (404, "NoTokenError")
    assert (await api.call(app_token, "GET", "/api/v2/users/me"))[0] == 200

    status, _ = await api.call(session, "DELETE", f"/api/v2/tokens/{made['id']}")
    assert status == 200
    status, body = await api.call(app_token, "GET", "/api/v2/users/me")
    assert (status, body["code"]) == (401, "UnauthorizedUserError")
    status, body = await api.call(session, "DELETE", f"/api/v2/tokens/{made['id']}")
    assert (status, body["code"]) == (404, "NoTokenError")


@pytest.mark.parametrize(("expiration", "rule"), [(0, "minimum"), (10**9, "maximum"), ("soon", "type")])
async def test_a_token_lifetime_out_of_bounds_is_refused(setup, expiration, rule):
    api, admin = setup
    status, body = await api.call(admin, "POST", "/api/v2/tokens", {"expiration": expiration})
    assert (status, body["code"]) == (400, "InvalidParametersError")
    assert body["details"]["errors"][0]["path"] == "expiration" and body["details"]["errors"][0]["rule"] == rule


async def test_a_forged_token_naming_a_user_is_refused(setup):
    api, admin = setup
    status, body = await api.call(f"{ADMIN}.made-up-secret", "GET", "/api/v2/users/me")
    assert (status, body["code"]) == (401, "UnauthorizedUserError")


# --- users -----------------------------------------------------------------------------------------


async def test_admin_manages_users(setup):
    api, admin = setup
    name = await api.new_user(admin, email="first@example.com")
    status, body = await api.call(admin, "POST", "/api/v2/users", {"username": name})
    assert (status, body["code"]) == (409, "ConflictUserError")

    status, users = await api.call(admin, "GET", "/api/v2/users")
    assert status == 200 and name in {u["username"] for u in users}

    status, changed = await api.call(admin, "PUT", f"/api/v2/users/{name}", {"email": "second@example.com", "admin": True})
    assert status == 200 and (changed["email"], changed["admin"]) == ("second@example.com", True)
    assert "admin" in changed["grouplist"]
    token = await api.login(name)
    assert (await api.call(token, "GET", "/api/v2/users"))[0] == 200  # an admin now

    status, changed = await api.call(admin, "PUT", f"/api/v2/users/{name}", {"admin": False})
    assert changed["admin"] is False
    status, body = await api.call(token, "GET", "/api/v2/users")
    assert (status, body["code"]) == (403, "ForbiddenUserError")  # at once, same token

    status, _ = await api.call(admin, "DELETE", f"/api/v2/users/{name}")
    assert status == 200
    status, body = await api.call(token, "GET", "/api/v2/users/me")
    assert (status, body["code"]) == (401, "UnauthorizedUserError")  # their tokens went with them
    status, body = await api.call(admin, "GET", f"/api/v2/users/{name}")
    assert (status, body["code"]) == (404, "NoUserError")
    status, body = await api.call(admin, "DELETE", f"/api/v2/users/{name}")
    assert (status, body["code"]) == (404, "NoUserError")


async def test_an_admin_cannot_lock_themselves_out(setup):
    api, admin = setup
    for method, body in (("DELETE", None), ("PUT", {"admin": False})):
        status, reply = await api.call(admin, method, f"/api/v2/users/{ADMIN}", body)
        assert (status, reply["code"]) == (403, "ForbiddenKeyError"), reply


@pytest.mark.parametrize(("body", "path", "rule"), [
    ({"password": "short"}, "password", "passwordPolicy"),
    ({"email": "not-an-address"}, "email", "format"),
    ({"grouplist": ["no-such-group"]}, "grouplist[0]", "exists"),
    ({"username": "me"}, "username", "reserved"),
])
async def test_bad_new_users_name_the_field(setup, body, path, rule):
    api, admin = setup
    status, reply = await api.call(admin, "POST", "/api/v2/users", {"username": unique("bad"), **body})
    assert reply["details"]["errors"][0]["path"] == path and reply["details"]["errors"][0]["rule"] == rule, reply
    assert status in (400, 404)


async def test_a_user_changes_their_own_password_and_email(setup):
    api, admin = setup
    name = await api.new_user(admin)
    session, elsewhere = await api.login(name), await api.login(name)
    new_password = "another fine passphrase"
    status, body = await api.call(session, "PUT", "/api/v2/users/me", {"password": new_password, "oldPassword": "guess"})
    assert (status, body["code"]) == (401, "IncorrectPasswordError")
    status, body = await api.call(session, "PUT", "/api/v2/users/me", {"password": new_password})
    assert (status, body["code"]) == (401, "IncorrectPasswordError")  # a token alone does not change it
    status, body = await api.call(session, "PUT", "/api/v2/users/me",
                                  {"password": new_password, "oldPassword": PASSWORD, "email": "me@example.com"})
    assert status == 200 and body["email"] == "me@example.com"
    assert (await api.call(session, "GET", "/api/v2/users/me"))[0] == 200  # this session goes on
    assert (await api.call(elsewhere, "GET", "/api/v2/users/me"))[0] == 401  # other sign-ins end
    status, _ = await api.call(None, "POST", "/api/v2/authn/basic/login", {"username": name, "password": PASSWORD})
    assert status == 401
    await api.login(name, new_password)
    status, body = await api.call(session, "PUT", "/api/v2/users/me", {"admin": True})
    assert (status, body["code"]) == (400, "InvalidParametersError")  # no such field for oneself


async def test_users_read_themselves_not_others(setup):
    api, admin = setup
    alice, bob = await api.new_user(admin), await api.new_user(admin)
    token = await api.login(alice)
    assert (await api.call(token, "GET", f"/api/v2/users/{alice}"))[0] == 200
    status, body = await api.call(token, "GET", f"/api/v2/users/{bob}")
    assert (status, body["code"]) == (403, "ForbiddenUserError")


# --- groups and virtual clusters --------------------------------------------------------------------


async def test_groups_grant_virtual_clusters_at_submit(setup, platform):
    api, admin = setup
    view = ClusterView(virtualClusters=[{"name": "default"}, {"name": "vision"}])
    await (await platform.kv(Bucket.CLUSTER)).put(CLUSTER_VCS_KEY, msgspec.json.encode(view))
    name = await api.new_user(admin)
    token = await api.login(name)

    status, body = await api.call(token, "POST", "/api/v2/jobs", job_yaml(unique("j"), "vision"), "text/yaml")
    assert (status, body["code"]) == (403, "ForbiddenUserError") and "vision" in body["message"]
    status, body = await api.call(token, "POST", "/api/v2/jobs", job_yaml(unique("j"), "nowhere"), "text/yaml")
    assert (status, body["code"]) == (404, "NoVirtualClusterError")
    status, _ = await api.call(token, "POST", "/api/v2/jobs", job_yaml(unique("j")), "text/yaml")
    assert status == 202  # the default group grants the default VC

    group = unique("vision")
    status, created = await api.call(admin, "POST", "/api/v2/groups", {
        "groupname": group, "description": "vision team",
        "extension": {"acls": {"virtualClusters": ["vision"]}}})
    assert status == 201 and created["extension"]["acls"]["virtualClusters"] == ["vision"]
    status, body = await api.call(admin, "POST", "/api/v2/groups", {"groupname": group})
    assert (status, body["code"]) == (409, "ConflictGroupError")
    status, _ = await api.call(admin, "PUT", f"/api/v2/users/{name}", {"grouplist": ["default", group]})
    assert status == 200
    status, body = await api.call(token, "POST", "/api/v2/jobs", job_yaml(unique("j"), "vision"), "text/yaml")
    assert status == 202, body
    status, me = await api.call(token, "GET", "/api/v2/users/me")
    assert me["virtualCluster"] == ["default", "vision"]

    status, members = await api.call(admin, "GET", f"/api/v2/groups/{group}/userlist")
    assert members == [{"username": name, "clusterAdmin": False}]  # OpenPAI's shape
    status, body = await api.call(admin, "DELETE", f"/api/v2/groups/{group}")
    assert (status, body["code"]) == (409, "ConflictGroupError") and name in body["message"]
    await api.call(admin, "PUT", f"/api/v2/users/{name}", {"grouplist": ["default"]})
    status, _ = await api.call(admin, "DELETE", f"/api/v2/groups/{group}")
    assert status == 200
    status, body = await api.call(admin, "GET", f"/api/v2/groups/{group}")
    assert (status, body["code"]) == (404, "NoGroupError")
    status, body = await api.call(token, "POST", "/api/v2/jobs", job_yaml(unique("j"), "vision"), "text/yaml")
    assert status == 403


async def test_built_in_groups_are_there_and_stay(setup):
    api, admin = setup
    status, groups = await api.call(admin, "GET", "/api/v2/groups")
    by_name = {g["groupname"]: g for g in groups}
    assert by_name["admin"]["extension"]["acls"]["admin"] is True
    assert by_name["default"]["extension"]["acls"]["virtualClusters"] == ["default"]
    status, body = await api.call(admin, "DELETE", "/api/v2/groups/default")
    assert (status, body["code"]) == (403, "ForbiddenKeyError")
    status, body = await api.call(admin, "PUT", "/api/v2/groups/admin", {"extension": {"acls": {"admin": False}}})
    assert (status, body["code"]) == (403, "ForbiddenKeyError")


async def test_the_bucket_keeps_no_password_nor_token(setup, platform):
    api, admin = setup
    name = await api.new_user(admin)
    token = await api.login(name)
    kv = await platform.kv(Bucket.USERS)
    # The user's record and every token record of theirs, read in pages (bus.all_keys), not
    # with nats-py's KeyValue.keys(), whose listing can end before the entries arrive.
    token_keys = await all_keys(kv, f"token.{name}.")
    assert token_keys, "the sign-in stored no token record"
    stored = b"".join([(await kv.get(key)).value or b"" for key in [f"user.{name}", *token_keys]])
    assert PASSWORD.encode() not in stored and token.encode() not in stored and token.split(".", 1)[1].encode() not in stored
    # At the cost rest was configured with (the tests' cost: tests/fixtures/settings.py).
    cost = f"m={TEST_ENV['PAI_PASSWORD_HASH_MEMORY_KIB']},t={TEST_ENV['PAI_PASSWORD_HASH_TIME_COST']},p=4"
    assert f"$argon2id$v=19${cost}$".encode() in stored


async def test_names_longer_than_any_are_404_without_asking_nats(setup):
    api, admin = setup
    for path, code in ((f"/api/v2/users/{'u' * 5_000}", "NoUserError"), (f"/api/v2/groups/{'g' * 5_000}", "NoGroupError")):
        status, body = await api.call(admin, "GET", path)
        assert (status, body["code"]) == (404, code)
    status, body = await api.call(f"{'u' * 5_000}.secret", "GET", "/api/v2/users/me")
    assert (status, body["code"]) == (401, "UnauthorizedUserError")
    status, body = await api.call(None, "POST", "/api/v2/authn/basic/login", {"username": "u" * 10_000, "password": "x"})
    assert (status, body["code"]) == (401, "IncorrectPasswordError")
    assert (await api.call(admin, "GET", "/api/v2/users/me"))[0] == 200  # the NATS connection is still there
