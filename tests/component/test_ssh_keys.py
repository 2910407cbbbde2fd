"""A user's SSH keys through rest's API (services/rest/identity/ssh_keys.py), rest logged
in to a real nats-server as `rest`: added, listed, refused naming the field, deleted;
kept in `extension.sshKeys`, where the ssh plugin reads them at submission; nobody
else's to touch."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.protocol import parse_job, ssh
from libs.common.service import ServiceContext
from services.rest import job_ssh
from services.rest.app import create_app, startup
from tests.component.test_identity import Api
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
ADMIN = f"skadmin{RUN}"
KEYS = "/api/v2/users/me/ssh-keys"
SSH_JOB = ("protocolVersion: 2\nname: j\ntype: job\ntaskRoles:\n  a:\n    instances: 1\n    commands: [train]\n"
           "extras:\n  com.microsoft.pai.runtimeplugin:\n    - plugin: ssh\n      parameters: {jobssh: true}\n")


def new_key(comment: str = "me@laptop") -> str:
    return ssh.generate_key_pair(comment)[1]


@pytest.fixture(scope="module")
async def setup(nats_server, tmp_path_factory) -> AsyncIterator[tuple[Api, Bus, dict[str, str]]]:
    platform = await Bus.connect(nats_server.url, name="sshkeys-platform", **nats_server.login("platform"))
    await platform.bootstrap()
    bus = await Bus.connect(nats_server.url, name="sshkeys-rest", **nats_server.login("rest"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp_path_factory.mktemp("sshkeys")), admin_user=ADMIN)
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    await startup(ctx)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    async with ClientSession() as session:
        api = Api(server, session)
        admin = config.token_path.read_text().strip()
        tokens = {"admin": admin}
        for who in ("alice", "bob"):
            name = await api.new_user(admin, username=f"sk{who}{RUN}")
            tokens[who] = await api.login(name)
            tokens[f"{who}-name"] = name
        yield api, bus, tokens
    await server.close()
    await bus.close()
    await platform.close()


async def test_a_key_is_added_listed_trusted_by_the_ssh_plugin_and_deleted(setup):
    api, bus, tokens = setup
    alice, name = tokens["alice"], tokens["alice-name"]
    key = new_key()
    status, added = await api.call(alice, "POST", KEYS, {"title": "laptop", "value": f"  {key}\n"})
    assert status == 201, added
    assert added["title"] == "laptop" and added["value"] == key and added["time"] > 0
    status, listed = await api.call(alice, "GET", KEYS)
    assert status == 200 and [(k["title"], k["value"]) for k in listed["sshKeys"]] == [("laptop", key)]
    # Where OpenPAI keeps them: the user's extension, beside what else is there.
    await api.call(alice, "PUT", f"/api/v2/users/{name}/extension", {"extension": {"theme": "dark"}})
    _, me = await api.call(alice, "GET", "/api/v2/users/me")
    assert me["extension"]["theme"] == "dark" and me["extension"]["sshKeys"][0]["value"] == key
    # A job submitted now trusts it: its server's step lists the key.
    parsed = parse_job(SSH_JOB, user=name)
    spec, _, _ = await job_ssh.prepare(bus, name, f"{name}~j", parsed.spec, parsed.config, {})
    assert ssh.public_key_line(key) in spec.role("a").commands[0]

    status, reply = await api.call(alice, "DELETE", f"{KEYS}/laptop")
    assert status == 200, reply
    status, listed = await api.call(alice, "GET", KEYS)
    assert listed["sshKeys"] == []
    spec, _, _ = await job_ssh.prepare(bus, name, f"{name}~k", parsed.spec, parsed.config, {})
    assert ssh.public_key_line(key) not in spec.role("a").commands[0]
    status, reply = await api.call(alice, "DELETE", f"{KEYS}/laptop")
    assert status == 404 and "no SSH key titled 'laptop'" in reply["message"], reply


@pytest.mark.parametrize(("body", "field", "rule"), [
    ({"title": "x", "value": "not a key"}, "value", "format"),
    ({"title": "x", "value": f'command="sh" {ssh.generate_key_pair("c")[1]}'}, "value", "format"),
    ({"title": "x", "value": f"{ssh.generate_key_pair('a')[1]}\n{ssh.generate_key_pair('b')[1]}"}, "value", "format"),
    ({"title": "x", "value": "ssh-dss AAAAB3NzaC1kc3MAAACBAP1234567890abcdef"}, "value", "format"),
    ({"title": "x", "value": "ssh-ed25519 " + "A" * 9000}, "value", "maxLength"),
    ({"title": "x"}, "value", "required"),
    ({"title": "a/b", "value": ssh.generate_key_pair("d")[1]}, "title", "pattern"),
    ({"title": "", "value": ssh.generate_key_pair("e")[1]}, "title", "pattern"),
    ({"title": "x", "value": ssh.generate_key_pair("f")[1], "options": "no-pty"}, "options", "unknown"),
], ids=["not-a-key", "options", "two-lines", "dsa", "too-long", "no-value", "slash-in-title", "empty-title",
        "unknown-field"])
async def test_a_bad_key_is_refused_naming_the_field(setup, body, field, rule):
    api, _, tokens = setup
    status, reply = await api.call(tokens["alice"], "POST", KEYS, body)
    assert status == 400, reply
    assert reply["code"] == "InvalidParametersError" and reply["message"].startswith(f"{field}: ")
    assert reply["details"]["errors"][0]["path"] == field and reply["details"]["errors"][0]["rule"] == rule
    _, listed = await api.call(tokens["alice"], "GET", KEYS)
    assert all(k["title"] != "x" for k in listed["sshKeys"])


async def test_a_title_or_key_twice_is_409_and_the_count_is_bounded(setup):
    api, _, tokens = setup
    bob = tokens["bob"]
    key = new_key()
    assert (await api.call(bob, "POST", KEYS, {"title": "one", "value": key}))[0] == 201
    status, reply = await api.call(bob, "POST", KEYS, {"title": "one", "value": new_key()})
    assert status == 409 and reply["details"]["errors"][0]["path"] == "title", reply
    status, reply = await api.call(bob, "POST", KEYS, {"title": "two", "value": key.rsplit(" ", 1)[0] + " other"})
    assert status == 409 and reply["details"]["errors"][0]["path"] == "value", reply
    for i in range(ssh.MAX_PROFILE_KEYS - 1):
        assert (await api.call(bob, "POST", KEYS, {"title": f"k{i}", "value": new_key()}))[0] == 201
    status, reply = await api.call(bob, "POST", KEYS, {"title": "too-many", "value": new_key()})
    assert status == 400 and reply["details"]["errors"][0] == {
        "path": "sshKeys", "rule": "maxItems", "message": reply["details"]["errors"][0]["message"]}
    assert str(ssh.MAX_PROFILE_KEYS) in reply["message"]
    for i in range(ssh.MAX_PROFILE_KEYS - 1):
        assert (await api.call(bob, "DELETE", f"{KEYS}/k{i}"))[0] == 200


async def test_another_user_cannot_touch_them_an_admin_can(setup):
    api, _, tokens = setup
    alice, bob, admin = tokens["alice"], tokens["bob"], tokens["admin"]
    alices = f"/api/v2/users/{tokens['alice-name']}/ssh-keys"
    key = new_key()
    assert (await api.call(alice, "POST", KEYS, {"title": "desk", "value": key}))[0] == 201
    for method, path, body in (("GET", alices, None), ("POST", alices, {"title": "evil", "value": new_key()}),
                               ("DELETE", f"{alices}/desk", None)):
        status, reply = await api.call(bob, method, path, body)
        assert (status, reply["code"]) == (403, "ForbiddenUserError"), (method, reply)
    status, listed = await api.call(alice, "GET", KEYS)
    assert [k["title"] for k in listed["sshKeys"]] == ["desk"]  # bob's tries changed nothing
    status, listed = await api.call(bob, "GET", KEYS)
    assert "desk" not in [k["title"] for k in listed["sshKeys"]]  # /me is bob's own
    status, listed = await api.call(admin, "GET", alices)
    assert status == 200 and [k["value"] for k in listed["sshKeys"]] == [key]
    assert (await api.call(admin, "DELETE", f"{alices}/desk"))[0] == 200
    assert (await api.call(None, "GET", KEYS))[0] == 401
    assert (await api.call(admin, "GET", "/api/v2/users/nobody-here/ssh-keys"))[0] == 404
