"""The whole platform with the Kubernetes backend, against a Kubernetes API emulator.

No Kubernetes cluster exists where PAI is developed and tested; the launcher
talks real HTTP to kmock's emulator (tests/component/kube_emulator.py), and the
test plays the kubelet: it reports each Pod running and exiting through the same
API, as a node agent would.
"""

from __future__ import annotations

import asyncio
import base64
import uuid

import kmock
import kubernetes_validate
import pytest

from cli.up import Platform
from tests.component.kube_emulator import NAMESPACE, Kubelet, PodApiEmulator, wait_until
from tests.integration.conftest import Api, job_yaml, platform_config

pytestmark = pytest.mark.integration
SSH_IMAGE = "registry.example/pai-launcher:0.2.0"  # the chart sets the launcher's own image


# One platform and emulator for the module (a platform start is most of each test's
# time): each test has a job of its own, found by its job label, and every job ends.
@pytest.fixture(scope="module")
async def kube_platform(tmp_path_factory):
    emulator = PodApiEmulator()
    async with emulator, kmock.Server(emulator) as server:
        config = platform_config(
            tmp_path_factory.mktemp("kube") / "pai", backend="kubernetes", kube_api_url=str(server.url).rstrip("/"),
            kube_namespace=NAMESPACE, kube_ssh_image=SSH_IMAGE,
        )
        plat = Platform(config, print_fn=lambda *_: None)
        try:
            conn = await asyncio.to_thread(plat.start)
            yield Api(plat, conn), emulator, Kubelet(emulator)
        finally:
            from tests.chaos.harness import _stop_quickly  # idle services are not awaited in NATS drain

            await asyncio.to_thread(_stop_quickly, plat)
            await emulator.end_watches()


def job_pods(emulator: PodApiEmulator, job: str) -> list[dict]:
    """The live Pods the launcher created for a job, by PAI's job label."""
    user, _, name = job.partition("~")
    pods = []
    for (resource, namespace, _), obj in list(emulator.objects.items()):
        if resource.plural == "pods" and namespace == NAMESPACE and not obj.deleted:
            if obj.raw["metadata"].get("labels", {}).get("pai/job") == f"{user}.{name}":
                pods.append(obj.raw)
    return sorted(pods, key=lambda p: (p["metadata"]["labels"]["pai/role"], int(p["metadata"]["labels"]["pai/index"])))


async def wait_pods(emulator: PodApiEmulator, job: str, count: int) -> list[dict]:
    await wait_until(lambda: len(job_pods(emulator, job)) == count, timeout=20, what=f"{count} pods of {job}")
    return job_pods(emulator, job)


async def test_job_runs_as_pods_bound_to_placed_nodes_and_succeeds(kube_platform):
    api, emulator, kubelet = kube_platform
    name = f"kube-{uuid.uuid4().hex[:6]}"
    jid = f"admin~{name}"
    await api.submit(job_yaml(name, ["python train.py"], roles={"worker": 2}))
    pods = await wait_pods(emulator, jid, 2)
    for index, pod in enumerate(pods):
        spec = pod["spec"]
        assert spec["nodeName"] in {"node-a", "node-b", "node-c"}
        assert spec["restartPolicy"] == "Never"
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["PAI_CURRENT_TASK_ROLE_NAME"] == "worker"
        assert env["PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"] == str(index)
        assert env["PAI_TASK_ROLE_TASK_COUNT_worker"] == "2"
        await kubelet.run(pod["metadata"]["name"])
    await api.wait_state(jid, "RUNNING")
    for pod in pods:
        await kubelet.exit(pod["metadata"]["name"], 0, log=b"epoch 1 done\n")
    detail = await api.wait_state(jid, "SUCCEEDED")
    statuses = detail["taskRoles"]["worker"]["taskStatuses"]
    assert [t["containerNodeName"] for t in statuses] == [p["spec"]["nodeName"] for p in pods]


async def test_oom_killed_pod_fails_the_job_with_the_reason(kube_platform):
    api, emulator, kubelet = kube_platform
    name = f"oom-{uuid.uuid4().hex[:6]}"
    jid = f"admin~{name}"
    await api.submit(job_yaml(name, ["python train.py"]))
    (pod,) = await wait_pods(emulator, jid, 1)
    await kubelet.run(pod["metadata"]["name"])
    await kubelet.exit(pod["metadata"]["name"], 137, reason="OOMKilled", log=b"loading batch 12\n")
    detail = await api.wait_state(jid, "FAILED")
    spec = detail["jobStatus"]["appExitSpec"]
    assert "memory" in (spec["phrase"] + spec["reason"]).lower()


async def test_stopping_a_job_deletes_its_pods(kube_platform):
    api, emulator, kubelet = kube_platform
    name = f"stop-{uuid.uuid4().hex[:6]}"
    jid = f"admin~{name}"
    await api.submit(job_yaml(name, ["sleep 600"]))
    (pod,) = await wait_pods(emulator, jid, 1)
    await kubelet.run(pod["metadata"]["name"])
    await api.wait_state(jid, "RUNNING")
    await api.stop(jid)
    # The launcher deletes the Pod; the kubelet then ends its container.
    name_ = pod["metadata"]["name"]
    await wait_until(lambda: (emulator.pod(name_, NAMESPACE) or {}).get("metadata", {}).get("deletionTimestamp"),
                     timeout=20, what="the pod's deletion")
    await kubelet.exit(name_, 143, log=b"terminated\n")
    await api.wait_state(jid, "STOPPED", timeout=30)
    await wait_until(lambda: not job_pods(emulator, jid), timeout=20, what="the pod deleted")


async def test_a_browser_terminal_reaches_a_pod_through_rest_and_kubernetes_exec(kube_platform):
    """GET /api/v2/jobs/{id}/terminal on a job of Pods: rest relays to the launcher, which
    opens Kubernetes' exec on the API server (the emulator plays the kubelet, running the
    shell in the container's environment); the session is recorded as a Pod's."""
    import aiohttp

    api, emulator, kubelet = kube_platform
    name = f"term-{uuid.uuid4().hex[:6]}"
    jid = f"admin~{name}"
    await api.submit(job_yaml(name, ["sleep 600"]))
    (pod,) = await wait_pods(emulator, jid, 1)
    await kubelet.run(pod["metadata"]["name"])
    await api.wait_state(jid, "RUNNING")
    url = f"{api.conn.url}/api/v2/jobs/{jid}/terminal?taskRole=main&taskIndex=0"
    async with aiohttp.ClientSession() as http, \
            http.ws_connect(url, headers={"Authorization": f"Bearer {api.conn.token}"}) as ws:
        await ws.send_bytes(b"echo in-$PAI_CURRENT_TASK_ROLE_NAME-$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX-$((6*7))\n")
        seen = b""
        while b"in-main-0-42" not in seen:
            msg = await asyncio.wait_for(ws.receive(), 20)
            assert msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), (msg, seen)
            seen += msg.data if msg.type == aiohttp.WSMsgType.BINARY else b""
    assert len(emulator.exec_sessions) >= 1
    for _ in range(100):
        events = (await api.client.request("GET", f"/api/v2/jobs/{jid}/events"))["data"]
        reasons = {e["reason"]: e["message"] for e in events}
        if "TerminalClosed" in reasons:
            break
        await asyncio.sleep(0.2)
    assert reasons.get("TerminalOpened") == "admin opened a terminal in task main[0] (pod)"
    assert "TerminalClosed" in reasons
    await api.stop(jid)
    await wait_until(lambda: (emulator.pod(pod["metadata"]["name"], NAMESPACE) or {}).get("metadata", {})
                     .get("deletionTimestamp"), timeout=20, what="the pod's deletion")
    await kubelet.exit(pod["metadata"]["name"], 143)
    await api.wait_state(jid, "STOPPED", timeout=30)


def stored_secret(emulator: PodApiEmulator, name: str) -> dict | None:
    for (resource, namespace, secret_name), obj in list(emulator.objects.items()):
        if resource.plural == "secrets" and namespace == NAMESPACE and secret_name == name and not obj.deleted:
            return obj.raw
    return None


async def test_an_ssh_job_gets_pais_sshd_its_port_and_its_key_in_every_pod(kube_platform):
    """The ssh plugin whatever the image: each Pod of the job has the init container of
    PAI's image filling the emptyDir its task sees at /pai/ssh, the plugin's port from
    the job's range as a host port, the job's private key in the task's script Secret
    only; GET /ssh names those ports; the job runs to its end and its Secrets go."""
    api, emulator, kubelet = kube_platform
    name = f"kssh-{uuid.uuid4().hex[:6]}"
    jid = f"admin~{name}"
    extra = "extras:\n  com.microsoft.pai.runtimeplugin:\n    - plugin: ssh\n      parameters: {jobssh: true}\n"
    await api.submit(job_yaml(name, ["python train.py"], roles={"worker": 2}, extra=extra))
    pods = await wait_pods(emulator, jid, 2)
    ports, secrets = [], []
    for pod in pods:
        spec = pod["spec"]
        kubernetes_validate.validate({k: pod[k] for k in ("apiVersion", "kind", "metadata", "spec")}, "1.30.0",
                                     strict=True)
        (init,), (task,) = spec["initContainers"], spec["containers"]
        assert init["image"] == SSH_IMAGE and init["command"][-1] == "/pai/ssh"
        bundle = {m["mountPath"]: m for m in task["volumeMounts"]}["/pai/ssh"]
        assert bundle["readOnly"] is True and init["volumeMounts"] == [{"name": bundle["name"], "mountPath": "/pai/ssh"}]
        assert "emptyDir" in {v["name"]: v for v in spec["volumes"]}[bundle["name"]]
        env = {e["name"]: e for e in task["env"]}
        port = int(env["PAI_CONTAINER_SSH_PORT"]["value"])
        assert {"containerPort": port, "hostPort": port, "protocol": "TCP"} in task["ports"]
        assert env["PAI_WORK_DIR"]["value"] == "/pai/work"
        secret = stored_secret(emulator, env["PAI_TASK_SCRIPT"]["valueFrom"]["secretKeyRef"]["name"])
        assert secret is not None
        script = base64.b64decode(secret["data"]["script"]).decode()
        assert "BEGIN OPENSSH PRIVATE KEY" in script and "BEGIN OPENSSH" not in str(pod)
        ports.append(port)
        secrets.append(secret["metadata"]["name"])
        await kubelet.run(pod["metadata"]["name"])
    await api.wait_state(jid, "RUNNING")
    info = await api.client.request("GET", f"/api/v2/jobs/{jid}/ssh")
    assert sorted(int(t["sshPort"]) for t in info["containers"]) == sorted(ports)
    assert info["keyPair"]["privateKey"].strip().splitlines()[1] in script
    for pod in pods:
        await kubelet.exit(pod["metadata"]["name"], 0, log=b"[PAI] ssh plugin: sshd listening\n")
    await api.wait_state(jid, "SUCCEEDED")
    await wait_until(lambda: not job_pods(emulator, jid) and not any(stored_secret(emulator, s) for s in secrets),
                     timeout=20, what="the job's pods and secrets deleted")
