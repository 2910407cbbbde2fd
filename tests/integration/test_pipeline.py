"""The walking skeleton end to end: jobs over HTTP through every service, real processes."""

from __future__ import annotations

import uuid

import psutil
import pytest

from cli.client import ApiError
from tests.integration.conftest import job_yaml, written

pytestmark = pytest.mark.integration


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def test_job_that_writes_a_file_succeeds_and_the_file_exists(platform, tmp_path):
    target = tmp_path / "out.txt"
    name = unique("write")
    await platform.submit(job_yaml(name, [f"echo written-by-pai > {target}"]))
    detail = await platform.wait_state(f"admin~{name}", "SUCCEEDED")
    assert target.read_text() == "written-by-pai\n"
    task = detail["taskRoles"]["main"]["taskStatuses"][0]
    assert task["taskState"] == "SUCCEEDED" and task["containerExitCode"] == 0
    assert task["containerDetail"].startswith("limits: ")  # which bounds were in force


async def test_failing_command_ends_failed_with_exit_code_and_phrase(platform):
    name = unique("fail")
    await platform.submit(job_yaml(name, ["echo about to fail", "exit 3"]))
    detail = await platform.wait_state(f"admin~{name}", "FAILED")
    status = detail["jobStatus"]
    assert status["appExitCode"] == 3
    assert status["appExitSpec"]["phrase"]
    assert status["appExitTriggerTaskRoleName"] == "main"
    assert detail["taskRoles"]["main"]["taskStatuses"][0]["containerExitCode"] == 3


async def test_command_not_found_is_explained(platform):
    name = unique("nocmd")
    await platform.submit(job_yaml(name, ["surely-not-a-command-pai --version"]))
    detail = await platform.wait_state(f"admin~{name}", "FAILED")
    status = detail["jobStatus"]
    assert status["appExitCode"] == 127
    reason = status["appExitSpec"]["reason"].lower()
    assert "command" in reason and "find" in reason
    assert status["appExitSpec"]["solution"]


async def test_stopped_sleep_job_ends_stopped_and_leaves_no_process(platform, tmp_path):
    pidfile = tmp_path / "pid"
    name = unique("sleep")
    jid = f"admin~{name}"
    # A child that ignores SIGTERM as well: the stop must still end it.
    await platform.submit(job_yaml(name, [f"(trap '' TERM; exec sleep 600) & echo $! > {pidfile}; sleep 600"]))
    await platform.wait_state(jid, "RUNNING")
    child = int(await written(pidfile))
    assert psutil.pid_exists(child)
    await platform.stop(jid)
    detail = await platform.wait_state(jid, "STOPPED", timeout=30)
    assert detail["jobStatus"]["executionType"] == "STOP"
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    marker = f"admin.{name}."
    leftovers = [p.pid for p in psutil.process_iter(["environ"])
                 if marker in ((p.info.get("environ") or {}).get("PAI_TASK_KEY", ""))]
    assert leftovers == []


async def test_two_roles_three_instances_see_their_pai_environment(platform, tmp_path):
    name = unique("env")
    jid = f"admin~{name}"
    dump = (f"env | grep -E '^(PAI_|CUDA_VISIBLE_DEVICES)' | sort > "
            f"{tmp_path}/$PAI_CURRENT_TASK_ROLE_NAME-$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX.env")
    await platform.submit(job_yaml(name, [dump], roles={"ps": 1, "worker": 3}))
    await platform.wait_state(jid, "SUCCEEDED")
    envs = {}
    for path in tmp_path.glob("*.env"):
        envs[path.stem] = dict(line.split("=", 1) for line in path.read_text().splitlines())
    assert sorted(envs) == ["ps-0", "worker-0", "worker-1", "worker-2"]
    for key, env in envs.items():
        role, index = key.split("-")
        assert env["PAI_JOB_NAME"].endswith(name)
        assert env["PAI_USER_NAME"] == "admin"
        assert env["PAI_VIRTUAL_CLUSTER"] == "default"
        assert env["PAI_TASK_ROLE_LIST"] == "ps,worker"
        assert env["PAI_TASK_ROLE_TASK_COUNT_ps"] == "1"
        assert env["PAI_TASK_ROLE_TASK_COUNT_worker"] == "3"
        assert env["PAI_CURRENT_TASK_ROLE_NAME"] == role
        assert env["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"] == index
        assert len(env["PAI_TASK_ROLE_worker_HOST_LIST"].split(",")) == 3
        assert len(env["PAI_TASK_ROLE_ps_HOST_LIST"].split(",")) == 1
        for i in range(3):
            assert env[f"PAI_HOST_IP_worker_{i}"]
        assert env["CUDA_VISIBLE_DEVICES"] == ""  # no GPU asked for: none visible
    assert len({tuple(sorted(e.items())) for e in envs.values()}) == 4


async def test_duplicate_name_is_409(platform):
    name = unique("dup")
    await platform.submit(job_yaml(name, ["true"]))
    with pytest.raises(ApiError) as err:
        await platform.submit(job_yaml(name, ["true"]))
    assert err.value.status == 409
    assert f"admin~{name}" in err.value.body["message"]


async def test_syntax_error_with_retries_fails_after_one_attempt(platform):
    name = unique("syntax")
    jid = f"admin~{name}"
    await platform.submit(job_yaml(name, ["python3 -c 'print(\"unclosed'"], retry=3))
    detail = await platform.wait_state(jid, "FAILED")
    assert detail["jobStatus"]["retries"] == 0
    assert detail["jobStatus"]["attempt"] == 1
    assert detail["jobStatus"]["appExitSpec"]["reaction"] == "NEVER_RETRY"
    attempts = await platform.client.request("GET", f"/api/v2/jobs/{jid}/job-attempts")
    assert len(attempts) == 1


async def test_bad_job_is_400_naming_the_field(platform):
    body = job_yaml(unique("bad"), ["true"]).replace("instances: 1", "instances: 0")
    with pytest.raises(ApiError) as err:
        await platform.submit(body)
    assert err.value.status == 400
    paths = [e["path"] for e in err.value.body["errors"]]
    assert "taskRoles.main.instances" in paths


async def test_body_over_one_mib_is_413(platform):
    body = job_yaml(unique("big"), ["true"]) + "# " + "x" * (1024 * 1024) + "\n"
    with pytest.raises(ApiError) as err:
        await platform.submit(body)
    assert err.value.status == 413


async def test_missing_or_wrong_token_is_401(platform):
    from cli.client import Client, Connection

    for token in ("", "not-a-token"):
        client = Client(Connection(url=platform.conn.url, token=token))
        with pytest.raises(ApiError) as err:
            await client.request("GET", "/api/v2/jobs")
        assert err.value.status == 401


async def test_list_filters_and_logs(platform):
    name = unique("listed")
    jid = f"admin~{name}"
    await platform.submit(job_yaml(name, ["echo line-one", "echo line-two"], vc="research"))
    await platform.wait_state(jid, "SUCCEEDED")
    rows = await platform.client.request("GET", "/api/v2/jobs", params={"vc": "research", "state": "SUCCEEDED"})
    assert name in [r["name"] for r in rows]
    rows = await platform.client.request("GET", "/api/v2/jobs", params={"vc": "default"})
    assert name not in [r["name"] for r in rows]
    log = await platform.logs(jid)
    assert "line-one\nline-two" in log
    assert (await platform.logs(jid, tailBytes=9)) == "line-two\n"


async def test_virtual_clusters_are_listed(platform):
    vcs = await platform.client.request("GET", "/api/v2/virtual-clusters")
    assert set(vcs) == {"default", "research"}


async def test_every_service_is_healthy_and_exports_metrics(platform):
    import aiohttp

    config = platform.platform.config
    async with aiohttp.ClientSession() as session:
        for service in ("rest", "scheduler", "launcher", "runtime", "monitor"):
            base = f"http://127.0.0.1:{config.port_of(service)}"
            for path in ("/healthz", "/readyz", "/metrics"):
                async with session.get(base + path) as resp:
                    assert resp.status == 200, (service, path)


async def test_log_follow_streams_until_the_job_ends(platform):
    name = unique("follow")
    jid = f"admin~{name}"
    await platform.submit(job_yaml(name, ["echo first", "sleep 1.5", "echo second"]))
    await platform.wait_state(jid, "RUNNING")
    chunks: list[bytes] = []
    await platform.client.stream(f"/api/v2/jobs/{jid}/logs", params={"follow": "true"}, sink=chunks.append)
    assert b"".join(chunks) == b"first\nsecond\n"
    assert len(chunks) >= 2  # it arrived as it was written, not at the end in one piece
    assert (await platform.job(jid))["jobStatus"]["state"] == "SUCCEEDED"


async def test_docker_image_is_recorded_and_reported_unused_by_the_local_backend(platform):
    name = unique("image")
    body = job_yaml(name, ["true"]).replace(
        "taskRoles:", "prerequisites:\n  - {name: img, type: dockerimage, uri: 'pytorch/pytorch:2.4'}\ntaskRoles:"
    ).replace("    instances: 1", "    instances: 1\n    dockerImage: img")
    await platform.submit(body)
    detail = await platform.wait_state(f"admin~{name}", "SUCCEEDED")
    assert any("pytorch/pytorch:2.4" in n and "not used by the local backend" in n for n in detail["notes"])
    config = await platform.client.request("GET", f"/api/v2/jobs/admin~{name}/config")
    assert config["prerequisites"][0]["uri"] == "pytorch/pytorch:2.4"
