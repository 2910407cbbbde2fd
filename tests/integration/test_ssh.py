"""OpenPAI's ssh plugin through the whole platform, tasks as processes: Debian's OpenSSH
client reaches each task's server (the node's sshd, run as the job's uid) with the
job's key from GET /ssh and with a key of the owner's profile, not with anyone else's;
the tasks of one job reach each other; another user's GET /ssh is 403."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from cli.client import ApiError, Client, Connection
from libs.common.protocol import ssh as protocol_ssh
from tests.integration.conftest import Api, job_yaml

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
# Each task reaches the other over SSH (its ~/.ssh trusts the job's key and pins its host
# key), then stays up for the test's clients.
TASK = [
    "me=$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX; o=$((1 - me))",
    'eval port=\\$PAI_PORT_LIST_worker_${o}_ssh; eval host=\\$PAI_HOST_IP_worker_${o}',
    'for i in $(seq 1 100); do ssh -p "$port" "$host" "echo reached worker-\\$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX '
    'from worker-$me as \\$(whoami)" && break; sleep 0.2; done',
    "sleep 120",
]


def keygen(where: Path, name: str) -> tuple[Path, str]:
    path = where / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True)
    return path, (where / f"{name}.pub").read_text().strip()


def ssh(key: Path, known_hosts: Path, login: str, host: str, port: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(key), "-p", port, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
         "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}", "-o", "ConnectTimeout=5",
         f"{login}@{host}", command],
        capture_output=True, text=True, timeout=20)


async def both_logs(platform: Api, job: str) -> str:
    return "".join([await platform.logs(job, taskRole="worker", taskIndex=i) for i in (0, 1)])


@pytest.fixture(scope="module")
async def owner(platform: Api) -> Client:
    created = await platform.client.request("POST", "/api/v2/users", json_body={"username": f"sshown{RUN}"})
    return Client(Connection(platform.conn.url, created["token"]))


async def test_ssh_into_a_jobs_tasks_with_its_key_and_the_profiles(platform: Api, owner: Client, tmp_path: Path):
    if os.geteuid() != 0 or shutil.which("ssh") is None or not Path(protocol_ssh.SSHD).exists() \
            or not list(Path("/usr/lib").glob(f"*/{protocol_ssh.NSS_WRAPPER}")):
        pytest.skip("needs root (tasks under their own uid), Debian's openssh-client, openssh-server and "
                    "libnss-wrapper (make test's ssh-deps installs them)")
    login = f"sshown{RUN}"
    profile_key, profile_pub = keygen(tmp_path, "profile")
    custom_key, custom_pub = keygen(tmp_path, "custom")
    stranger_key, _ = keygen(tmp_path, "stranger")
    await owner.request("PUT", f"/api/v2/users/{login}/extension",
                        json_body={"extension": {"sshKeys": [{"title": "laptop", "value": profile_pub}]}})
    extra = ("extras:\n  com.microsoft.pai.runtimeplugin:\n    - plugin: ssh\n      parameters:\n"
             f"        jobssh: true\n        userssh: {{type: custom, value: \"{custom_pub}\"}}\n")
    answer = await owner.request("POST", "/api/v2/jobs", data=job_yaml(f"ssh{RUN}", TASK, roles={"worker": 2},
                                                                       extra=extra).encode(),
                                 content_type="text/yaml")
    job = answer["job"]
    try:
        info: dict = {}
        for _ in range(150):  # both tasks running, with their ssh ports
            try:
                info = await owner.request("GET", f"/api/v2/jobs/{job}/ssh")
            except ApiError as exc:
                assert exc.status == 404, exc.body
            if len(info.get("containers", [])) == 2:
                break
            await asyncio.sleep(0.2)
        assert len(info["containers"]) == 2, info
        pair = info["keyPair"]
        job_key = tmp_path / pair["privateKeyFileName"]
        job_key.write_text(pair["privateKey"])
        job_key.chmod(0o600)
        known_hosts = tmp_path / "known_hosts"  # every task's host key is the job's public key
        known_hosts.write_text(f"* {pair['publicKey']}\n")

        # Another user may not read it; an admin sees where the tasks are, not the key.
        stranger = await platform.client.request("POST", "/api/v2/users", json_body={"username": f"sshoth{RUN}"})
        with pytest.raises(ApiError) as refused:
            await Client(Connection(platform.conn.url, stranger["token"])).request("GET", f"/api/v2/jobs/{job}/ssh")
        assert refused.value.status == 403
        as_admin = await platform.client.request("GET", f"/api/v2/jobs/{job}/ssh")
        assert "privateKey" not in as_admin["keyPair"] and len(as_admin["containers"]) == 2

        log = ""
        for _ in range(100):  # a task is RUNNING from its first command: its server starts then
            log = await both_logs(platform, job)
            if log.count("ssh plugin: sshd listening") == 2:
                break
            await asyncio.sleep(0.2)
        assert log.count("ssh plugin: sshd listening") == 2, log
        for task in info["containers"]:
            host, port = task["sshIp"], task["sshPort"]
            assert task["user"] == login and task["sshCommand"].endswith(f"-p {port} {login}@{host}")
            for key in (job_key, profile_key, custom_key):
                done = await asyncio.to_thread(ssh, key, known_hosts, login, host, port,
                                               "echo task=$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX; whoami")
                assert done.returncode == 0, (key.name, done.stderr)
                assert done.stdout.split() == [f"task={task['taskIndex']}", login], done.stdout
            refused_key = await asyncio.to_thread(ssh, stranger_key, known_hosts, login, host, port, "true")
            assert refused_key.returncode == 255 and "Permission denied" in refused_key.stderr, refused_key.stderr

        # `pai ssh JOB ROLE INDEX -- command`: the owner's CLI with the job's key, the host pinned.
        cli = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "cli.main", "ssh", "--url", platform.conn.url, "--token", owner.conn.token,
            job, "worker", "1", "--", "echo", "via-pai-ssh", "$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert cli.returncode == 0 and cli.stdout.split() == ["via-pai-ssh", "1"], (cli.stdout, cli.stderr)

        log = ""
        for _ in range(100):  # the tasks reached each other with the job's key
            log = await both_logs(platform, job)
            if "reached worker-1 from worker-0" in log and "reached worker-0 from worker-1" in log:
                break
            await asyncio.sleep(0.2)
        assert "reached worker-1 from worker-0" in log and "reached worker-0 from worker-1" in log, log
        assert f"as {login}" in log
        assert pair["privateKey"].splitlines()[1] not in log  # the key is scrubbed from what PAI shows
    finally:
        await owner.request("PUT", f"/api/v2/jobs/{job}/executionType", json_body={"value": "STOP"})
