"""A finished job's live records leave the buckets once the history holds it
(services/rest/history/expiry.py), on a running platform with a short grace period:

- while rest's projection is paused (rest killed) a finished job's records stay;
- once it runs, pai_jobs and pai_schedule lose the job; the launcher's record stays
  (its logs are still readable) until retention prunes its logs, then goes too;
- GET the job and its config answer as before; resubmitting its name is a 409;
- after every service is killed and started again, nothing comes back and nothing is lost;
- such a job is tagged, and deleted, by its owner (others: 403) as a live one is;
- the projection runs in a process of rest's own, at a lower CPU priority: killed, it
  is started again and the history catches up; it dies with rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import uuid

import psutil
import pytest

from cli.client import ApiError, Client, Connection
from cli.up import Platform
from libs.common import ids
from libs.common.bus import Bus
from libs.common.subjects import Bucket
from services.rest.history import projector
from tests.fixtures.waiting import eventually
from tests.integration.conftest import Api, job_yaml, platform_config

pytestmark = pytest.mark.integration

GRACE = 1.0


@pytest.fixture(scope="module")
def short_lived(tmp_path_factory: pytest.TempPathFactory):
    config = platform_config(tmp_path_factory.mktemp("pai-expiry"), live_finished_job_seconds=GRACE,
                             history_sweep_seconds=0.2, retention_finished_seconds=6.0, retention_sweep_seconds=1.0)
    plat = Platform(config, print_fn=lambda *_: None)
    try:
        conn = plat.start()
        yield Api(plat, conn)
    finally:
        plat.stop()


async def _records(bus: Bus, jid: str) -> set[str]:
    key, there = ids.job_key(jid), set()
    for bucket in (Bucket.JOBS, Bucket.JOB_STATUS, Bucket.SCHEDULE):
        kv = await bus.kv(bucket)
        try:
            entry = await kv.get(key)
        except Exception:  # noqa: BLE001 - missing or deleted: not there
            continue
        if entry.value:
            there.add(bucket.value)
    return there


def _status_of(detail: dict) -> dict:
    keep = ("state", "retries", "attempt", "createdTime", "completedTime", "appExitCode", "virtualCluster", "username")
    return {k: detail["jobStatus"][k] for k in keep} | {"name": detail["name"],
                                                        "tasks": {r: [t["taskState"] for t in v["taskStatuses"]]
                                                                  for r, v in detail["taskRoles"].items()}}


async def test_expired_jobs_leave_the_buckets_only_once_in_the_history_and_read_the_same(short_lived):
    api, plat = short_lived, short_lived.platform
    bus = await Bus.connect(plat.nats.url, name="test-expiry", **plat.nats.login("platform"))
    try:
        # The projection paused: rest down while a job finishes; its records stay.
        early = f"exp-{uuid.uuid4().hex[:6]}"
        early_jid = f"admin~{early}"
        await api.submit(job_yaml(early, ["sleep 2", "echo early-done"]))
        await api.wait_state(early_jid, "RUNNING")
        plat.kill_service("rest", signal.SIGKILL)
        await asyncio.sleep(2 + GRACE + 1.0)
        assert {"pai_jobs", "pai_job_status"} <= await _records(bus, early_jid)
        plat.start_service("rest")

        name = f"exp-{uuid.uuid4().hex[:6]}"
        jid = f"admin~{name}"
        await api.submit(job_yaml(name, ["echo hello-from-expired"]))
        await api.wait_state(jid, "SUCCEEDED")
        before = _status_of(await api.job(jid))
        config_before = await api.client.request("GET", f"/api/v2/jobs/{jid}/config")

        # Past the grace period, with the history holding them: pai_jobs and pai_schedule go;
        # the launcher's record waits for its logs' retention.
        for j in (jid, early_jid):
            left = await eventually(lambda j=j: _only_status(bus, j))
            assert left, f"{j} still has {await _records(bus, j)}"
        assert _status_of(await api.job(jid)) == before
        assert await api.client.request("GET", f"/api/v2/jobs/{jid}/config") == config_before
        assert "hello-from-expired" in await api.logs(jid)
        with pytest.raises(ApiError) as refused:
            await api.submit(job_yaml(name, ["true"]))
        assert refused.value.status == 409 and "already exists" in refused.value.body["message"]

        # Retention prunes the logs: the launcher's record goes then; the job still reads the same.
        assert await eventually(lambda: _none(bus, jid), timeout=30.0), await _records(bus, jid)
        assert _status_of(await api.job(jid)) == before
        assert await api.client.request("GET", f"/api/v2/jobs/{jid}/config") == config_before

        # Every service killed and started again: nothing comes back, nothing is lost.
        for service in ("rest", "scheduler", "launcher"):
            plat.kill_service(service, signal.SIGKILL)
            plat.start_service(service)
        assert await _records(bus, jid) == set()
        assert _status_of(await api.job(jid)) == before
        assert (await api.job(early_jid))["jobStatus"]["state"] == "SUCCEEDED"
        with pytest.raises(ApiError) as refused:
            await api.submit(job_yaml(name, ["true"]))
        assert refused.value.status == 409
        await asyncio.sleep(1.0)
        assert await _records(bus, jid) == set()
    finally:
        await bus.close()


async def _only_status(bus: Bus, jid: str) -> bool:
    return await _records(bus, jid) <= {"pai_job_status"}


async def _none(bus: Bus, jid: str) -> bool:
    return await _records(bus, jid) == set()


async def test_an_expired_job_is_tagged_and_deleted_by_its_owner_from_the_history(short_lived):
    api, plat = short_lived, short_lived.platform
    bus = await Bus.connect(plat.nats.url, name="test-expiry-delete", **plat.nats.login("platform"))
    try:
        name = f"old-{uuid.uuid4().hex[:6]}"
        jid = f"admin~{name}"
        await api.submit(job_yaml(name, ["echo from-an-old-job"]))
        await api.wait_state(jid, "SUCCEEDED")
        assert await eventually(lambda: _only_status(bus, jid)), await _records(bus, jid)  # archived
        made = await api.client.request("POST", "/api/v2/users", json_body={"username": f"st{uuid.uuid4().hex[:6]}"})
        stranger = Client(Connection(url=api.conn.url, token=made["token"]))

        # Tags: its owner changes them in the history; the tag filter finds it; others may not.
        tag = f"t{uuid.uuid4().hex[:6]}"
        for value in (tag, "spare"):
            await api.client.request("PUT", f"/api/v2/jobs/{jid}/tag", json_body={"value": value})
        await api.client.request("DELETE", f"/api/v2/jobs/{jid}/tag", json_body={"value": "spare"})
        assert (await api.job(jid))["tags"] == [tag]
        # Listed from the history once rest's index has found it archived there (its purge
        # from pai_jobs looks like a deletion until then).
        assert await eventually(lambda: _listed_as(api.client, [jid], tags=tag)), await _listed(api.client, tags=tag)
        for method in ("PUT", "DELETE"):
            assert await _answer(stranger, method, f"/api/v2/jobs/{jid}/tag", json_body={"value": tag}) == 403
        assert await _answer(stranger, "DELETE", f"/api/v2/jobs/{jid}") == 403

        # Its owner deletes it: gone from reads, the list, the history and every bucket.
        assert await _answer(api.client, "DELETE", f"/api/v2/jobs/{jid}") == 200
        for path in (f"/api/v2/jobs/{jid}", f"/api/v2/jobs/{jid}/config", f"/api/v2/jobs/{jid}/events"):
            assert await _answer(api.client, "GET", path) == 404, path
        assert await _listed(api.client, tags=tag) == []
        assert jid not in await _listed(api.client, username="admin")
        assert _history_rows(plat, jid) == 0
        assert await eventually(lambda: _none(bus, jid), timeout=10.0), await _records(bus, jid)
        assert await _answer(api.client, "DELETE", f"/api/v2/jobs/{jid}") == 404
        # Its name waits out the event stream's duplicate window, as after a live deletion.
        with pytest.raises(ApiError) as refused:
            await api.submit(job_yaml(name, ["true"]))
        assert refused.value.status == 409 and "can be used again in" in refused.value.body["message"]
    finally:
        await bus.close()


async def _answer(client: Client, method: str, path: str, **kwargs) -> int:
    try:
        await client.request(method, path, **kwargs)
    except ApiError as exc:
        return exc.status
    return 200


async def _listed(client: Client, **params: str) -> list[str]:
    return [row["debugId"] for row in await client.request("GET", "/api/v2/jobs", params=params)]


async def _listed_as(client: Client, expected: list[str], **params: str) -> bool:
    return await _listed(client, **params) == expected


def _history_rows(plat: Platform, jid: str) -> int:
    """The job's rows in every table of the history database (SQLite under rest's data dir)."""
    [path] = list(plat.data.rglob("history.sqlite"))
    with sqlite3.connect(path) as db:
        return sum(db.execute(f"SELECT count(*) FROM {table} WHERE {column} = ?", (jid,)).fetchone()[0]  # noqa: S608
                   for table, column in (("jobs", "id"), ("attempts", "job"), ("tasks", "job"), ("events", "job"),
                                         ("job_tags", "job")))


def _projection_process(rest_pid: int) -> int | None:
    try:
        children = psutil.Process(rest_pid).children()
    except psutil.NoSuchProcess:
        return None
    for child in children:
        with contextlib.suppress(psutil.Error):  # gone meanwhile, or a zombie
            if projector.__name__ in child.cmdline():
                return child.pid
    return None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _niceness(pid: int) -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except OSError:
        return None


async def _now(value):
    return value


def _history_state(plat: Platform, jid: str) -> str | None:
    [path] = list(plat.data.rglob("history.sqlite"))
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT state FROM jobs WHERE id = ?", (jid,)).fetchone()
    return row[0] if row else None


async def test_the_projection_runs_beside_rest_comes_back_when_killed_and_dies_with_rest(short_lived):
    api, plat = short_lived, short_lived.platform
    rest_pid = plat.procs["rest"].pid
    first = await eventually(lambda: _now(_projection_process(rest_pid)))
    assert first, "rest started no history projection process"
    assert await eventually(lambda: _now(_niceness(first) - _niceness(rest_pid) == 10)), (_niceness(first), _niceness(rest_pid))

    # Killed, it is started again, and what finished meanwhile reaches the history.
    os.kill(first, signal.SIGKILL)
    name = f"proj-{uuid.uuid4().hex[:6]}"
    jid = f"admin~{name}"
    await api.submit(job_yaml(name, ["echo projected"]))
    await api.wait_state(jid, "SUCCEEDED")
    second = await eventually(lambda: _now((p := _projection_process(rest_pid)) not in (None, first) and p))
    assert second, "the history projection process was not started again"
    assert await eventually(lambda: _now(_history_state(plat, jid) == "SUCCEEDED")), _history_state(plat, jid)

    # rest killed: its projection goes with it (no orphan keeps writing); rest started again runs a new one.
    plat.kill_service("rest", signal.SIGKILL)
    assert await eventually(lambda: _now(not _alive(second))), "the projection outlived rest"
    plat.start_service("rest")
    assert await eventually(lambda: _now(_projection_process(plat.procs["rest"].pid)))
