"""A job's commands cannot reach the bus: the platform's NATS refuses a task that
connects without credentials, tasks get none, and the admin token stays the only admin."""

from __future__ import annotations

import hashlib
import json
import stat
from urllib.parse import urlsplit

import nats.js.errors
import pytest

from cli.client import ApiError, Client, Connection
from libs.common.bus import Bus
from libs.common.subjects import Bucket
from tests.integration.conftest import job_yaml

FORGED_TOKEN = "forged-admin-token-from-a-task"

# What a job could run: the NATS protocol by hand (no client library needed), first
# without credentials, then with a guessed password, then a made-up nkey, each time writing
# token.<sha256> = admin into pai_users; then what PAI_NATS_* it was given.
PROBE = """
import json, os, socket, sys
host, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def attempt(login):
    with socket.create_connection((host, port), timeout=5) as s:
        f = s.makefile("rb")
        f.readline()  # INFO
        connect = dict(verbose=False, pedantic=False, **login)
        s.sendall(b"CONNECT " + json.dumps(connect).encode()
                  + b"\\r\\nPUB $KV.pai_users." + key.encode() + b" 5\\r\\nadmin\\r\\nPING\\r\\n")
        return f.readline().decode().strip()
print("ANONYMOUS", attempt({}))
print("GUESSED", attempt({"user": "platform", "pass": "platform"}))
print("FORGEDKEY", attempt({"nkey": "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4", "sig": "AAAA"}))
print("NATSENV", sorted(k for k in os.environ if k.startswith("PAI_NATS")) or "none")
"""


async def test_a_task_cannot_write_pai_users_nor_become_admin(platform):
    url = urlsplit(platform.platform.config.nats_url)
    key = "token." + hashlib.sha256(FORGED_TOKEN.encode()).hexdigest()
    name = "bus-probe"
    command = f"python3 -c '{PROBE}' {url.hostname} {url.port} {key}"
    await platform.submit(job_yaml(name, [command]))
    detail = await platform.wait_state(f"admin~{name}", "SUCCEEDED", timeout=60)
    assert detail["jobStatus"]["state"] == "SUCCEEDED"
    output = await platform.logs(f"admin~{name}", taskRole="main", taskIndex=0)

    assert "ANONYMOUS -ERR 'Authorization Violation'" in output, output
    assert "GUESSED -ERR 'Authorization Violation'" in output, output
    assert "FORGEDKEY -ERR 'Authorization Violation'" in output, output
    assert "NATSENV none" in output, output

    with pytest.raises(ApiError) as refused:
        await Client(Connection(url=platform.conn.url, token=FORGED_TOKEN)).request("GET", "/api/v2/users/me")
    assert refused.value.status == 401
    me = await platform.client.request("GET", "/api/v2/users/me")
    assert me["admin"] is True

    # Read back as the platform: nothing was written, and only the admin is admin.
    server = platform.platform.nats
    bus = await Bus.connect(server.url, name="bus-security-test", **server.login("platform"))
    try:
        users = await bus.kv(Bucket.USERS)
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await users.get(key)
        admins = []
        for k in await users.keys():
            if k.startswith("user."):
                entry = await users.get(k)
                # Admin as OpenPAI: a member of the admin group (or, in records
                # older than groups, a user flagged admin).
                record = json.loads(entry.value) if entry.value else {}
                if "admin" in record.get("grouplist", []) or record.get("admin") is True:
                    admins.append(k)
        assert admins == ["user.admin"]
    finally:
        await bus.close()


def test_the_bus_credentials_are_the_platforms_alone(platform):
    data = platform.platform.data
    assert stat.S_IMODE(data.stat().st_mode) & 0o044 == 0, "others may list the data dir"
    for name in ("nats-credentials.json", "nats-server.conf"):
        assert stat.S_IMODE((data / name).stat().st_mode) == 0o600
