"""A log longer than one NATS message, read whole through rest: a real local-backend
task writes 2 MiB, the launcher serves its log on the bus, and GET .../logs (whole,
its tail, and followed) gives every byte back in order. One reply of the launcher
is at most 1 MiB (nats-server's max_payload), so this is read in chunks."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientSession

from libs.common.bus import Bus
from libs.common.logs import LOG_CHUNK_BYTES
from libs.common.messages import JobState, TaskPlacement
from libs.common.protocol.model import JobSpec, Resources, TaskRole
from services.launcher.core import Placed, Submitted
from services.rest import auth
from tests.component.rest_replica import Rest
from tests.component.test_retention import Launcher

RUN = uuid.uuid4().hex[:6]
LINE = b"abcdefghijklmnopqrstuvwxyz0123456789\n"
SIZE = 2 * 1024 * 1024
EXPECTED = (LINE * (SIZE // len(LINE) + 1))[:SIZE]
# `yes` repeats the line; `head -c` keeps exactly SIZE bytes of it.
COMMAND = f"yes {LINE.decode().strip()} | head -c {SIZE}"


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    return own_nats_server


@pytest.fixture
async def launcher_bus(nats_server) -> AsyncIterator[Bus]:
    admin = await Bus.connect(nats_server.url, name="test-admin", **nats_server.login("platform"))
    await admin.bootstrap()
    await admin.close()
    bus = await Bus.connect(nats_server.url, name="launcher", **nats_server.login("launcher"))
    yield bus
    await bus.close()


async def test_a_2_mib_log_is_read_whole_byte_for_byte(nats_server, launcher_bus, tmp_path):
    assert SIZE > 2 * LOG_CHUNK_BYTES  # several chunks, and more than one NATS message could hold
    user = f"lena{RUN}"
    job = f"{user}~big"
    launcher = Launcher(launcher_bus, tmp_path / "launcher")
    await launcher.start()
    try:
        async with Rest(nats_server, tmp_path / "rest") as rest:
            token = await auth.create_user(rest.bus, user)
            status, body = await rest.submit(token, "big")  # the record rest reads the owner from
            assert status == 202, body
            await launcher.shell.serve_logs()
            # The launcher runs the job with the command that writes the log (rest's record says "echo hi").
            big = JobSpec(name="big", user=user, virtualCluster="default", taskRoles=[TaskRole(
                name="main", instances=1, commands=[COMMAND], resources=Resources(gpu=0, cpu=1, memoryMB=256))])
            await launcher.shell._apply(Submitted(job=job, spec=big, at=time.time(), id=f"{job}/submitted"))
            await launcher.shell._apply(Placed(job=job, attempt=1, id=f"{job}/1/placed", tasks=[
                TaskPlacement(role="main", index=0, node=launcher.backend.node_names[0])]))
            await launcher.until_state(job, JobState.SUCCEEDED)

            headers = {"Authorization": f"Bearer {token}"}
            url = rest.server.make_url(f"/api/v2/jobs/{job}/logs")
            async with ClientSession(headers=headers) as session:
                async with session.get(url) as resp:
                    assert resp.status == 200, await resp.text()
                    whole = await resp.read()
                assert len(whole) == SIZE and whole == EXPECTED
                async with session.get(url, params={"tailBytes": str(1_500_000)}) as resp:
                    assert resp.status == 200
                    assert await resp.read() == EXPECTED[-1_500_000:]
                async with session.get(url, params={"follow": "true"}) as resp:
                    assert resp.status == 200
                    assert await resp.read() == EXPECTED
    finally:
        await launcher.close()

