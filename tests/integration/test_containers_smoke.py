"""PAI as its containers: the images built from the root Dockerfile (one per service,
ARG SERVICE) and started by docker-compose.yml through testcontainers, then one job
submitted over HTTP runs to SUCCEEDED.

Needs a Docker engine (and its compose plugin); where there is none the test is
skipped saying so, never counted as passed. What can be checked without one — that
the compose file's bus (init's credentials and NATS configuration, the bootstrap,
each service logging in as itself) works with a real nats-server — is checked
below by running the same commands the containers run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from libs.common.natsserver import binary as nats_server_binary, free_port, wait_for_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = "docker-compose.yml"
REST_PORT = 9186
JOB_SECONDS = 180


def docker_unavailable() -> str | None:
    """Why no Docker engine can be used here, or None."""
    if shutil.which("docker") is None:
        return "no `docker` command on this machine"
    try:
        import docker  # testcontainers' dependency

        docker.from_env(timeout=5).ping()
    except Exception as exc:  # noqa: BLE001 - any failure means: no engine to talk to
        return f"no Docker engine reachable: {exc}"
    done = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"the docker compose plugin is missing: {done.stderr.strip()}"
    return None


def api(method: str, path: str, token: str, body: bytes | None = None) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{REST_PORT}{path}", data=body, method=method,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "text/yaml"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as resp:
        return yaml.safe_load(resp.read())


@pytest.mark.timeout(1800)  # building five images from scratch takes minutes
def test_compose_builds_the_images_and_runs_a_job_to_succeeded() -> None:
    why = docker_unavailable()
    if why:
        pytest.skip(f"needs a Docker engine: {why}")
    from testcontainers.compose import DockerCompose

    with DockerCompose(REPO, compose_file_name=COMPOSE_FILE, build=True, wait=False) as compose:
        deadline = time.monotonic() + JOB_SECONDS
        token = ""
        while not token:
            assert time.monotonic() < deadline, f"rest never wrote the admin token:\n{compose.get_logs('rest')}"
            out, _, code = compose.exec_in_container(["cat", "/var/lib/pai/admin-token"], service_name="rest")
            token = out.strip() if code == 0 else ""
            time.sleep(1)
        name = f"smoke-{uuid.uuid4().hex[:6]}"
        job = (f"protocolVersion: 2\nname: {name}\ntype: job\ntaskRoles:\n  main:\n    instances: 1\n"
               "    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}\n"
               "    commands:\n      - echo hello from PAI\n")  # fmt: skip
        while True:
            try:
                api("POST", "/api/v2/jobs", token, job.encode())
                break
            except OSError:
                assert time.monotonic() < deadline, "rest never took the job"
                time.sleep(1)
        state = None
        while state not in ("SUCCEEDED", "FAILED", "STOPPED"):
            assert time.monotonic() < deadline, f"the job is still {state}:\n{compose.get_logs('launcher')}"
            time.sleep(1)
            state = api("GET", f"/api/v2/jobs/admin~{name}", token)["jobStatus"]["state"]
        assert state == "SUCCEEDED"


def test_compose_bus_commands_work_with_a_real_nats_server(tmp_path: Path) -> None:
    """init's files start nats-server; bootstrap makes the store as the platform
    user; a service started through run-as logs in as itself and becomes ready."""
    compose = yaml.safe_load((REPO / COMPOSE_FILE).read_text())["services"]
    bus = tmp_path / "bus"
    init = [a.replace("/bus", str(bus)) for a in compose["init"]["command"] if a not in ("--owner", "10001:10001")]
    subprocess.run([sys.executable, *init[1:]], cwd=REPO, check=True, timeout=60)
    assert {p.name for p in bus.iterdir()} >= {"nats-credentials.json", "nats-server.conf", "secrets.key", "secrets.pub"}

    # The configuration as init wrote it, on ports and a store of this test's own.
    conf = json.loads((bus / "nats-server.conf").read_text())
    port = free_port()
    conf.update(port=port, http_port=free_port(), host="127.0.0.1")
    conf["jetstream"]["store_dir"] = str(tmp_path / "store")
    (tmp_path / "nats.conf").write_text(json.dumps(conf))
    nats = subprocess.Popen([nats_server_binary(), "-c", str(tmp_path / "nats.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    runtime = None
    try:
        wait_for_port("127.0.0.1", port)
        env = {**os.environ, "PAI_NATS_URL": f"nats://127.0.0.1:{port}"}
        bootstrap = [a.replace("/bus", str(bus)) for a in compose["bootstrap"]["command"]]
        subprocess.run([sys.executable, *bootstrap[1:]], cwd=REPO, env=env, check=True, timeout=120)

        runtime_port = free_port()
        command = [a.replace("/bus", str(bus)) for a in compose["runtime"]["command"]]
        command = [sys.executable if a == "python" else a for a in command]
        runtime = subprocess.Popen(command, cwd=REPO, env={**env, "PAI_RUNTIME_PORT": str(runtime_port),
                                                           "PAI_DATA_DIR": str(tmp_path / "data")})  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            assert runtime.poll() is None, "the runtime started through run-as exited"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{runtime_port}/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the runtime started through run-as never became ready"
            time.sleep(0.2)
    finally:
        for proc in (runtime, nats):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
