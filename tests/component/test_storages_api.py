"""OpenPAI's storages through rest's HTTP API, against a real nats-server: admins declare
storages (the API, or storages_file at start) and grant them to groups; a user lists and
reads what their groups grant; a job's teamwise_storage plugin gets the declarations it
names, refused at submission with 403 (not granted) or 404 (not declared), naming it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
import yaml
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common import ids
from libs.common.bus import Bus, get_json
from libs.common.config import load_config
from libs.common.schedule import CLUSTER_VCS_KEY, ClusterView
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest.app import create_app, startup
from services.rest.records import SubmittedJob
from tests.component.test_identity import RUN, Api, unique
from tests.fixtures.settings import IN_PROCESS_ENV

ADMIN = f"storeadmin{RUN}"
FILED = f"filed{RUN}"


@pytest.fixture(scope="module")
async def setup(nats_server, tmp_path_factory) -> AsyncIterator[tuple[Api, str, Bus]]:
    platform = await Bus.connect(nats_server.url, name="storages-platform", **nats_server.login("platform"))
    await platform.bootstrap()
    view = ClusterView(virtualClusters=[{"name": "default"}])
    await (await platform.kv(Bucket.CLUSTER)).put(CLUSTER_VCS_KEY, msgspec.json.encode(view))
    bus = await Bus.connect(nats_server.url, name="storages-rest", **nats_server.login("rest"))
    data = tmp_path_factory.mktemp("storages")
    storages_file = data / "storages.yaml"
    storages_file.write_text(yaml.safe_dump({"storages": [
        {"name": FILED, "type": "nfs", "data": {"server": "nfs.example", "path": "/export/data"},
         "mountOptions": ["vers=4"]}]}))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(data), admin_user=ADMIN,
                         storages_file=str(storages_file))
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    await startup(ctx)
    admin_token = config.token_path.read_text().strip()
    server = TestServer(await create_app(ctx))
    await server.start_server()
    ctx.set_ready()
    async with ClientSession() as session:
        yield Api(server, session), admin_token, platform
    await server.close()
    await bus.close()
    await platform.close()


async def declare(api: Api, admin: str, name: str, **fields) -> dict:
    body = {"type": "hostPath", "data": {"path": f"/srv/pai-storage/{name}"}, **fields}
    status, answer = await api.call(admin, "PUT", f"/api/v2/storages/{name}", body)
    assert status in (200, 201), answer
    return answer


async def member_of_group_granting(api: Api, admin: str, *storages: str) -> str:
    group = unique("team")
    status, _ = await api.call(admin, "POST", "/api/v2/groups", {
        "groupname": group, "extension": {"acls": {"virtualClusters": ["default"], "storageConfigs": list(storages)}}})
    assert status == 201
    return await api.login(await api.new_user(admin, grouplist=["default", group]))


def job_yaml(name: str, storages: list[str] | None) -> str:
    doc: dict = {"protocolVersion": 2, "name": name, "type": "job",
                 "taskRoles": {"main": {"instances": 1, "commands": ["ls /mnt"]}}}
    if storages is not None:
        doc["extras"] = {"com.microsoft.pai.runtimeplugin": [
            {"plugin": "teamwise_storage", "parameters": {"storageConfigNames": storages}}]}
    return yaml.safe_dump(doc)


async def test_a_user_lists_and_reads_only_what_their_groups_grant(setup):
    api, admin, _ = setup
    mine, theirs = unique("mine"), unique("theirs")
    created = await declare(api, admin, mine, default=True)
    assert created["type"] == "hostPath" and created["mountPath"] == f"/mnt/{mine}"
    await declare(api, admin, theirs)
    token = await member_of_group_granting(api, admin, mine)

    status, listed = await api.call(token, "GET", "/api/v2/storages")
    assert status == 200
    assert [s["name"] for s in listed["storages"]] == [mine]
    assert listed["storages"][0] | {"name": "x"} == {"name": "x", "share": True, "volumeName": mine, "default": True,
                                                     "type": "hostPath", "mountPath": f"/mnt/{mine}", "readOnly": False}
    status, one = await api.call(token, "GET", f"/api/v2/storages/{mine}")
    assert status == 200 and one["data"] == {"path": f"/srv/pai-storage/{mine}"}
    status, refused = await api.call(token, "GET", f"/api/v2/storages/{theirs}")
    assert (status, refused["code"]) == (403, "ForbiddenUserError") and theirs in refused["message"]
    status, missing = await api.call(token, "GET", "/api/v2/storages/nosuchstorage")
    assert (status, missing["code"]) == (404, "NoStorageError")

    status, everything = await api.call(admin, "GET", "/api/v2/storages")
    assert {mine, theirs, FILED} <= {s["name"] for s in everything["storages"]}


async def test_openpais_deprecated_storage_config_and_server_routes_read_the_same_declarations(setup):
    api, admin, _ = setup
    mine, theirs = unique("oldmine"), unique("oldtheirs")
    await declare(api, admin, mine, default=True, readOnly=True, mountPath=f"/mnt/data/{mine}")
    await declare(api, admin, theirs)
    token = await member_of_group_granting(api, admin, mine, FILED)

    config = {"name": mine, "default": True, "servers": [mine], "mountInfos": [
        {"mountPoint": f"/mnt/data/{mine}", "path": "", "server": mine, "permission": "ro"}]}
    status, one = await api.call(token, "GET", f"/api/v2/storage/config/{mine}")
    assert (status, one) == (200, config)
    status, listed = await api.call(token, "GET", "/api/v2/storage/config")
    assert status == 200 and sorted(c["name"] for c in listed) == sorted([mine, FILED])
    assert next(c for c in listed if c["name"] == mine) == config
    status, picked = await api.call(token, "GET", f"/api/v2/storage/config?names={FILED}")
    assert status == 200 and [c["name"] for c in picked] == [FILED]

    status, server = await api.call(token, "GET", f"/api/v2/storage/server/{mine}")
    assert (status, server) == (200, {"spn": mine, "type": "hostpath", "data": {"path": f"/srv/pai-storage/{mine}"},
                                      "extension": {}})
    status, nfs = await api.call(token, "GET", f"/api/v2/storage/server/{FILED}")
    assert (status, nfs) == (200, {"spn": FILED, "type": "nfs", "data": {"address": "nfs.example",
                                                                         "rootPath": "/export/data"}, "extension": {}})
    status, servers = await api.call(token, "GET", "/api/v2/storage/server")
    assert status == 200 and sorted(s["spn"] for s in servers) == sorted([mine, FILED])

    for kind in ("config", "server"):
        status, refused = await api.call(token, "GET", f"/api/v2/storage/{kind}/{theirs}")
        assert (status, refused["code"]) == (403, "ForbiddenUserError") and theirs in refused["message"]
        status, missing = await api.call(token, "GET", f"/api/v2/storage/{kind}/nosuchstorage")
        assert (status, missing["code"]) == (404, "NoStorageError")
        status, everything = await api.call(admin, "GET", f"/api/v2/storage/{kind}")
        assert {mine, theirs, FILED} <= {c.get("name", c.get("spn")) for c in everything}


async def test_storages_file_declares_at_start(setup):
    api, admin, _ = setup
    status, filed = await api.call(admin, "GET", f"/api/v2/storages/{FILED}")
    assert status == 200
    assert (filed["type"], filed["data"], filed["mountOptions"]) == (
        "nfs", {"server": "nfs.example", "path": "/export/data"}, ["vers=4"])


async def test_only_admins_declare_and_a_bad_declaration_is_400_naming_the_field(setup):
    api, admin, _ = setup
    token = await member_of_group_granting(api, admin)
    name = unique("s")
    status, body = await api.call(token, "PUT", f"/api/v2/storages/{name}", {"type": "hostPath", "data": {"path": "/x"}})
    assert status == 403, body
    status, body = await api.call(admin, "PUT", f"/api/v2/storages/{name}",
                                  {"type": "hostPath", "data": {"path": "/x"}, "mountPath": "/proc/x"})
    assert status == 400 and body["details"]["errors"][0]["path"] == "mountPath"
    status, body = await api.call(admin, "PUT", f"/api/v2/storages/{name}", {"type": "s3"})
    assert status == 400, body
    await declare(api, admin, name)
    assert (await api.call(admin, "PUT", f"/api/v2/storages/{name}",
                           {"type": "hostPath", "data": {"path": "/y"}}))[0] == 200  # changed
    assert (await api.call(admin, "DELETE", f"/api/v2/storages/{name}"))[0] == 200
    assert (await api.call(admin, "GET", f"/api/v2/storages/{name}"))[0] == 404


async def test_a_job_gets_the_declarations_of_the_storages_it_names(setup):
    api, admin, platform = setup
    data, ckpt = unique("data"), unique("ckpt")
    await declare(api, admin, data, readOnly=True)
    await declare(api, admin, ckpt, mountPath="/checkpoints")
    token = await member_of_group_granting(api, admin, data, ckpt)
    name = unique("j")

    status, body = await api.call(token, "POST", "/api/v2/jobs", job_yaml(name, [data, ckpt]), "text/yaml")

    assert status == 202, body
    stored = await get_json(await platform.kv(Bucket.JOBS), ids.job_key(body["job"]), SubmittedJob)
    assert stored is not None
    spec = stored[0].spec
    assert [(s.name, s.readOnly, s.mountPath) for s in spec.storages] == [(data, True, ""), (ckpt, False, "/checkpoints")]


async def test_a_storage_not_granted_is_403_and_an_unknown_one_404_each_named_and_nothing_stored(setup):
    api, admin, _ = setup
    granted, other = unique("ok"), unique("other")
    await declare(api, admin, granted)
    await declare(api, admin, other)
    token = await member_of_group_granting(api, admin, granted)

    status, body = await api.call(token, "POST", "/api/v2/jobs", job_yaml(unique("j"), [granted, other]), "text/yaml")
    assert (status, body["code"]) == (403, "ForbiddenUserError"), body
    assert repr(other) in body["message"] and body["details"]["errors"][0]["storage"] == other

    status, body = await api.call(token, "POST", "/api/v2/jobs", job_yaml(unique("j"), ["nosuchstorage"]), "text/yaml")
    assert (status, body["code"]) == (404, "NoStorageError"), body
    assert "'nosuchstorage'" in body["message"]


async def test_the_plugin_naming_none_mounts_the_granted_default_storages(setup):
    api, admin, platform = setup
    default, plain = unique("dflt"), unique("plain")
    await declare(api, admin, default, default=True)
    await declare(api, admin, plain)
    token = await member_of_group_granting(api, admin, default, plain)
    name = unique("j")
    status, body = await api.call(token, "POST", "/api/v2/jobs", job_yaml(name, []), "text/yaml")
    assert status == 202, body
    stored = await get_json(await platform.kv(Bucket.JOBS), ids.job_key(body["job"]), SubmittedJob)
    assert stored is not None and [s.name for s in stored[0].spec.storages] == [default]


async def test_openpais_extras_storages_mount_where_the_job_says_and_are_granted_alike(setup):
    api, admin, platform = setup
    team, other = unique("team"), unique("other")
    await declare(api, admin, team)
    await declare(api, admin, other)
    token = await member_of_group_granting(api, admin, team)
    name = unique("j")
    doc = yaml.safe_load(job_yaml(name, None))
    doc["extras"] = {"storages": [{"name": team, "mountPath": "/data/team", "share": False}]}
    status, body = await api.call(token, "POST", "/api/v2/jobs", yaml.safe_dump(doc), "text/yaml")
    assert status == 202, body
    stored = await get_json(await platform.kv(Bucket.JOBS), ids.job_key(body["job"]), SubmittedJob)
    assert stored is not None
    [storage] = stored[0].spec.storages
    assert (storage.name, storage.mountPath, storage.subPath) == (team, "/data/team", body["job"].split("~")[0])

    doc["name"] = unique("j")
    doc["extras"] = {"storages": [{"name": other}]}
    status, body = await api.call(token, "POST", "/api/v2/jobs", yaml.safe_dump(doc), "text/yaml")
    assert (status, body["details"]["errors"][0]["path"]) == (403, "extras.storages"), body
