"""The marketplace API against a real nats-server (rest in this process): who sees and
changes what (404 for hidden items, 403 for visible ones not one's own, 403 for a review
by a non-admin), approval of public items, stars, compare-and-set, bounds naming their
field, v2 import and export, the built-in templates, and a job made from a template
counted and linked back to it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common import sealing
from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.protocol import limits as L
from libs.common.service import ServiceContext
from services.rest.app import create_app, startup
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
ADMIN, OWNER, MATE, STRANGER = f"mkadmin{RUN}", f"mkowner{RUN}", f"mkmate{RUN}", f"mkstranger{RUN}"
GROUP = f"mkteam{RUN}"
PASSWORD = "market passphrase 1"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "market"
PROTOCOL = ("protocolVersion: 2\nname: demo\ntype: job\nparameters:\n  greeting: hello\n"
            "taskRoles:\n  main:\n    instances: 1\n    commands:\n      - echo <% $parameters.greeting %>\n")
ITEMS = "/api/v2/marketplace/items"


class Api:
    def __init__(self, server: TestServer, session: ClientSession, tokens: dict[str, str]):
        self.server, self.session, self.tokens = server, session, tokens

    async def call(self, who: str, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                   headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
        sent = {"Content-Type": content_type, **(headers or {})}
        if who:
            sent["Authorization"] = f"Bearer {self.tokens[who]}"
        data = body if body is None or isinstance(body, str) else json.dumps(body)
        async with self.session.request(method, self.server.make_url(path), data=data, headers=sent) as resp:
            raw = await resp.text()
            try:
                return resp.status, json.loads(raw), resp.headers.copy()
            except ValueError:
                return resp.status, raw, resp.headers.copy()

    async def ok(self, who: str, method: str, path: str, body: Any = None, **kw) -> Any:
        status, reply, _ = await self.call(who, method, path, body, **kw)
        assert status < 300, (method, path, status, reply)
        return reply

    async def new_item(self, who: str = "owner", **changes) -> dict[str, Any]:
        body = {"name": f"Demo {uuid.uuid4().hex[:4]}", "protocol": PROTOCOL, "tags": ["demo"],
                "category": "training", **changes}
        status, reply, _ = await self.call(who, "POST", ITEMS, body)
        assert status == 201, reply
        return reply


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server  # lists read the whole bucket: no other module's items


@pytest.fixture(scope="module")
async def api(nats_server, tmp_path_factory) -> AsyncIterator[Api]:
    platform = await Bus.connect(nats_server.url, name="market-platform", **nats_server.login("platform"))
    await platform.bootstrap()
    bus = await Bus.connect(nats_server.url, name="market-rest", **nats_server.login("rest"))
    data = tmp_path_factory.mktemp("market")
    sealing.write_key_pair(data / "secrets.key", data / "secrets.pub")
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(data), admin_user=ADMIN,
                         secrets_public_key_file=str(data / "secrets.pub"), rest_rate_limit_burst=1_000_000,
                         rest_rate_limit_per_second=1_000_000.0)
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    await startup(ctx)
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    async with ClientSession() as session:
        a = Api(server, session, {"admin": config.token_path.read_text().strip()})
        await a.ok("admin", "POST", "/api/v2/groups", {"groupname": GROUP})
        for who, name, groups in (("owner", OWNER, ["default", GROUP]), ("mate", MATE, ["default", GROUP]),
                                  ("stranger", STRANGER, ["default"])):
            await a.ok("admin", "POST", "/api/v2/users", {"username": name, "password": PASSWORD, "grouplist": groups})
            login = await a.ok("", "POST", "/api/v2/authn/basic/login", {"username": name, "password": PASSWORD})
            a.tokens[who] = login["token"]
        yield a
    await server.close()
    await bus.close()
    await platform.close()


async def test_private_item_is_absent_to_others_and_theirs_to_change(api):
    item = await api.new_item(visibility="private")
    path = f"{ITEMS}/{item['id']}"
    assert item["owner"] == OWNER and item["approval"] == "none" and item["mayChange"]
    for who in ("mate", "stranger"):
        status, reply, _ = await api.call(who, "GET", path)
        assert (status, reply["code"]) == (404, "NoMarketItemError")
        status, _, _ = await api.call(who, "PUT", path, {"summary": "mine now"})
        assert status == 404
        status, _, _ = await api.call(who, "DELETE", path)
        assert status == 404
        status, _, _ = await api.call(who, "PUT", path + "/star")
        assert status == 404
        listed = await api.ok(who, "GET", ITEMS)
        assert item["id"] not in {i["id"] for i in listed["items"]}
    assert (await api.ok("admin", "GET", path))["id"] == item["id"]
    status, _, _ = await api.call("", "GET", path)
    assert status == 401


async def test_shared_with_a_group_visible_to_members_changed_by_the_owner_alone(api):
    item = await api.new_item(visibility="groups", groups=[GROUP], tags=["shared-demo"])
    path = f"{ITEMS}/{item['id']}"
    seen = await api.ok("mate", "GET", path)
    assert seen["mayChange"] is False and seen["parameters"] == {"greeting": "hello"}
    status, reply, _ = await api.call("mate", "PUT", path, {"summary": "changed"})
    assert (status, reply["code"]) == (403, "ForbiddenUserError")
    status, _, _ = await api.call("mate", "DELETE", path)
    assert status == 403
    status, _, _ = await api.call("stranger", "GET", path)
    assert status == 404
    found = await api.ok("mate", "GET", f"{ITEMS}?tag=shared-demo")
    assert [i["id"] for i in found["items"]] == [item["id"]]
    assert (await api.ok("admin", "PUT", path, {"summary": "an admin may"}))["summary"] == "an admin may"


async def test_public_item_waits_for_an_admin(api):
    item = await api.new_item(visibility="public")
    path = f"{ITEMS}/{item['id']}"
    assert item["approval"] == "pending"
    status, _, _ = await api.call("stranger", "GET", path)
    assert status == 404
    status, reply, _ = await api.call("owner", "POST", path + "/review", {"decision": "approve"})
    assert (status, reply["code"]) == (403, "ForbiddenUserError")
    queue = await api.ok("admin", "GET", f"{ITEMS}?approval=pending")
    assert item["id"] in {i["id"] for i in queue["items"]}
    approved = await api.ok("admin", "POST", path + "/review", {"decision": "approve", "note": "fine"})
    assert (approved["approval"], approved["reviewedBy"]) == ("approved", ADMIN)
    assert (await api.ok("stranger", "GET", path))["approval"] == "approved"
    # its owner changes the template: hidden again until reviewed again
    again = await api.ok("owner", "PUT", path, {"description": "# new"})
    assert again["approval"] == "pending"
    status, _, _ = await api.call("stranger", "GET", path)
    assert status == 404
    rejected = await api.ok("admin", "POST", path + "/review", {"decision": "reject", "note": "say more"})
    assert rejected["approval"] == "rejected" and rejected["reviewNote"] == "say more"
    status, reply, _ = await api.call("admin", "POST", path + "/review", {"decision": "maybe"})
    assert status == 400 and reply["details"]["errors"][0]["path"] == "decision"
    private = await api.new_item()
    status, reply, _ = await api.call("admin", "POST", f"{ITEMS}/{private['id']}/review", {"decision": "approve"})
    assert status == 409


async def test_stars_count_users_once(api):
    item = await api.new_item(visibility="groups", groups=[GROUP])
    star = f"{ITEMS}/{item['id']}/star"
    assert (await api.ok("mate", "PUT", star)) == {"id": item["id"], "starred": True, "stars": 1}
    assert (await api.ok("mate", "PUT", star))["stars"] == 1  # again: still one
    assert (await api.ok("owner", "PUT", star))["stars"] == 2
    mine = await api.ok("mate", "GET", f"{ITEMS}?starred=true")
    assert [i["id"] for i in mine["items"]] == [item["id"]] and mine["items"][0]["starred"]
    assert (await api.ok("mate", "DELETE", star)) == {"id": item["id"], "starred": False, "stars": 1}


async def test_if_match_refuses_a_change_on_an_old_read(api):
    item = await api.new_item()
    path = f"{ITEMS}/{item['id']}"
    _, first, headers = await api.call("owner", "GET", path)
    await api.ok("owner", "PUT", path, {"summary": "one"}, headers={"If-Match": headers["ETag"]})
    status, reply, _ = await api.call("owner", "PUT", path, {"summary": "two"}, headers={"If-Match": headers["ETag"]})
    assert (status, reply["code"]) == (412, "PreconditionFailed")
    assert (await api.ok("owner", "GET", path))["summary"] == "one"


@pytest.mark.parametrize(("body", "path", "words"), [
    ({"name": "x" * (L.MAX_MARKET_NAME_LENGTH + 1)}, "name", str(L.MAX_MARKET_NAME_LENGTH)),
    ({"tags": ["t"] * (L.MAX_MARKET_TAGS + 1)}, "tags", str(L.MAX_MARKET_TAGS)),
    ({"visibility": "everyone"}, "visibility", "everyone"),
    ({"colour": "red"}, "colour", "unknown"),
    ({"protocol": "protocolVersion: 2\nname: bad name\ntype: job\ntaskRoles: {}\n"}, "protocol.name", ""),
])
async def test_refusals_name_the_field(api, body, path, words):
    status, reply, _ = await api.call("owner", "POST", ITEMS, {"name": "ok", "protocol": PROTOCOL, **body})
    assert status == 400, reply
    assert reply["details"]["errors"][0]["path"] == path, reply
    assert words in reply["message"] or words in json.dumps(reply)


async def test_a_body_over_its_limit_is_413(api):
    status, reply, _ = await api.call("owner", "POST", ITEMS, {"name": "big", "description": "d" * L.MAX_MARKET_BODY_BYTES})
    assert status == 413 and str(L.MAX_MARKET_BODY_BYTES) in reply["message"]


async def test_v2_import_and_export(api):
    text = (FIXTURES / "lstm-training.yaml").read_text()
    imported = (await api.call("owner", "POST", "/api/v2/marketplace/import?tag=nlp&category=training", text,
                               content_type="text/yaml"))[1]
    assert imported["kind"] == "template" and imported["tags"] == ["nlp"], imported
    assert imported["descriptionHtml"].startswith("<h1>LSTM training job template</h1>")
    status, exported, headers = await api.call("owner", "GET", f"{ITEMS}/{imported['id']}/export")
    assert status == 200 and headers["Content-Type"].startswith("text/yaml")
    doc = yaml.safe_load(exported)
    assert doc["contributor"] == OWNER and doc["taskRoles"] == yaml.safe_load(text)["taskRoles"]
    again = (await api.call("owner", "POST", "/api/v2/marketplace/import", exported, content_type="text/yaml"))[1]
    for key in ("name", "kind", "description", "protocol", "tags", "category"):
        assert again[key] == imported[key], key
    data = (await api.call("owner", "POST", "/api/v2/marketplace/import",
                           (FIXTURES / "text-dataset.yaml").read_text(), content_type="text/yaml"))[1]
    assert (data["kind"], data["uri"]) == ("data", "/mnt/confignfs/text_data")
    status, reply, _ = await api.call("owner", "POST", "/api/v2/marketplace/import", "name: [", content_type="text/yaml")
    assert status == 400 and reply["details"]["errors"][0]["path"].startswith("file")
    status, _, _ = await api.call("stranger", "GET", f"{ITEMS}/{imported['id']}/export")
    assert status == 404


async def test_builtin_templates_are_there_for_everyone(api):
    listed = await api.ok("stranger", "GET", f"{ITEMS}?kind=template")
    ids = {i["id"] for i in listed["items"] if i["builtin"]}
    assert {"pytorch-ddp", "tensorflow-mnist", "cpu-batch", "hyperparameter-sweep"} <= ids
    assert "pytorch" in listed["tags"]
    sweep = await api.ok("stranger", "POST", f"{ITEMS}/hyperparameter-sweep/render",
                         {"sweep": {"lr": ["0.1", "0.01"], "batch": [32, 64]}})
    assert len(sweep["jobs"]) == 4
    assert {yaml.safe_load(j["config"])["parameters"]["lr"] for j in sweep["jobs"]} == {"0.1", "0.01"}


async def test_a_job_from_a_template_names_it_and_counts(api):
    item = await api.new_item(visibility="groups", groups=[GROUP])
    rendered = await api.ok("mate", "POST", f"{ITEMS}/{item['id']}/render",
                            {"parameters": {"greeting": "changed"}, "name": f"fromtpl{RUN}"})
    (job,) = rendered["jobs"]
    config = yaml.safe_load(job["config"])
    assert config["parameters"]["greeting"] == "changed" and config["extras"]["marketplaceItem"] == item["id"]
    status, reply, _ = await api.call("mate", "POST", "/api/v2/jobs", job["config"], content_type="text/yaml")
    assert status == 202, reply
    assert reply["warnings"] == []  # extras.marketplaceItem is PAI's own: acted on, not reported
    assert (await api.ok("mate", "GET", f"{ITEMS}/{item['id']}"))["submits"] == 1
    kept = await api.ok("mate", "GET", f"/api/v2/jobs/{MATE}~fromtpl{RUN}/config")
    assert kept["extras"]["marketplaceItem"] == item["id"]
    status, reply, _ = await api.call("stranger", "POST", f"{ITEMS}/{item['id']}/render", {})
    assert status == 404


def _pai(api: Api, who: str, *argv: str) -> int:
    from cli.main import main

    return main(["--url", str(api.server.make_url("")).rstrip("/"), "--token", api.tokens[who], *argv])


async def test_cli(api, tmp_path, capsys, monkeypatch):
    for name in ("PAI_URL", "PAI_TOKEN", "PAI_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    template = tmp_path / "job.yaml"
    template.write_text(PROTOCOL)
    tag = f"cli{RUN}"
    assert await asyncio.to_thread(_pai, api, "owner", "market", "create", "--name", "CLI template", "--template",
                                   str(template), "--tag", tag, "--share-with", GROUP, "-o", "name") == 0
    item_id = capsys.readouterr().out.strip()
    assert await asyncio.to_thread(_pai, api, "mate", "market", "list", "--tag", tag, "-o", "name") == 0
    assert capsys.readouterr().out.split() == [item_id]
    assert await asyncio.to_thread(_pai, api, "stranger", "market", "list", "--tag", tag, "-o", "name") == 0
    assert capsys.readouterr().out.split() == []
    assert await asyncio.to_thread(_pai, api, "mate", "market", "star", item_id) == 0
    assert "starred (1 stars)" in capsys.readouterr().out
    assert await asyncio.to_thread(_pai, api, "mate", "market", "use", item_id, "-p", "greeting=from-cli",
                                   "--name", f"cli{RUN}", "-o", "name") == 0
    assert capsys.readouterr().out.split() == [f"{MATE}~cli{RUN}"]
    config = await api.ok("mate", "GET", f"/api/v2/jobs/{MATE}~cli{RUN}/config")
    assert config["parameters"]["greeting"] == "from-cli" and config["extras"]["marketplaceItem"] == item_id
    assert await asyncio.to_thread(_pai, api, "mate", "market", "use", "hyperparameter-sweep", "--sweep",
                                   "lr=0.1,0.2,0.3", "--dry-run") == 0
    assert capsys.readouterr().out.count("marketplaceItem: hyperparameter-sweep") == 3
    assert await asyncio.to_thread(_pai, api, "owner", "market", "export", item_id) == 0
    exported = tmp_path / "item.yaml"
    exported.write_text(capsys.readouterr().out)
    assert await asyncio.to_thread(_pai, api, "owner", "market", "import", str(exported), "--public", "-o", "name") == 0
    copy = capsys.readouterr().out.strip()
    assert (await api.ok("owner", "GET", f"{ITEMS}/{copy}"))["approval"] == "pending"
    assert await asyncio.to_thread(_pai, api, "admin", "market", "approve", copy, "--note", "ok") == 0
    assert f"{copy}: approved" in capsys.readouterr().out
    assert await asyncio.to_thread(_pai, api, "mate", "market", "show", item_id) == 0
    shown = capsys.readouterr().out
    assert "greeting = hello" in shown and "★ 1" in shown


async def test_a_template_refers_to_a_data_item(api):
    template = (await api.call("owner", "POST", "/api/v2/marketplace/import?visibility=groups&group=" + GROUP,
                               (FIXTURES / "lstm-training.yaml").read_text(), content_type="text/yaml"))[1]
    assert template["data"] == {"text_data": ["/mnt/confignfs/text_data"]}
    shared = await api.new_item(kind="data", protocol="", uri="/mnt/team/shared_text", visibility="groups",
                                groups=[GROUP])
    private = await api.new_item(kind="data", protocol="", uri="/mnt/owner/secret_text")
    rendered = await api.ok("mate", "POST", f"{ITEMS}/{template['id']}/render", {"data": {"text_data": shared["id"]}})
    prerequisites = yaml.safe_load(rendered["jobs"][0]["config"])["prerequisites"]
    assert [p["uri"] for p in prerequisites if p["type"] == "data"] == [["/mnt/team/shared_text"]]
    status, reply, _ = await api.call("mate", "POST", f"{ITEMS}/{template['id']}/render",
                                      {"data": {"text_data": private["id"]}})
    assert (status, reply["code"]) == (404, "NoMarketItemError")  # not shared with him: not there
    status, reply, _ = await api.call("mate", "POST", f"{ITEMS}/{template['id']}/render",
                                      {"data": {"nothing": shared["id"]}})
    assert status == 400 and reply["details"]["errors"][0]["path"] == "data.nothing"


async def test_delete_takes_the_item_and_its_stars(api):
    item = await api.new_item(visibility="groups", groups=[GROUP])
    path = f"{ITEMS}/{item['id']}"
    await api.ok("mate", "PUT", path + "/star")
    await api.ok("owner", "DELETE", path)
    for who in ("owner", "mate", "admin"):
        status, _, _ = await api.call(who, "GET", path)
        assert status == 404
    again = await api.new_item(visibility="groups", groups=[GROUP])
    await api.ok("admin", "DELETE", f"{ITEMS}/{again['id']}")  # an admin may delete anyone's
    mine = await api.ok("mate", "GET", f"{ITEMS}?starred=true")
    assert item["id"] not in {i["id"] for i in mine["items"]}


async def test_the_etag_of_a_create_is_its_revision(api):
    status, item, headers = await api.call("owner", "POST", ITEMS, {"name": "etag", "protocol": PROTOCOL})
    assert status == 201
    assert headers["ETag"] == f'"{item["revision"]}"'
    changed = await api.ok("owner", "PUT", f"{ITEMS}/{item['id']}", {"summary": "s"},
                           headers={"If-Match": headers["ETag"]})
    assert changed["revision"] > item["revision"]
