"""The container tier: jobs run in their images on a real podman through the whole platform.

One platform for the module, its launcher talking to podman's API service through a
recording proxy on a unix socket (the requests the engine receives are what some
tests check: a private registry's credentials, one container per task after a
launcher crash). The proxy stands in for the one registry this machine cannot
reach: a pull of `registry.pai.test/...` is answered by tagging the local test image
under that name. The image is the one `make container-deps` builds
(tests/containers/build-images.sh). Skipped, saying why, only where podman cannot be
used (not installed, not root); `make test` installs it on Debian as root.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from cli.up import Platform
from services.launcher.backends import engine as engine_api
from tests.integration.conftest import Api, job_yaml, platform_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/pai-test-busybox:1"
PRIVATE_IMAGE = "registry.pai.test/team/private:1"


def _unavailable() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (make container-deps installs it as root on Debian)"
    if os.geteuid() != 0:
        return "the container tier runs rootful podman: run as root"
    env = engine_api.podman_env()
    if subprocess.run(["sh", str(REPO / "tests/containers/build-images.sh")], env=env, capture_output=True).returncode:
        return "the test image could not be built (tests/containers/build-images.sh)"
    return None


UNAVAILABLE = _unavailable()
if UNAVAILABLE:
    pytest.skip(UNAVAILABLE, allow_module_level=True)


class RecordingProxy:
    """An engine API in front of podman's: forwards every request, keeps (method,
    path, query, X-Registry-Auth) of each, and answers a pull of PRIVATE_IMAGE by
    tagging the test image under its name (the registry this machine lacks)."""

    def __init__(self, path: str, upstream: str):
        self.path = path
        self.upstream = upstream
        self.requests: list[tuple[str, str, dict[str, str], str | None]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._session.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.UnixSite(runner, self.path).start())
        self._session = self._loop.run_until_complete(self._client())
        self._ready.set()
        self._loop.run_forever()

    async def _client(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.upstream, limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None))

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("X-Registry-Auth")
        self.requests.append((request.method, request.path, dict(request.query), auth))
        if request.path.endswith("/images/create") and request.query.get("fromImage", "").startswith("registry.pai.test"):
            name, tag = request.query["fromImage"], request.query.get("tag", "latest")
            async with self._session.post(f"http://engine/v1.41/images/{IMAGE}/tag", params={"repo": name, "tag": tag}) as r:
                await r.read()
            return web.json_response({"status": f"Downloaded newer image for {name}:{tag}"})
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "x-registry-auth")}
        async with self._session.request(request.method, f"http://engine{request.path_qs}", data=body or None,
                                         headers=headers) as upstream:
            data = await upstream.read()
            return web.Response(status=upstream.status, body=data,
                                content_type=upstream.content_type if data else None)

    def created_names(self) -> list[str]:
        return [q.get("name", "") for m, p, q, _ in self.requests if m == "POST" and p.endswith("/containers/create")]


@pytest.fixture(scope="module")
def engine_socket(tmp_path_factory: pytest.TempPathFactory):
    async def ensure() -> str:
        engine = await engine_api.connect("auto")
        assert engine is not None, "podman's API service did not start"
        await engine.close()
        return engine.socket_path

    upstream = asyncio.run(ensure())
    path = str(tmp_path_factory.mktemp("engine") / "proxy.sock")
    proxy = RecordingProxy(path, upstream)
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def cplatform(tmp_path_factory: pytest.TempPathFactory, engine_socket: RecordingProxy):
    from tests.chaos.harness import _stop_quickly  # here: the harness imports the conftest

    plat = Platform(platform_config(tmp_path_factory.mktemp("pai-containers"), container_engine=engine_socket.path),
                    print_fn=lambda *_: None)
    try:
        conn = plat.start()
        yield Api(plat, conn)
    finally:
        _stop_quickly(plat)


def image_job(name: str, commands: list[str], *, image: str = IMAGE, memory: int = 256, auth: str = "",
              role_extra: str = "", extra: str = "") -> str:
    body = job_yaml(name, commands, extra=extra).replace(
        "    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}",
        f"    dockerImage: img\n    resourcePerInstance: {{cpu: 1, memoryMB: {memory}, gpu: 0}}{role_extra}",
    )
    return body + f"prerequisites:\n  - name: img\n    type: dockerimage\n    uri: {image}\n{auth}"


def task_of(detail: dict) -> dict:
    return detail["taskRoles"]["main"]["taskStatuses"][0]


async def run_to_end(api: Api, body: str, job: str, timeout: float = 60.0) -> dict:
    await api.submit(body)
    return await api.wait_state(job, {"SUCCEEDED", "FAILED", "STOPPED"}, timeout=timeout)


async def test_the_job_runs_in_its_image(cplatform: Api):
    detail = await run_to_end(cplatform, image_job("img-file", ["cat /etc/pai-image", "id -u"]), "admin~img-file")
    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail
    task = task_of(detail)
    assert task["runtimeMode"] == "container"
    assert detail["notes"] == []  # no "not used by the local backend": a container ran it
    logs = await cplatform.logs("admin~img-file")
    assert "pai-test-busybox" in logs  # a file only the image has
    assert logs.strip().splitlines()[-1] != "0"  # the job's own uid, never root


async def test_memory_limit_kills_with_oom_reported(cplatform: Api):
    body = image_job("img-oom", ["dd if=/dev/zero of=/dev/null bs=200M count=1"], memory=64)
    detail = await run_to_end(cplatform, body, "admin~img-oom")
    assert detail["jobStatus"]["state"] == "FAILED"
    spec = task_of(detail)["containerExitSpec"]
    assert "OOM" in json.dumps(spec), spec


async def test_cpu_quota_shm_size_and_ports(cplatform: Api):
    commands = [
        "cat /sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us"
        " 2>/dev/null || cut -d' ' -f1 /sys/fs/cgroup/cpu.max",
        "df -k /dev/shm | tail -1",
        "echo ports-answer | nc -l -p $PAI_PORT_LIST_main_0_http",
    ]
    body = image_job("img-limits", commands, role_extra="\n    extraContainerOptions: {shmMB: 96}")
    body = body.replace("gpu: 0}", "gpu: 0, ports: {http: 1}}")
    await cplatform.submit(body)
    detail = await cplatform.wait_state("admin~img-limits", "RUNNING")
    port = int(task_of(detail)["containerPorts"]["http"])
    got = b""
    for _ in range(100):  # the task listens once its shell gets there
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
                got = conn.recv(100)
                if got:
                    break
        except OSError:
            pass
        await asyncio.sleep(0.1)
    assert got.strip() == b"ports-answer"
    detail = await cplatform.wait_state("admin~img-limits", {"SUCCEEDED", "FAILED"}, timeout=30)
    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail
    lines = (await cplatform.logs("admin~img-limits")).splitlines()
    assert lines[0] == "100000"  # one cpu: a full period's quota
    assert lines[1].split()[1] == str(96 * 1024)  # /dev/shm of the role's shmMB


async def test_private_registry_credentials_reach_the_engine(cplatform: Api, engine_socket: RecordingProxy):
    auth = ("    auth:\n      username: robot\n      password: <% $secrets.registry_pw %>\n"
            "      registryuri: registry.pai.test\n")
    body = image_job("img-private", ["cat /etc/pai-image"], image=PRIVATE_IMAGE, auth=auth,
                     extra="secrets:\n  registry_pw: s3cret-pw\n")
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=engine_socket.upstream)) as http:
        # Not there from an earlier run: the engine must pull it.
        async with http.delete(f"http://engine/v1.41/images/{PRIVATE_IMAGE}", params={"noprune": "true"}) as resp:
            await resp.read()
    detail = await run_to_end(cplatform, body, "admin~img-private")
    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail
    pulls = [(q, a) for m, p, q, a in engine_socket.requests if p.endswith("/images/create")
             and q.get("fromImage") == "registry.pai.test/team/private"]
    assert pulls, "the engine was never asked to pull the private image"
    sent = json.loads(base64.urlsafe_b64decode(pulls[0][1] or ""))
    assert sent == {"username": "robot", "password": "s3cret-pw", "serveraddress": "registry.pai.test"}


async def test_an_image_that_cannot_be_pulled_fails_the_job_saying_so(cplatform: Api):
    detail = await run_to_end(cplatform, image_job("img-missing", ["true"], image="localhost/pai-no-such-image:1"),
                              "admin~img-missing")
    assert detail["jobStatus"]["state"] == "FAILED", detail
    assert detail["jobStatus"]["retries"] == 0  # the rule says: never retried
    task = task_of(detail)
    assert task["containerExitSpec"]["phrase"] == "ContainerImageNotExists", task
    assert "localhost/pai-no-such-image:1 could not be pulled" in json.dumps(detail)


async def test_launcher_killed_mid_run_adopts_its_container(cplatform: Api, engine_socket: RecordingProxy):
    await cplatform.submit(image_job("img-adopt", ["sleep 3", "echo finished-once >> /pai/work/runs", "cat /pai/work/runs"]))
    await cplatform.wait_state("admin~img-adopt", "RUNNING")
    cplatform.platform.kill_service("launcher", signal.SIGKILL)
    await asyncio.sleep(0.5)
    cplatform.platform.start_service("launcher")
    detail = await cplatform.wait_state("admin~img-adopt", {"SUCCEEDED", "FAILED"}, timeout=60)
    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail
    assert (await cplatform.logs("admin~img-adopt")).count("finished-once") == 1
    created = [n for n in engine_socket.created_names() if "img-adopt" in n]
    assert len(created) == 1, created  # never run twice
    engine = engine_api.Engine(engine_socket.upstream)
    try:
        left = [c for c in await engine.list({}) if any("img-adopt" in n for n in c.get("Names", []))]
    finally:
        await engine.close()
    assert left == []  # nothing left behind


async def test_a_checkpoint_written_by_one_container_job_is_read_by_the_next(cplatform: Api, tmp_path: Path):
    ckpt, data = "ctrckpt", "ctrdata"
    ckpt_dir, data_dir = tmp_path / "ckpt", tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "dataset.txt").write_text("the dataset\n")
    for name, body in ((ckpt, {"type": "hostPath", "data": {"path": str(ckpt_dir)}}),
                       (data, {"type": "hostPath", "data": {"path": str(data_dir)}, "readOnly": True})):
        await cplatform.client.request("PUT", f"/api/v2/storages/{name}", json_body=body)
    plugin = ("extras:\n  com.microsoft.pai.runtimeplugin:\n    - plugin: teamwise_storage\n"
              "      parameters: {storageConfigNames: [%s]}\n")
    body = image_job("img-train", [
        f"cat /mnt/{data}/dataset.txt",
        f"echo step-41 > /mnt/{ckpt}/checkpoint.txt",
        f"if touch /mnt/{data}/x 2>/dev/null; then echo dataset-writable; fi",
    ], extra=plugin % f"{ckpt}, {data}")
    detail = await run_to_end(cplatform, body, "admin~img-train")
    log = await cplatform.logs("admin~img-train")
    assert detail["jobStatus"]["state"] == "SUCCEEDED", log
    assert task_of(detail)["runtimeMode"] == "container"
    assert "the dataset" in log and "dataset-writable" not in log  # declared read-only
    assert (ckpt_dir / "checkpoint.txt").read_text() == "step-41\n"  # on the node, where the storage is
    detail = await run_to_end(cplatform, image_job("img-resume", [f'echo "resumed from $(cat /mnt/{ckpt}/checkpoint.txt)"'],
                                                   extra=plugin % ckpt), "admin~img-resume")
    log = await cplatform.logs("admin~img-resume")
    assert detail["jobStatus"]["state"] == "SUCCEEDED", log
    assert "resumed from step-41" in log


async def test_without_an_engine_tasks_run_as_processes(platform: Api):
    body = image_job("img-none", ["echo as-a-process"])
    detail = await run_to_end(platform, body, "admin~img-none")
    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail
    assert task_of(detail)["runtimeMode"] == "process"
    assert any("not used by the local backend" in note for note in detail["notes"])


# The ssh plugin in an image without OpenSSH (nor a C library: busybox-static): PAI's bundle.
SSH_TASK = [
    "me=$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX; o=$((1 - me))",
    'eval port=\\$PAI_PORT_LIST_worker_${o}_ssh; eval host=\\$PAI_HOST_IP_worker_${o}',
    'for i in $(seq 1 100); do ssh -p "$port" "$host" "echo reached worker-\\$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX '
    'from worker-$me in \\$(cat /etc/pai-image)" && break; sleep 0.2; done',
    "sleep 120",
]


async def test_ssh_plugin_in_an_image_without_openssh(cplatform: Api, tmp_path: Path):
    from cli.client import ApiError, Client, Connection
    from libs.common.protocol import ssh as protocol_ssh
    from tests.integration.test_ssh import keygen, ssh

    if shutil.which("ssh") is None or not Path(protocol_ssh.SSHD).exists() \
            or not list(Path("/usr/lib").glob(f"*/{protocol_ssh.NSS_WRAPPER}")):
        pytest.skip("needs Debian's openssh-client, openssh-server and libnss-wrapper on the node (make test's "
                    "ssh-deps installs them): PAI brings the node's own into the container")
    login = "ctrssh"
    created = await cplatform.client.request("POST", "/api/v2/users", json_body={"username": login})
    owner = Client(Connection(cplatform.conn.url, created["token"]))
    profile_key, profile_pub = keygen(tmp_path, "profile")
    stranger_key, _ = keygen(tmp_path, "stranger")
    await owner.request("PUT", f"/api/v2/users/{login}/extension",
                        json_body={"extension": {"sshKeys": [{"title": "laptop", "value": profile_pub}]}})
    body = job_yaml("ctr-ssh", SSH_TASK, roles={"worker": 2},
                    extra="extras:\n  com.microsoft.pai.runtimeplugin:\n    - plugin: ssh\n      parameters: {jobssh: true}\n")
    body = body.replace("    resourcePerInstance:", "    dockerImage: img\n    resourcePerInstance:")
    body += f"prerequisites:\n  - name: img\n    type: dockerimage\n    uri: {IMAGE}\n"
    job = (await owner.request("POST", "/api/v2/jobs", data=body.encode(), content_type="text/yaml"))["job"]
    try:
        info: dict = {}
        for _ in range(300):
            try:
                info = await owner.request("GET", f"/api/v2/jobs/{job}/ssh")
            except ApiError as exc:  # 404 until its tasks run
                assert exc.status == 404, exc.body
            log = "".join([await cplatform.logs(job, taskRole="worker", taskIndex=i) for i in (0, 1)]) \
                if len(info.get("containers", [])) == 2 else ""
            if log.count("ssh plugin: sshd listening") == 2:
                break
            await asyncio.sleep(0.2)
        assert log.count("ssh plugin: sshd listening") == 2, log
        pair = info["keyPair"]
        job_key = tmp_path / "job_key"
        job_key.write_text(pair["privateKey"])
        job_key.chmod(0o600)
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(f"* {pair['publicKey']}\n")
        for task in info["containers"]:
            host, port = task["sshIp"], task["sshPort"]
            for key in (job_key, profile_key):
                done = await asyncio.to_thread(ssh, key, known_hosts, login, host, port,
                                               "cat /etc/pai-image; echo task=$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX")
                assert done.returncode == 0, (key.name, done.stderr)
                assert done.stdout.split() == ["pai-test-busybox", f"task={task['taskIndex']}"], done.stdout
            refused = await asyncio.to_thread(ssh, stranger_key, known_hosts, login, host, port, "true")
            assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused.stderr
        for _ in range(100):  # the tasks reached each other with the job's key, from inside their images
            log = "".join([await cplatform.logs(job, taskRole="worker", taskIndex=i) for i in (0, 1)])
            if "reached worker-1 from worker-0 in pai-test-busybox" in log and "reached worker-0 from worker-1" in log:
                break
            await asyncio.sleep(0.2)
        assert "reached worker-1 from worker-0 in pai-test-busybox" in log, log
        assert "reached worker-0 from worker-1 in pai-test-busybox" in log, log
    finally:
        await owner.request("PUT", f"/api/v2/jobs/{job}/executionType", json_body={"value": "STOP"})


async def test_a_browser_terminal_in_a_container_task_runs_through_the_engines_exec(engine_socket: RecordingProxy):
    """The launcher's shell in a container task (backends/terminals.py, EngineExecTerminal):
    the engine's exec with a tty, its start upgraded to a raw stream on podman's socket;
    the shell is the container's user, in its working directory and environment, sized as
    asked; closing the terminal ends the shell. (The relay over the bus and rest is the
    process mode's, tests/integration/test_terminal.py.)"""
    from services.launcher.backends import terminals

    engine = engine_api.Engine(engine_socket.upstream)  # podman's own: the recording proxy relays no upgrade
    name = f"pai-terminal-test-{os.getpid()}"
    try:
        # The host's network, as the launcher gives its containers: a bridge needs
        # iptables or nftables, which a machine need not have.
        await engine.create(name, {"Image": IMAGE, "Entrypoint": ["/bin/sh", "-c", "sleep 300"], "Cmd": [],
                                   "Env": ["PAI_TASK_INDEX=3"], "WorkingDir": "/tmp", "User": "4242:4242",
                                   "HostConfig": {"NetworkMode": "host"}})
        await engine.start(name)
        channel = await terminals.EngineExecTerminal.open(engine, name, cols=90, rows=20)
        assert channel.mode == "container"
        await channel.write(b"id -u; pwd; echo $PAI_TASK_INDEX; stty size; echo done-$((6*7))\n")
        seen = b""
        while b"\ndone-42" not in seen.replace(b"\r", b""):
            chunk = await asyncio.wait_for(channel.read(), 20)
            assert chunk, f"the shell ended early; it showed {seen!r}"
            seen += chunk
        lines = [line.strip() for line in seen.decode().replace("\r", "").split("\n")]
        at = lines.index("done-42")
        assert lines[at - 4: at] == ["4242", "/tmp", "3", "20 90"], lines
        await channel.resize(100, 30)
        await channel.write(b"stty size\n")
        seen = b""
        while b"30 100" not in seen:
            seen += await asyncio.wait_for(channel.read(), 20)
        exec_id = channel._exec_id
        await channel.close()
        for _ in range(100):  # the exec's shell was hung up
            _, data = await engine._call("GET", f"/exec/{exec_id}/json", ok=(200, 404))
            if not json.loads(data).get("Running", False):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the exec's shell still runs after the terminal closed")
    finally:
        await engine.remove(name)
        await engine.close()


async def test_tensorboard_plugin_in_an_image_without_tensorboard_fails_saying_so(cplatform: Api):
    plugin = "extras:\n  com.microsoft.pai.runtimeplugin:\n    - plugin: tensorboard\n      parameters: {logdir: tb}\n"
    detail = await run_to_end(cplatform, image_job("img-notb", ["echo never-ran"], extra=plugin), "admin~img-notb")
    log = await cplatform.logs("admin~img-notb")
    assert detail["jobStatus"]["state"] == "FAILED", log
    assert task_of(detail)["containerExitSpec"]["phrase"] == "RuntimePluginFailed"
    assert "no TensorBoard in this task" in log and "pip install tensorboard" in log
    assert "never-ran" not in log  # before its commands, not a hang
