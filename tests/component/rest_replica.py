"""One rest replica on a test server, and what the intake tests read back from
NATS (tests/component/test_intake_crash.py, test_faults_rest_publish.py)."""

from __future__ import annotations

import json

import msgspec
import nats.errors
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common import ids
from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.service import ServiceContext
from libs.common.subjects import STREAM, Bucket
from services.rest import intake, jobs_api
from services.rest.app import create_app
from services.rest.records import SubmittedJob
from tests.fixtures.settings import IN_PROCESS_ENV


class Rest:
    """One rest process: its own NATS connection and app, served on a test server.

    `published` counts the events it saw stored, by every path intake takes (a
    submission's batch, the sweep's single publish). The fault tests break writes
    at `bus.nc.publish`, where every JetStream write of this process leaves
    (`fail_at_send`), so the batch path and the retries meet the same fault."""

    def __init__(self, nats_server, tmp_path):
        self.nats_server, self.tmp_path = nats_server, tmp_path
        self.published: list[str] = []  # ids of the events this rest published

    async def __aenter__(self) -> Rest:
        self.bus = await Bus.connect(self.nats_server.url, name="rest", **self.nats_server.login("rest"))
        real_publish = self.bus.publish

        async def counted(event, **kwargs):
            await real_publish(event, **kwargs)
            self.published.append(event.id)

        real_publish_each = self.bus.publish_each

        async def counted_each(events, **kwargs):
            failures = await real_publish_each(events, **kwargs)
            self.published.extend(event.id for event, failed in zip(events, failures, strict=True) if failed is None)
            return failures

        self.bus.publish = counted
        self.bus.publish_each = counted_each
        config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(self.tmp_path))
        self.ctx = ServiceContext(name="rest", config=config, bus=self.bus)
        self.server = TestServer(await create_app(self.ctx))
        await self.server.start_server()
        self.ctx.set_ready()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.server.close()
        await self.bus.close()

    async def submit(self, token: str, name: str) -> tuple[int, dict]:
        async with ClientSession() as session, session.post(
            self.server.make_url("/api/v2/jobs"), data=job_body(name),
            headers={"Content-Type": "text/yaml", "Authorization": f"Bearer {token}"},
        ) as resp:
            return resp.status, json.loads(await resp.read())

    @property
    def intake(self) -> intake.Intake:
        return self.server.app[jobs_api.INTAKE]


def job_body(name: str) -> bytes:
    return (f"protocolVersion: 2\nname: {name}\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n"
            f"    commands:\n      - echo hi\n").encode()


async def record_of(bus: Bus, job: str) -> SubmittedJob | None:
    try:
        entry = await (await bus.kv(Bucket.JOBS)).get(ids.job_key(job))
    except Exception:  # noqa: BLE001 - not found, whichever way nats-py says it
        return None
    return msgspec.json.decode(entry.value, type=SubmittedJob)


async def stored_ids(bus: Bus, subject: str) -> list[str]:
    """The Nats-Msg-Id of every message the event stream holds on `subject`."""
    found = []
    sub = await bus.js.subscribe(subject, stream=STREAM, ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except nats.errors.TimeoutError:
                return found
            found.append(msg.headers["Nats-Msg-Id"])
    finally:
        await sub.unsubscribe()


def fail_at_send(rest: Rest, fault):
    """Route every message `rest` sends through `fault(subject, send)`, where `send()`
    sends it for real; returns a function that restores the real send. `fault`
    may raise (the message never leaves), send and then raise, or just send."""
    nc = rest.bus.nc
    real_publish = nc.publish

    async def publish(subject, payload=b"", *args, **kwargs):
        return await fault(subject, lambda: real_publish(subject, payload, *args, **kwargs))

    nc.publish = publish  # an instance attribute: nats-py's own requests call self.publish too

    def restore() -> None:
        del nc.publish

    return restore
