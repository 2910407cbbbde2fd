"""Deleting a finished job through the API on a running platform: refused while it
runs (409 naming its state) and to anyone but its owner or an admin (403); once
finished, every service removes its records (pai_jobs, pai_job_status,
pai_schedule) and the launcher its task files and logs."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from cli.client import ApiError, Client, Connection
from libs.common import ids
from libs.common.bus import Bus
from libs.common.subjects import Bucket
from tests.integration.conftest import FINAL, job_yaml

pytestmark = pytest.mark.integration


async def _status(platform, method: str, path: str, client: Client | None = None, **kwargs) -> tuple[int, dict]:
    try:
        return 200, await (client or platform.client).request(method, path, **kwargs)
    except ApiError as exc:
        return exc.status, exc.body


def _task_files(platform, slug_prefix: str) -> list:
    return [p for p in (platform.platform.data / "launcher").rglob(f"{slug_prefix}*")]


async def test_a_finished_job_is_deleted_everywhere_by_its_owner_or_an_admin_only(platform):
    name = f"del-{uuid.uuid4().hex[:6]}"
    jid = f"admin~{name}"
    await platform.submit(job_yaml(name, ["echo from-the-deleted-job", "sleep 30"]))
    status, body = await _status(platform, "DELETE", f"/api/v2/jobs/{jid}")  # not finished yet
    assert status == 409 and "stop it first" in body["message"], body
    assert body["details"]["state"] in ("WAITING", "RUNNING") and body["details"]["state"] in body["message"]
    # Stopped once its task runs: stopped while it waits, it would never have had files to delete.
    await platform.wait_state(jid, "RUNNING")
    await platform.stop(jid)
    await platform.wait_state(jid, FINAL)
    assert _task_files(platform, f"admin.{name}."), "the launcher keeps the task's files until the job is deleted"

    other = f"other{uuid.uuid4().hex[:6]}"
    made = await platform.client.request("POST", "/api/v2/users", json_body={"username": other})
    stranger = Client(Connection(url=platform.conn.url, token=made["token"]))
    status, body = await _status(platform, "DELETE", f"/api/v2/jobs/{jid}", client=stranger)
    assert status == 403, body

    status, body = await _status(platform, "DELETE", f"/api/v2/jobs/{jid}")
    assert status == 200, body
    assert (await _status(platform, "GET", f"/api/v2/jobs/{jid}"))[0] == 404
    listed = await platform.client.request("GET", "/api/v2/jobs", params={"username": "admin"})
    assert jid not in [row["debugId"] for row in listed]
    # Every owner removes its own records, driven by the job.deleted event.
    nats = platform.platform.nats
    bus = await Bus.connect(nats.url, name="test-delete", **nats.login("platform"))
    try:
        key = ids.job_key(jid)
        left: list = []
        for _ in range(100):
            left = [bucket for bucket in (Bucket.JOBS, Bucket.JOB_STATUS, Bucket.SCHEDULE)
                    if await _has(bus, bucket, key)]
            files = _task_files(platform, f"admin.{name}.")
            if not left and not files:
                break
            await asyncio.sleep(0.1)
        assert not left, f"{jid} still has records in {left}"
        assert not _task_files(platform, f"admin.{name}."), "its task files and logs are removed"
    finally:
        await bus.close()
    # Deleting again: it is gone. Its name waits out the event stream's duplicate window.
    assert (await _status(platform, "DELETE", f"/api/v2/jobs/{jid}"))[0] == 404
    status, body = await _status(platform, "POST", "/api/v2/jobs", data=job_yaml(name, ["true"]).encode(),
                                 content_type="text/yaml")
    assert status == 409 and "can be used again in" in body["message"], body


async def _has(bus: Bus, bucket: Bucket, key: str) -> bool:
    kv = await bus.kv(bucket)
    try:
        entry = await kv.get(key)
    except Exception:  # noqa: BLE001 - not found, deleted or purged
        return False
    return bool(entry.value)
