"""The whole platform with the Kubernetes backend, against a Kubernetes API emulator.

No Kubernetes cluster exists where PAI is developed and tested; the launcher
talks real HTTP to kmock's emulator (tests/component/kube_emulator.py), and the
test plays the kubelet: it reports each Pod running and exiting through the same
API, as a node agent would.
"""

from __future__ import annotations

import asyncio
import uuid

import kmock
import pytest

from cli.up import Platform
from tests.component.kube_emulator import NAMESPACE, Kubelet, PodApiEmulator, wait_until
from tests.integration.conftest import Api, job_yaml, platform_config

pytestmark = pytest.mark.integration


# One platform and emulator for the module (a platform start is most of each test's
# time): each test has a job of its own, found by its job label, and every job ends.
@pytest.fixture(scope="module")
async def kube_platform(tmp_path_factory):
    emulator = PodApiEmulator()
    async with emulator, kmock.Server(emulator) as server:
        config = platform_config(
            tmp_path_factory.mktemp("kube") / "pai", backend="kubernetes", kube_api_url=str(server.url).rstrip("/"),
            kube_namespace=NAMESPACE,
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
