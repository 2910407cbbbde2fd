"""The Kubernetes backend gives a task OpenPAI's Pod: /dev/shm a memory-backed volume of
its shmMB, the job's storages as volumes at their mount paths, and the job's registry
login as an imagePullSecret of its own, removed with the job's last Pod. Against the
API emulator; tests/unit/launcher/test_kube_pod_schema.py checks the same Pods against
Kubernetes' published schemas."""

from __future__ import annotations

import base64
import json

from libs.common.storages import Storage, StorageData
from services.launcher.backends import kube_names
from services.launcher.backends.kube_pods import registry_secret, registry_secret_name
from services.launcher.core.tasks import TaskFinished, TaskRunning
from tests.component.test_kubernetes_backend import (  # noqa: F401 - fixture
    NAMESPACE,
    cluster,
    pod_of,
    task_key,
    task_launch,
)
from tests.component.test_kubernetes_secrets import secret_named

AUTH = {"username": "bot", "password": "registry-pass", "registryuri": "registry.example:5000"}
STORAGES = [
    Storage(name="team", type="hostPath", data=StorageData(path="/srv/pai-storage/team")),
    Storage(name="share", type="nfs", data=StorageData(server="nfs.example", path="/export"), readOnly=True),
    Storage(name="ckpt", type="pvc", data=StorageData(claimName="ckpt-claim"), mountPath="/checkpoints"),
]


async def test_shm_and_storages_are_volumes_of_the_pod(cluster):
    backend, _ = await cluster.backend()
    key = task_key()
    await backend.start(task_launch(key, storages=STORAGES, shmMB=2048))
    spec = pod_of(cluster, key)["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2048Mi"}
    assert volumes[mounts["/mnt/team"]["name"]]["hostPath"]["path"] == "/srv/pai-storage/team"
    assert volumes[mounts["/mnt/share"]["name"]]["nfs"] == {"server": "nfs.example", "path": "/export", "readOnly": True}
    assert mounts["/mnt/share"]["readOnly"] is True
    assert volumes[mounts["/checkpoints"]["name"]]["persistentVolumeClaim"] == {"claimName": "ckpt-claim",
                                                                               "readOnly": False}
    assert "subPath" not in mounts["/mnt/team"]


async def test_the_users_own_part_of_a_storage_is_a_sub_path(cluster):
    backend, _ = await cluster.backend()
    key = task_key()
    own = Storage(name="team", type="hostPath", data=StorageData(path="/srv/team"), subPath="alice")
    await backend.start(task_launch(key, storages=[own]))
    mount = next(m for m in pod_of(cluster, key)["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/mnt/team")
    assert mount["subPath"] == "alice"


async def test_shm_is_openpais_512_mb_when_the_job_sets_none(cluster):
    backend, _ = await cluster.backend()
    key = task_key()
    await backend.start(task_launch(key))
    spec = pod_of(cluster, key)["spec"]
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["sizeLimit"] == "512Mi"


async def test_the_jobs_registry_login_is_a_pull_secret_removed_with_its_last_pod(cluster):
    backend, events = await cluster.backend()
    first, second = task_key(0), task_key(1)
    await backend.start(task_launch(first, dockerImageUri="registry.example:5000/team/train:1", dockerImageAuth=AUTH))
    await backend.start(task_launch(second, dockerImageUri="registry.example:5000/team/train:1", dockerImageAuth=AUTH))
    pulls = [pod_of(cluster, k)["spec"]["imagePullSecrets"] for k in (first, second)]
    assert pulls[0] == pulls[1]  # one Secret for the job, beside the cluster's own (imagePullSecret)
    made = [p["name"] for p in pulls[0] if p["name"] != task_launch().imagePullSecret]
    assert len(made) == 1
    name = made[0]
    secret = secret_named(cluster, name)
    assert secret is not None and secret["type"] == "kubernetes.io/dockerconfigjson"
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert config == {"auths": {"registry.example:5000": {"auth": base64.b64encode(b"bot:registry-pass").decode()}}}
    assert "registry-pass" not in json.dumps(pod_of(cluster, first))

    for key in (first, second):
        pod = kube_names.pod_name(key)
        await cluster.kubelet.run(pod)
        await events.next(TaskRunning, key)
        await cluster.kubelet.exit(pod, 0)
        await events.next(TaskFinished, key)
    await backend.forget(first)
    assert secret_named(cluster, name) is not None  # the job still has a Pod
    await backend.forget(second)
    assert secret_named(cluster, name) is None


async def test_an_image_without_credentials_makes_no_pull_secret(cluster):
    backend, _ = await cluster.backend()
    key = task_key()
    await backend.start(task_launch(key, dockerImageUri="busybox", imagePullSecret=None))
    assert "imagePullSecrets" not in pod_of(cluster, key)["spec"]
    assert all(request.resource is None or request.resource.plural != "secrets" for request in cluster.emulator)


async def test_a_registry_secret_left_by_a_launcher_that_died_is_removed_at_recovery(cluster):
    backend, _ = await cluster.backend()
    live = task_key(job="alice~live")
    await backend.start(task_launch(live, dockerImageAuth=AUTH))
    # What a launcher that died between deleting a job's last Pod and its Secret leaves.
    left = registry_secret(task_launch(task_key(job="alice~gone"), dockerImageAuth=AUTH), NAMESPACE)
    assert left is not None
    await backend._json(backend._api.create_namespaced_secret(NAMESPACE, left, _preload_content=False))
    await backend.close()

    restarted, _ = await cluster.backend()
    await restarted.recover()

    assert secret_named(cluster, left["metadata"]["name"]) is None
    live_secret = registry_secret_name(live.job, AUTH)
    assert secret_named(cluster, live_secret) is not None  # its job still has a Pod


async def test_a_clusters_own_pull_secret_is_never_deleted(cluster):
    backend, events = await cluster.backend()
    key = task_key()
    await backend.start(task_launch(key, imagePullSecret="site-regcred-shared", dockerImageAuth=AUTH))
    await backend._json(backend._api.create_namespaced_secret(NAMESPACE, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "site-regcred-shared"}, "type": "Opaque"},
        _preload_content=False))
    pod = kube_names.pod_name(key)
    await cluster.kubelet.run(pod)
    await events.next(TaskRunning, key)
    await cluster.kubelet.exit(pod, 0)
    await events.next(TaskFinished, key)
    await backend.forget(key)
    assert secret_named(cluster, "site-regcred-shared") is not None
    assert secret_named(cluster, registry_secret_name(key.job, AUTH)) is None
