"""Who may call what: every route rest serves x anonymous / owner / other user / admin.

rest runs in this process, logged in to a real nats-server as `rest`; the
launcher's log replies and the runtime's rule replies come from stand-ins on their
NATS subjects. Each row names who may call the route and what they get; everyone
else gets 401 UnauthorizedUserError (anonymous) or 403 ForbiddenUserError. A route
rest serves without a row here fails the first test, so a new route is placed in
the matrix when it is added. Rows of routes not served (yet) are skipped.

The owner's job carries a secret and registry credentials; no answer to anyone,
on any route, contains either.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common import sealing
from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.logs import LOG_SUBJECT, LogReply
from libs.common.protocol import ssh
from libs.common.rules_rpc import RULES_SUBJECT, Outcome, RulesReply
from libs.common.service import ServiceContext
from services.rest.app import create_app, startup
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
OWNER, OTHER, ADMIN = f"mxowner{RUN}", f"mxother{RUN}", f"mxadmin{RUN}"
PASSWORD = "matrix passphrase 1"
SECRET = f"s3cret-{RUN}-value"
REGISTRY_PASSWORD = f"registry-{RUN}-password"
JOB = f"{OWNER}~secretjob"
RULE = {"code": 137, "phrase": "killed", "reaction": "NEVER_RETRY", "pattern": {"exitCode": 137}}
CALLERS = ("anonymous", "other", "owner", "admin")  # the owner's stop comes after the other's try

ANYONE, SIGNED_IN, OWNER_OR_ADMIN, ADMIN_ONLY = "anyone", "signed in", "owner or admin", "admin only"
OWNER_ONLY = "owner only"
ALLOWED = {
    ANYONE: {"anonymous", "other", "owner", "admin"},
    SIGNED_IN: {"other", "owner", "admin"},
    OWNER_OR_ADMIN: {"owner", "admin"},
    ADMIN_ONLY: {"admin"},
    OWNER_ONLY: {"owner"},
}

SECRET_JOB = f"""protocolVersion: 2
name: secretjob
type: job
prerequisites:
  - name: image
    type: dockerimage
    uri: registry.example.com/team/train:1
    auth:
      username: robot
      password: {REGISTRY_PASSWORD}
      registryuri: registry.example.com
secrets:
  apiKey: {SECRET}
taskRoles:
  main:
    instances: 1
    dockerImage: image
    commands:
      - echo "<% $secrets.apiKey %>"
"""


def job_yaml(name: str) -> str:
    return f"protocolVersion: 2\nname: {name}\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n    commands:\n      - echo hi\n"


class Matrix:
    """rest's API and a token per kind of caller."""

    def __init__(self, server: TestServer, session: ClientSession, tokens: dict[str, str | None]):
        self.server, self.session, self.tokens = server, session, tokens
        self.fresh = iter(range(10**6))

    def unique(self, prefix: str) -> str:
        return f"{prefix}{RUN}n{next(self.fresh)}"

    async def call(self, token: str | None, method: str, path: str, body: Any = None,
                   content_type: str = "application/json", stream: bool = False) -> tuple[int, Any]:
        headers = {"Content-Type": content_type}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = body if body is None or isinstance(body, (str, bytes)) else json.dumps(body)
        async with self.session.request(method, self.server.make_url(path), data=data, headers=headers) as resp:
            if stream and resp.status < 400:
                return resp.status, ""  # an event stream: it answered; leave it
            raw = await resp.read()
            try:
                return resp.status, json.loads(raw)
            except ValueError:
                return resp.status, raw.decode(errors="replace")

    async def as_admin(self, method: str, path: str, body: Any = None) -> Any:
        status, reply = await self.call(self.tokens["admin"], method, path, body)
        assert status < 300, (method, path, status, reply)
        return reply

    async def fresh_user(self) -> str:
        name = self.unique("mxu")
        await self.as_admin("POST", "/api/v2/users", {"username": name, "password": PASSWORD})
        return name

    async def fresh_group(self) -> str:
        name = self.unique("mxg")
        await self.as_admin("POST", "/api/v2/groups", {"groupname": name})
        return name

    async def sign_in(self, who: str) -> str:
        name = {"owner": OWNER, "other": OTHER, "admin": ADMIN}[who]
        status, reply = await self.call(None, "POST", "/api/v2/authn/basic/login", {"username": name, "password": PASSWORD})
        assert status == 200, reply
        return reply["token"]


# A request for one caller: (path, body), made fresh per call where the call changes something.
Request = Callable[[Matrix, str], Awaitable[tuple[str, Any]]]


def fixed(path: str, body: Any = None) -> Request:
    async def request(_: Matrix, __: str) -> tuple[str, Any]:
        return path, body
    return request


async def _new_job(m: Matrix, _: str) -> tuple[str, Any]:
    return "/api/v2/jobs", job_yaml(m.unique("job"))


async def _new_user_body(m: Matrix, _: str) -> tuple[str, Any]:
    return "/api/v2/users", {"username": m.unique("mxnew")}


async def _fresh_user_path(m: Matrix, _: str) -> tuple[str, Any]:
    return f"/api/v2/users/{await m.fresh_user()}", None


def _fresh_user_sub(sub: str, body: Any) -> Request:
    async def request(m: Matrix, _: str) -> tuple[str, Any]:
        return f"/api/v2/users/{await m.fresh_user()}/{sub}", body
    return request


def _fresh_group_sub(sub: str, body: Any) -> Request:
    async def request(m: Matrix, _: str) -> tuple[str, Any]:
        return f"/api/v2/groups/{await m.fresh_group()}/{sub}", body
    return request


async def _openpai_user_change(m: Matrix, _: str) -> tuple[str, Any]:
    return "/api/v2/users", {"data": {"username": await m.fresh_user(), "email": "x@example.com"}, "patch": True}


async def _openpai_group_change(m: Matrix, _: str) -> tuple[str, Any]:
    return "/api/v2/groups", {"data": {"groupname": await m.fresh_group(), "description": "d"}, "patch": True}


async def _new_group_body(m: Matrix, _: str) -> tuple[str, Any]:
    return "/api/v2/groups", {"groupname": m.unique("mxnewg")}


async def _fresh_group_path(m: Matrix, _: str) -> tuple[str, Any]:
    return f"/api/v2/groups/{await m.fresh_group()}", None


async def _own_token_path(m: Matrix, who: str) -> tuple[str, Any]:
    if who == "anonymous":
        return "/api/v2/tokens/nothing", None
    _, made = await m.call(m.tokens[who], "POST", "/api/v2/tokens", {"expiration": 600})
    return f"/api/v2/tokens/{made['id']}", None


def _new_key(m: Matrix) -> dict[str, str]:
    return {"title": m.unique("key"), "value": ssh.generate_key_pair("matrix")[1]}


async def _my_new_key(m: Matrix, _: str) -> tuple[str, Any]:
    return "/api/v2/users/me/ssh-keys", _new_key(m)


async def _owners_new_key(m: Matrix, _: str) -> tuple[str, Any]:
    return f"/api/v2/users/{OWNER}/ssh-keys", _new_key(m)


async def _my_key_path(m: Matrix, who: str) -> tuple[str, Any]:
    """One of the caller's own keys (added by them first)."""
    key = _new_key(m)
    if who != "anonymous":
        status, reply = await m.call(m.tokens[who], "POST", "/api/v2/users/me/ssh-keys", key)
        assert status == 201, reply
    return f"/api/v2/users/me/ssh-keys/{key['title']}", None


async def _owners_key_path(m: Matrix, _: str) -> tuple[str, Any]:
    """One of the owner's keys (an admin adds it first)."""
    key = _new_key(m)
    await m.as_admin("POST", f"/api/v2/users/{OWNER}/ssh-keys", key)
    return f"/api/v2/users/{OWNER}/ssh-keys/{key['title']}", None


MARKET = "/api/v2/marketplace/items"
MARKET_ITEM = {"name": "matrix item", "protocol": job_yaml("fromitem")}


async def _owners_public_item(m: Matrix, _: str) -> tuple[str, Any]:
    """An item of the owner's, public and approved: everyone sees it, its owner and admins change it."""
    status, item = await m.call(m.tokens["owner"], "POST", MARKET, {**MARKET_ITEM, "visibility": "public"})
    assert status == 201, item
    await m.as_admin("POST", f"{MARKET}/{item['id']}/review", {"decision": "approve"})
    return f"{MARKET}/{item['id']}", {"summary": "changed"}


async def _owners_pending_review(m: Matrix, _: str) -> tuple[str, Any]:
    status, item = await m.call(m.tokens["owner"], "POST", MARKET, {**MARKET_ITEM, "visibility": "public"})
    assert status == 201, item
    return f"{MARKET}/{item['id']}/review", {"decision": "approve"}


async def _login(m: Matrix, _: str) -> tuple[str, Any]:
    return "/api/v2/authn/basic/login", {"username": OWNER, "password": PASSWORD}


# (method, route as registered) -> (who may, request, status when allowed; a set where the
# answer past authorization depends on cluster state this test does not make).
MATRIX: dict[tuple[str, str], tuple[str, Request, int | set[int]]] = {
    ("GET", "/healthz"): (ANYONE, fixed("/healthz"), 200),
    ("GET", "/readyz"): (ANYONE, fixed("/readyz"), 200),
    ("GET", "/metrics"): (ANYONE, fixed("/metrics"), 200),
    # jobs
    ("POST", "/api/v2/jobs"): (SIGNED_IN, _new_job, 202),
    ("GET", "/api/v2/jobs"): (SIGNED_IN, fixed("/api/v2/jobs"), 200),
    ("GET", "/api/v2/jobs/{job}"): (SIGNED_IN, fixed(f"/api/v2/jobs/{JOB}"), 200),
    # The job is not finished here (no launcher): those allowed get the 409 that says so, nothing is deleted.
    ("DELETE", "/api/v2/jobs/{job}"): (OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}"), 409),
    ("GET", "/api/v2/jobs/{job}/config"): (OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/config"), 200),
    ("GET", "/api/v2/jobs/{job}/job-attempts"): (OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/job-attempts"), 200),
    ("GET", "/api/v2/jobs/{job}/logs"): (OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/logs"), 200),
    ("PUT", "/api/v2/jobs/{job}/executionType"): (OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/executionType",
                                                                        {"value": "STOP"}), 202),
    ("GET", "/api/v2/jobs/{job}/job-attempts/{attempt}"): (OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/job-attempts/0"),
                                                           {200, 404}),
    ("GET", "/api/v2/jobs/{job}/job-attempts/{attempt}/tasks/{role}/{index}"): (
        OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/job-attempts/1/tasks/main/0"), {200, 404}),
    ("GET", "/api/v2/jobs/{job}/job-attempts/{attempt}/tasks/{role}/{index}/logs"): (
        OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/job-attempts/1/tasks/main/0/logs"), {200, 404}),
    ("PUT", "/api/v2/jobs/{job}/tag"): (OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/tag", {"value": "baseline"}), 200),
    ("DELETE", "/api/v2/jobs/{job}/tag"): (OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/tag", {"value": "baseline"}), 200),
    ("GET", "/api/v2/jobs/{job}/events"): (OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/events"), 200),
    ("GET", "/api/v2/jobs/{job}/metrics"): (OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/metrics"), 200),
    # a shell in a running task (services/rest/terminal.py): this job runs no task
    ("GET", "/api/v2/jobs/{job}/terminal"): (OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/terminal"), 409),
    # the job's TensorBoard (services/rest/job_tensorboard.py): its pages run on PAI's own address, so
    # only the owner's browser opens them (an admin's too would run the job's scripts signed in as admin);
    # this job asks for no TensorBoard
    ("GET", "/api/v2/jobs/{job}/tensorboard"): (OWNER_ONLY, fixed(f"/api/v2/jobs/{JOB}/tensorboard"), 404),
    ("GET", "/api/v2/jobs/{job}/tensorboard/{tail}"): (OWNER_ONLY, fixed(f"/api/v2/jobs/{JOB}/tensorboard/"), 404),
    ("POST", "/api/v2/jobs/{job}/tensorboard/{tail}"): (OWNER_ONLY, fixed(f"/api/v2/jobs/{JOB}/tensorboard/data",
                                                                          {"q": 1}), 404),
    # cluster
    ("GET", "/api/v2/virtual-clusters"): (SIGNED_IN, fixed("/api/v2/virtual-clusters"), 200),
    ("GET", "/api/v2/virtual-clusters/{vc}"): (SIGNED_IN, fixed("/api/v2/virtual-clusters/default"), {200, 404}),
    ("GET", "/api/v2/cluster/sku-types"): (SIGNED_IN, fixed("/api/v2/cluster/sku-types"), 200),
    ("GET", "/api/v2/cluster/nodes"): (SIGNED_IN, fixed("/api/v2/cluster/nodes"), 200),
    ("PUT", "/api/v2/cluster/nodes/{node}/cordon"): (ADMIN_ONLY, fixed("/api/v2/cluster/nodes/node-1/cordon",
                                                                       {"reason": "matrix"}), {202, 404}),
    ("DELETE", "/api/v2/cluster/nodes/{node}/cordon"): (ADMIN_ONLY, fixed("/api/v2/cluster/nodes/node-1/cordon"),
                                                        {202, 404}),
    ("GET", "/api/v2/info"): (ANYONE, fixed("/api/v2/info"), 200),
    ("GET", "/api/v2/openapi.json"): (ANYONE, fixed("/api/v2/openapi.json"), 200),
    ("GET", "/api/v2/docs"): (ANYONE, fixed("/api/v2/docs"), 200),
    # identity
    ("POST", "/api/v2/authn/basic/login"): (ANYONE, _login, 200),
    ("DELETE", "/api/v2/authn/basic/logout"): (SIGNED_IN, fixed("/api/v2/authn/basic/logout"), 200),
    ("GET", "/api/v2/authn/info"): (ANYONE, fixed("/api/v2/authn/info"), 200),
    # OIDC sign-in (tests/component/test_oidc.py): a browser's, public; no provider is configured here
    ("GET", "/api/v2/authn/oidc/login"): (ANYONE, fixed("/api/v2/authn/oidc/login"), 404),
    ("GET", "/api/v2/authn/oidc/return"): (ANYONE, fixed("/api/v2/authn/oidc/return"), 404),
    ("POST", "/api/v2/authn/oidc/return"): (ANYONE, fixed("/api/v2/authn/oidc/return"), 404),
    ("GET", "/api/v2/authn/oidc/logout"): (ANYONE, fixed("/api/v2/authn/oidc/logout"), 404),
    ("GET", "/api/v2/tokens"): (SIGNED_IN, fixed("/api/v2/tokens"), 200),
    ("POST", "/api/v2/tokens"): (SIGNED_IN, fixed("/api/v2/tokens", {"expiration": 600}), 201),
    ("DELETE", "/api/v2/tokens/{token}"): (SIGNED_IN, _own_token_path, 200),
    ("GET", "/api/v2/users/me"): (SIGNED_IN, fixed("/api/v2/users/me"), 200),
    ("PUT", "/api/v2/users/me"): (SIGNED_IN, fixed("/api/v2/users/me", {"email": "me@example.com"}), 200),
    # each user's SSH keys (services/rest/identity/ssh_keys.py): one's own, or an admin for anyone
    ("GET", "/api/v2/users/me/ssh-keys"): (SIGNED_IN, fixed("/api/v2/users/me/ssh-keys"), 200),
    ("POST", "/api/v2/users/me/ssh-keys"): (SIGNED_IN, _my_new_key, 201),
    ("DELETE", "/api/v2/users/me/ssh-keys/{title}"): (SIGNED_IN, _my_key_path, 200),
    ("GET", "/api/v2/users/{user}/ssh-keys"): (OWNER_OR_ADMIN, fixed(f"/api/v2/users/{OWNER}/ssh-keys"), 200),
    ("POST", "/api/v2/users/{user}/ssh-keys"): (OWNER_OR_ADMIN, _owners_new_key, 201),
    ("DELETE", "/api/v2/users/{user}/ssh-keys/{title}"): (OWNER_OR_ADMIN, _owners_key_path, 200),
    ("GET", "/api/v2/users"): (ADMIN_ONLY, fixed("/api/v2/users"), 200),
    ("POST", "/api/v2/users"): (ADMIN_ONLY, _new_user_body, 201),
    ("GET", "/api/v2/users/{user}"): (OWNER_OR_ADMIN, fixed(f"/api/v2/users/{OWNER}"), 200),
    ("PUT", "/api/v2/users/{user}"): (ADMIN_ONLY, fixed(f"/api/v2/users/{OWNER}", {"email": "o@example.com"}), 200),
    ("DELETE", "/api/v2/users/{user}"): (ADMIN_ONLY, _fresh_user_path, 200),
    ("GET", "/api/v2/groups"): (SIGNED_IN, fixed("/api/v2/groups"), 200),
    ("POST", "/api/v2/groups"): (ADMIN_ONLY, _new_group_body, 201),
    ("GET", "/api/v2/groups/{group}"): (SIGNED_IN, fixed("/api/v2/groups/default"), 200),
    ("PUT", "/api/v2/groups/{group}"): (ADMIN_ONLY, fixed("/api/v2/groups/default", {"description": "everyone"}), 200),
    ("DELETE", "/api/v2/groups/{group}"): (ADMIN_ONLY, _fresh_group_path, 200),
    ("GET", "/api/v2/groups/{group}/userlist"): (ADMIN_ONLY, fixed("/api/v2/groups/default/userlist"), 200),
    ("GET", "/api/v2/events"): (SIGNED_IN, fixed("/api/v2/events"), 200),
    # OpenPAI's routes beside PAI's (services/rest/openpai_jobs.py, kubernetes_views.py, identity/openpai.py)
    ("GET", "/api/v2"): (ANYONE, fixed("/api/v2"), 200),
    ("GET", "/api/v1"): (ANYONE, fixed("/api/v1"), 200),
    ("GET", "/api/v2/jobs/{job}/ssh"): (OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/ssh"), 404),
    ("GET", "/api/v2/jobs/{job}/job-attempts/healthz"): (SIGNED_IN, fixed(f"/api/v2/jobs/{JOB}/job-attempts/healthz"),
                                                         200),
    ("GET", "/api/v2/jobs/{job}/attempts/{jobAttemptId}"): (OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/attempts/0"),
                                                            {200, 404}),
    ("GET", "/api/v2/jobs/{job}/attempts/{jobAttemptId}/taskRoles/{taskRoleName}/taskIndex/{taskIndex}/attempts"): (
        OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/attempts/0/taskRoles/main/taskIndex/0/attempts"), {200, 404}),
    ("GET", "/api/v2/jobs/{job}/attempts/{jobAttemptId}/taskRoles/{taskRoleName}/taskIndex/{taskIndex}/attempts/"
            "{taskAttemptId}/logs"): (
        OWNER_OR_ADMIN, fixed(f"/api/v2/jobs/{JOB}/attempts/0/taskRoles/main/taskIndex/0/attempts/0/logs"), {200, 404}),
    ("GET", "/api/v2/virtual-clusters/{vc}/sku-types"): (SIGNED_IN, fixed("/api/v2/virtual-clusters/default/sku-types"),
                                                         {200, 404}),
    ("PUT", "/api/v2/virtual-clusters/{vc}"): (ADMIN_ONLY, fixed("/api/v2/virtual-clusters/vcx", {}), 400),
    ("DELETE", "/api/v2/virtual-clusters/{vc}"): (ADMIN_ONLY, fixed("/api/v2/virtual-clusters/vcx"), 400),
    ("PUT", "/api/v2/virtual-clusters/{vc}/status"): (ADMIN_ONLY, fixed("/api/v2/virtual-clusters/vcx/status", {}), 400),
    ("GET", "/api/v2/kubernetes/nodes"): (ADMIN_ONLY, fixed("/api/v2/kubernetes/nodes"), 200),
    ("GET", "/api/v2/kubernetes/pods"): (ADMIN_ONLY, fixed("/api/v2/kubernetes/pods"), 200),
    ("POST", "/api/v2/tokens/application"): (SIGNED_IN, fixed("/api/v2/tokens/application", {}), 200),
    ("GET", "/api/v2/tokens/check"): (SIGNED_IN, fixed("/api/v2/tokens/check"), 200),
    ("PUT", "/api/v2/users"): (ADMIN_ONLY, _openpai_user_change, 201),
    ("PUT", "/api/v2/users/{user}/group"): (ADMIN_ONLY, _fresh_user_sub("group", {"groupname": "default"}), 201),
    ("DELETE", "/api/v2/users/{user}/group"): (ADMIN_ONLY, _fresh_user_sub("group", {"groupname": "default"}), 201),
    ("PUT", "/api/v2/users/{user}/grouplist"): (ADMIN_ONLY, _fresh_user_sub("grouplist", {"grouplist": ["default"]}),
                                                201),
    ("PUT", "/api/v2/users/{user}/extension"): (ADMIN_ONLY, _fresh_user_sub("extension", {"extension": {"k": 1}}), 201),
    ("PUT", "/api/v2/users/{user}/virtualcluster"): (ADMIN_ONLY, _fresh_user_sub("virtualcluster",
                                                                                 {"virtualCluster": ["default"]}), 201),
    ("PUT", "/api/v2/users/{user}/password"): (ADMIN_ONLY, _fresh_user_sub("password", {"newPassword": PASSWORD + "x"}),
                                               201),
    ("PUT", "/api/v2/users/{user}/email"): (ADMIN_ONLY, _fresh_user_sub("email", {"email": "e@example.com"}), 201),
    ("PUT", "/api/v2/users/{user}/admin"): (ADMIN_ONLY, _fresh_user_sub("admin", {"admin": False}), 201),
    ("PUT", "/api/v2/groups"): (ADMIN_ONLY, _openpai_group_change, 201),
    ("PUT", "/api/v2/groups/{group}/extension"): (ADMIN_ONLY, _fresh_group_sub("extension", {"extension": {}}), 201),
    ("PUT", "/api/v2/groups/{group}/extension/{path}"): (
        ADMIN_ONLY, _fresh_group_sub("extension/acls/virtualClusters", {"data": ["default"]}), 201),
    ("PUT", "/api/v2/groups/{group}/description"): (ADMIN_ONLY, _fresh_group_sub("description", {"description": "d"}),
                                                    201),
    ("PUT", "/api/v2/groups/{group}/externalname"): (ADMIN_ONLY, _fresh_group_sub("externalname",
                                                                                 {"externalName": "cn=x"}), 201),
    # alerts (the monitor answers rule and report commands; none runs here: 503 past authorization)
    ("GET", "/api/v2/alerts"): (SIGNED_IN, fixed("/api/v2/alerts"), 200),
    ("GET", "/api/v2/alerts/rules"): (SIGNED_IN, fixed("/api/v2/alerts/rules"), {200, 503}),
    ("PUT", "/api/v2/alerts/rules"): (ADMIN_ONLY, fixed("/api/v2/alerts/rules", "rules: []\n"), {200, 400, 503}),
    ("POST", "/api/v2/alerts/rules/reset"): (ADMIN_ONLY, fixed("/api/v2/alerts/rules/reset"), {200, 503}),
    ("GET", "/api/v2/report"): (ADMIN_ONLY, fixed("/api/v2/report"), {200, 503}),
    ("POST", "/api/v2/report"): (ADMIN_ONLY, fixed("/api/v2/report"), {200, 503}),
    # failure rules
    ("GET", "/api/v2/rules"): (SIGNED_IN, fixed("/api/v2/rules"), 200),
    ("POST", "/api/v2/rules"): (ADMIN_ONLY, fixed("/api/v2/rules", RULE), 201),
    ("POST", "/api/v2/rules/reset"): (ADMIN_ONLY, fixed("/api/v2/rules/reset"), 200),
    ("GET", "/api/v2/rules/{code}"): (SIGNED_IN, fixed("/api/v2/rules/137"), 200),
    ("PUT", "/api/v2/rules/{code}"): (ADMIN_ONLY, fixed("/api/v2/rules/137", RULE), 200),
    ("DELETE", "/api/v2/rules/{code}"): (ADMIN_ONLY, fixed("/api/v2/rules/137"), 200),
    # storages (services/rest/storages.py): each user sees what their groups grant
    ("GET", "/api/v2/storages"): (SIGNED_IN, fixed("/api/v2/storages"), 200),
    ("GET", "/api/v2/storages/{name}"): (SIGNED_IN, fixed("/api/v2/storages/mxnostorage"), 404),
    ("PUT", "/api/v2/storages/{name}"): (ADMIN_ONLY, fixed("/api/v2/storages/mxstorage",
                                                          {"type": "hostPath", "data": {"path": "/srv/mx"}}), {200, 201}),
    ("DELETE", "/api/v2/storages/{name}"): (ADMIN_ONLY, fixed("/api/v2/storages/mxnostorage"), 404),
    ("GET", "/api/v2/storage/config"): (SIGNED_IN, fixed("/api/v2/storage/config"), 200),
    ("GET", "/api/v2/storage/config/{name}"): (SIGNED_IN, fixed("/api/v2/storage/config/mxnostorage"), 404),
    ("GET", "/api/v2/storage/server"): (SIGNED_IN, fixed("/api/v2/storage/server"), 200),
    ("GET", "/api/v2/storage/server/{name}"): (SIGNED_IN, fixed("/api/v2/storage/server/mxnostorage"), 404),
    # the marketplace (services/rest/market): hidden items are 404s (tests/component/test_market_api.py)
    ("GET", "/api/v2/marketplace/items"): (SIGNED_IN, fixed(MARKET), 200),
    ("POST", "/api/v2/marketplace/items"): (SIGNED_IN, fixed(MARKET, MARKET_ITEM), 201),
    ("POST", "/api/v2/marketplace/import"): (SIGNED_IN, fixed("/api/v2/marketplace/import", job_yaml("imported")), 201),
    ("GET", "/api/v2/marketplace/items/{item}"): (SIGNED_IN, fixed(f"{MARKET}/cpu-batch"), 200),
    ("PUT", "/api/v2/marketplace/items/{item}"): (OWNER_OR_ADMIN, _owners_public_item, 200),
    ("DELETE", "/api/v2/marketplace/items/{item}"): (OWNER_OR_ADMIN, _owners_public_item, 200),
    ("PUT", "/api/v2/marketplace/items/{item}/star"): (SIGNED_IN, fixed(f"{MARKET}/cpu-batch/star"), 200),
    ("DELETE", "/api/v2/marketplace/items/{item}/star"): (SIGNED_IN, fixed(f"{MARKET}/cpu-batch/star"), 200),
    ("POST", "/api/v2/marketplace/items/{item}/review"): (ADMIN_ONLY, _owners_pending_review, 200),
    ("POST", "/api/v2/marketplace/items/{item}/render"): (SIGNED_IN, fixed(f"{MARKET}/cpu-batch/render", {}), 200),
    ("GET", "/api/v2/marketplace/items/{item}/export"): (SIGNED_IN, fixed(f"{MARKET}/cpu-batch/export"), 200),
    # the web portal (services/rest/portal_routes.py): its files are public, its summaries are not
    ("GET", "/"): (ANYONE, fixed("/"), 200),
    ("GET", "/portal/{path}"): (ANYONE, fixed("/portal/js/main.js"), 200),
    ("GET", "/api/v2/portal/overview"): (SIGNED_IN, fixed("/api/v2/portal/overview"), 200),
    ("GET", "/api/v2/portal/utilization"): (SIGNED_IN, fixed("/api/v2/portal/utilization"), 200),
    ("GET", "/api/v2/portal/queue/{vc}"): (SIGNED_IN, fixed("/api/v2/portal/queue/default"), {200, 404}),
}
# Calls that end the caller's session: made with a session of their own.
ENDS_SESSION = {("DELETE", "/api/v2/authn/basic/logout")}
STREAMS = {("GET", "/api/v2/events")}


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture(scope="module")
async def matrix(nats_server, tmp_path_factory) -> AsyncIterator[Matrix]:
    platform = await Bus.connect(nats_server.url, name="matrix-platform", **nats_server.login("platform"))
    await platform.bootstrap()

    async def logs(msg):
        await msg.respond(msgspec.json.encode(LogReply(found=True, data=b"hello from the task\n")))

    async def rules(msg):
        await msg.respond(msgspec.json.encode(RulesReply(outcome=Outcome.OK, rules=[RULE], position=0, revision=1)))

    stand_ins = [await platform.nc.subscribe(LOG_SUBJECT, cb=logs), await platform.nc.subscribe(RULES_SUBJECT, cb=rules)]
    bus = await Bus.connect(nats_server.url, name="matrix-rest", **nats_server.login("rest"))
    data = tmp_path_factory.mktemp("matrix")
    sealing.write_key_pair(data / "secrets.key", data / "secrets.pub")
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(data), admin_user=ADMIN,
                         secrets_public_key_file=str(data / "secrets.pub"))
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    await startup(ctx)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    async with ClientSession() as session:
        m = Matrix(server, session, {"anonymous": None, "admin": config.token_path.read_text().strip()})
        await m.as_admin("PUT", f"/api/v2/users/{ADMIN}", {"password": PASSWORD})
        for who, name in (("owner", OWNER), ("other", OTHER)):
            await m.as_admin("POST", "/api/v2/users", {"username": name, "password": PASSWORD})
            m.tokens[who] = await m.sign_in(who)
        status, reply = await m.call(m.tokens["owner"], "POST", "/api/v2/jobs", job_yaml("secretjob"), "text/yaml")
        assert status == 202, reply
        yield m
    await server.close()
    for subscription in stand_ins:
        await subscription.unsubscribe()
    await bus.close()
    await platform.close()


def served_routes(m: Matrix) -> set[tuple[str, str]]:
    return {(r.method, r.resource.canonical) for r in m.server.app.router.routes() if r.method != "HEAD"}


def test_every_route_rest_serves_has_a_row(matrix):
    missing = served_routes(matrix) - set(MATRIX)
    assert not missing, f"routes with no row in the authorization matrix: {sorted(missing)}"


@pytest.mark.parametrize("route", list(MATRIX), ids=[f"{m} {p}" for m, p in MATRIX])
async def test_authorization_matrix(matrix, route):
    if route not in served_routes(matrix):
        pytest.skip(f"{route[0]} {route[1]} is not served (yet)")
    who_may, request, allowed_status = MATRIX[route]
    method = route[0]
    for caller in CALLERS:
        path, body = await request(matrix, caller)
        token = matrix.tokens[caller]
        if route in ENDS_SESSION and token:
            token = await matrix.sign_in(caller)
        content_type = "text/yaml" if route == ("POST", "/api/v2/jobs") else "application/json"
        status, reply = await matrix.call(token, method, path, body, content_type, stream=route in STREAMS)
        code = reply.get("code") if isinstance(reply, dict) and status >= 400 else None
        if caller in ALLOWED[who_may]:
            ok = allowed_status if isinstance(allowed_status, set) else {allowed_status}
            assert status in ok and status not in (401, 403), f"{caller}: {status} {reply}"
        elif caller == "anonymous":
            assert (status, code) == (401, "UnauthorizedUserError"), f"{caller}: {status} {reply}"
        else:
            assert (status, code) == (403, "ForbiddenUserError"), f"{caller}: {status} {reply}"
        text = reply if isinstance(reply, str) else json.dumps(reply)
        assert SECRET not in text and REGISTRY_PASSWORD not in text, f"{caller} {method} {path} shows a secret"


async def test_a_secret_job_is_masked_for_its_owner_and_admins_too(matrix):
    status, reply = await matrix.call(matrix.tokens["owner"], "POST", "/api/v2/jobs", SECRET_JOB.replace(
        "name: secretjob", f"name: masked{RUN}"), "text/yaml")
    assert status == 202, reply
    job = f"{OWNER}~masked{RUN}"
    for who in ("owner", "admin"):
        for path in (f"/api/v2/jobs/{job}", f"/api/v2/jobs/{job}/config", f"/api/v2/jobs/{job}/job-attempts",
                     "/api/v2/jobs"):
            status, reply = await matrix.call(matrix.tokens[who], "GET", path)
            text = json.dumps(reply)
            assert status == 200 and SECRET not in text and REGISTRY_PASSWORD not in text, (who, path)
    status, config = await matrix.call(matrix.tokens["owner"], "GET", f"/api/v2/jobs/{job}/config")
    assert config["prerequisites"][0]["auth"]["username"] == "robot"  # only the password is masked
    assert config["secrets"]["apiKey"] != SECRET
