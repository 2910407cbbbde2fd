"""The Pod of one task instance, and what PAI records on it.

The Pod is the backend's durable record (like a task directory of the local
backend): everything needed to recognise it after a launcher restart is in
its annotations, so nothing else has to be stored.

What a Pod looks like:
- name from the task key (kube_names.pod_name), PAI's labels, and the
  finalizer `pai/exit-record`: a Pod deleted by anyone (PAI's stop, an
  eviction, `kubectl delete`) stays visible, with its final status, until PAI
  has recorded its exit and calls `forget` (the Job controller of Kubernetes
  uses a finalizer on its Pods for the same reason);
- `spec.nodeName` = the placed node: the scheduler of PAI has decided, so the
  Pod bypasses the Kubernetes scheduler, as Pods bound by HiveD do;
- `restartPolicy: Never`: retries are the launcher's decision, not the kubelet's;
- one container, named after the task role, running
  `/bin/bash -c "set -e; <commands>"` so the commands stop at the first
  failure, as in the local backend;
- the image `dockerImageUri`, or DEFAULT_IMAGE when the job names none;
- requests = limits for cpu and memory (a task that exceeds `memoryMB` is
  OOM-killed, which the runtime explains), `nvidia.com/gpu` limits when it has
  GPUs;
- env = the launcher's PAI_* variables; CUDA_VISIBLE_DEVICES counts from 0
  inside the container (the device plugin exposes the Pod's GPUs as 0..n-1),
  while the physical indices the scheduler chose are in the HiveD annotation;
- no service account token and no Service environment variables in the Pod;
- least privilege: the Pod network, unless the admin asks for the node's
  (`kube_host_network`, as OpenPAI runs its jobs) or the job does
  (`extraContainerOptions.hostNetwork`, where `kube_job_host_network` lets it); either way every port PAI
  gave the task is declared as a container port with the same host port, so
  PAI_HOST_IP_* and those ports reach the task on the node's address; and
  Kubernetes' "restricted" securityContext: a non-root uid and gid
  (`kube_task_uid`, `kube_task_gid`), no privilege escalation, every
  capability dropped, the runtime's default seccomp profile;
- volumes: `/dev/shm` a memory-backed emptyDir of the role's shmMB (OpenPAI's 512
  when unset, its size charged to the Pod's memory), and each of the job's
  storages (libs/common/storages.py) at its mount path: hostPath, nfs or
  persistentVolumeClaim, read-only where declared so;
- the ssh plugin (a task given an `ssh` port, libs/common/protocol/ssh.py): an init
  container running PAI's own launcher image (`kube_ssh_image`) writes the sshd bundle
  (services/launcher/backends/ssh_bundle.py: sshd, ssh, their libraries and loader)
  into an emptyDir that the task sees read-only at /pai/ssh, so any image runs the
  server; the task gets a writable emptyDir at /pai/work as PAI_WORK_DIR, where the
  step keeps its config, host key and passwd file (the image's own directories are not
  the job's uid's to write). The job's key reaches the step as every job secret does (the
  task's script Secret); the authorised public keys are in its script;
- `imagePullSecrets`: the job's registry credentials (its image prerequisite's
  `auth`), as a Secret of type dockerconfigjson per job and registry login
  (`registry_secret`, made before the Pod, deleted with the job's last Pod);
- annotations: HiveD's `pod-leaf-cell-isolation` ("0,1": the physical GPU
  indices) and `pod-bind-info` (node, GPUs, sku), and `pai/task` holding the
  TaskKey, user, VC and placement as JSON, read back by recovery;
  `pai/end` is added when PAI ends the Pod itself (stop, preemption, an image
  that cannot be pulled), so the reason survives a launcher restart.
"""

from __future__ import annotations

import base64
import json

import msgspec

from libs.common.messages import TaskPlacement
from libs.common.storages import Storage, claim_name, mount_path
from services.launcher.backends import kube_names, ssh_bundle
from services.launcher.core.mounts import shm_mb
from services.launcher.core.tasks import TaskKey, TaskLaunch

DEFAULT_IMAGE = "python:3.11-slim"
DEFAULT_RUN_AS = (1000, 1000)  # uid, gid: Config.kube_task_uid, kube_task_gid
FINALIZER = "pai/exit-record"
TASK_ANNOTATION = "pai/task"
END_ANNOTATION = "pai/end"
LEAF_CELL_ISOLATION_ANNOTATION = "hivedscheduler.microsoft.com/pod-leaf-cell-isolation"
BIND_INFO_ANNOTATION = "hivedscheduler.microsoft.com/pod-bind-info"
GPU_RESOURCE = "nvidia.com/gpu"
SHELL = "/bin/bash"
SHM_VOLUME = "dshm"
SSH_VOLUME = "pai-ssh"  # the sshd bundle, written by the init container
SSH_INIT_CONTAINER = "pai-ssh-bundle"
# The bundle is ~15 MiB (sshd, ssh, libc, libcrypto, ...); the bound keeps a wrong image from filling the node.
SSH_VOLUME_LIMIT = "128Mi"
WORK_VOLUME = "pai-work"
WORK_DIR = "/pai/work"  # as in a local container task (local_containers.CONTAINER_WORK_DIR)
# Where an image prerequisite without `registryuri` is pulled from (OpenPAI's default).
DEFAULT_REGISTRY = "https://index.docker.io/v1/"
KIND_LABEL = "pai/kind"
# The job's registry Secret a Pod pulls with (PAI's own, deleted with the job's last Pod);
# a cluster's own pull secret (imagePullSecret) is never named here, so never deleted.
REGISTRY_SECRET_ANNOTATION = "pai/registry-secret"
REGISTRY_SECRET_KIND = "regcred"


class PodRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What recovery needs to know about a Pod: which task it runs, for whom, where."""

    key: TaskKey
    user: str
    vc: str
    placement: TaskPlacement


class EndRequest(msgspec.Struct, frozen=True, kw_only=True):
    """PAI ended this Pod on purpose; its exit carries `reason`, not a guess."""

    reason: str
    message: str = ""
    graceSeconds: float = 0.0
    requestedAt: float = 0.0  # wall-clock seconds


class BindInfo(msgspec.Struct, frozen=True, kw_only=True):
    """HiveD's record of where a Pod was bound, trimmed to what PAI decides."""

    node: str
    leafCellIsolation: list[int]
    cellChain: str = ""


def build_pod(
    launch: TaskLaunch,
    *,
    namespace: str,
    default_image: str = DEFAULT_IMAGE,
    host_network: bool = False,
    run_as: tuple[int, int] = DEFAULT_RUN_AS,
    ssh_image: str = "",
) -> dict:
    """The Pod manifest (as the JSON the API takes) for one task instance; `ssh_image`:
    PAI's image the ssh plugin's bundle is made from (empty: none, the image's own sshd)."""
    uid, gid = run_as
    host_network = host_network or launch.hostNetwork  # the admin's choice, or the job's where allowed
    key, placement = launch.key, launch.placement
    record = PodRecord(key=key, user=launch.user, vc=launch.vc, placement=placement)
    bind_info = BindInfo(node=placement.node, leafCellIsolation=list(placement.gpus), cellChain=placement.skuType)
    annotations = {
        LEAF_CELL_ISOLATION_ANNOTATION: ",".join(str(gpu) for gpu in placement.gpus),
        BIND_INFO_ANNOTATION: msgspec.json.encode(bind_info).decode(),
        TASK_ANNOTATION: msgspec.json.encode(record).decode(),
    }
    container: dict = {
        "name": kube_names.dns_label(key.role, fallback="task"),
        "image": launch.dockerImageUri or default_image,
        "command": [SHELL, "-c", task_script(launch.commands)],
        "env": [{"name": name, "value": value} for name, value in sorted(container_env(launch).items())],
        "resources": _resources(launch),
        "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    volumes: list[dict] = [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_mb(launch.shmMB)}Mi"}}]
    for storage in launch.storages:
        volume, mount = storage_volume(storage)
        volumes.append(volume)
        container["volumeMounts"].append(mount)
    init_containers = _ssh_plugin(launch, container, volumes, ssh_image) if ssh_bundle.wants_ssh(launch.env) else []
    ports = sorted({port for label_ports in launch.ports.values() for port in label_ports})
    if ports:
        container["ports"] = [{"containerPort": port, "hostPort": port, "protocol": "TCP"} for port in ports]
    spec: dict = {
        "nodeName": placement.node,
        "restartPolicy": "Never",
        "hostNetwork": host_network,
        # A task needs no credentials for the cluster's API, nor an environment
        # variable for every Service of the namespace.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if host_network:
        # Keep cluster DNS names resolvable from a Pod on the host's network.
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    pull_secrets = [launch.imagePullSecret] if launch.imagePullSecret else []
    if launch.dockerImageAuth:
        pull_secrets.append(registry_secret_name(launch.key.job, launch.dockerImageAuth))
        annotations[REGISTRY_SECRET_ANNOTATION] = pull_secrets[-1]
    if pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": kube_names.pod_name(key),
            "namespace": namespace,
            "labels": kube_names.task_labels(key, user=launch.user, vc=launch.vc),
            "annotations": annotations,
            "finalizers": [FINALIZER],
        },
        "spec": spec,
    }


def _ssh_plugin(launch: TaskLaunch, container: dict, volumes: list[dict], ssh_image: str) -> list[dict]:
    """Give the ssh plugin's task (`container`, changed in place) its working directory
    and, with `ssh_image`, the bundle; the init containers that make it."""
    volumes.append({"name": WORK_VOLUME, "emptyDir": {}})
    container["volumeMounts"].append({"name": WORK_VOLUME, "mountPath": WORK_DIR})
    if "PAI_WORK_DIR" not in launch.env:
        container["env"] = sorted([*container["env"], {"name": "PAI_WORK_DIR", "value": WORK_DIR}],
                                  key=lambda e: e["name"])
    if not ssh_image:
        return []
    volumes.append({"name": SSH_VOLUME, "emptyDir": {"sizeLimit": SSH_VOLUME_LIMIT}})
    container["volumeMounts"].append({"name": SSH_VOLUME, "mountPath": ssh_bundle.MOUNT_POINT, "readOnly": True})
    # Requests = limits as the task's (without GPUs): the Pod keeps its QoS class and what it
    # asks of the node (the larger of an init container's and the task's).
    resources = {part: {k: v for k, v in amounts.items() if k != GPU_RESOURCE}
                 for part, amounts in container["resources"].items()}
    return [{
        "name": SSH_INIT_CONTAINER,
        "image": ssh_image,
        "command": ["python", "-m", "services.launcher.backends.ssh_bundle", ssh_bundle.MOUNT_POINT],
        "resources": resources,
        "volumeMounts": [{"name": SSH_VOLUME, "mountPath": ssh_bundle.MOUNT_POINT}],
        "securityContext": dict(container["securityContext"]),
    }]


def storage_volume(storage: Storage) -> tuple[dict, dict]:
    """The Pod volume of one storage and its container mount."""
    name = kube_names.dns_label(f"storage-{storage.name}", fallback="storage")
    volume: dict = {"name": name}
    match storage.type:
        case "hostPath":
            volume["hostPath"] = {"path": storage.data.path, "type": "DirectoryOrCreate"}
        case "nfs":
            volume["nfs"] = {"server": storage.data.server, "path": storage.data.path, "readOnly": storage.readOnly}
        case "pvc":
            volume["persistentVolumeClaim"] = {"claimName": claim_name(storage), "readOnly": storage.readOnly}
    mount = {"name": name, "mountPath": mount_path(storage), "readOnly": storage.readOnly}
    if storage.subPath:
        mount["subPath"] = storage.subPath  # the user's own directory (share: false)
    return volume, mount


def registry_secret_name(job: str, auth: dict[str, str]) -> str:
    """One Secret per job and registry login: the same for every task of the job that pulls with it."""
    login = f"{auth.get('registryuri') or DEFAULT_REGISTRY}\0{auth.get('username', '')}"
    return kube_names.dns_label(f"{kube_names.job_label(job)}-regcred-{kube_names.short_hash(login)}",
                                fallback="regcred")


def registry_secret(launch: TaskLaunch, namespace: str) -> dict | None:
    """The Secret (kubernetes.io/dockerconfigjson) the task's Pod pulls its image with, as
    OpenPAI's rest server makes it; None for an image without credentials."""
    auth = launch.dockerImageAuth
    if not auth:
        return None
    login = f"{auth.get('username', '')}:{auth.get('password', '')}"
    config = {"auths": {auth.get("registryuri") or DEFAULT_REGISTRY: {
        "auth": base64.b64encode(login.encode()).decode()}}}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": registry_secret_name(launch.key.job, auth),
            "namespace": namespace,
            "labels": {
                kube_names.MANAGED_BY_LABEL: kube_names.MANAGED_BY_VALUE,
                kube_names.JOB_LABEL: kube_names.job_label(launch.key.job),
                KIND_LABEL: REGISTRY_SECRET_KIND,
            },
        },
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()},
    }


def registry_secrets_of(pod: dict) -> list[str]:
    """The job's registry Secret a Pod pulls with, as PAI made it (deleted with the job's last Pod)."""
    name = _annotations(pod).get(REGISTRY_SECRET_ANNOTATION)
    return [name] if isinstance(name, str) and name else []


def task_script(commands: list[str]) -> str:
    # `set -e`: the same stop-at-first-failure rule as the local backend's `bash -e`.
    return "set -e\n" + "".join(f"{command}\n" for command in commands)


def container_env(launch: TaskLaunch) -> dict[str, str]:
    env = dict(launch.env)
    if launch.gpu > 0:
        # The device plugin maps the Pod's GPUs to 0..n-1 inside the container;
        # the node's own indices would name devices the container cannot see.
        count = len(launch.placement.gpus) or launch.gpu
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(count))
    return env


def _resources(launch: TaskLaunch) -> dict:
    amounts = {"cpu": str(launch.cpu), "memory": f"{launch.memoryMB}Mi"}
    limits = dict(amounts)
    if launch.gpu > 0:
        limits[GPU_RESOURCE] = str(launch.gpu)
    return {"requests": amounts, "limits": limits}


def read_record(pod: dict) -> PodRecord | None:
    """The task a Pod runs, from its annotation; None for a Pod PAI did not make."""
    raw = _annotations(pod).get(TASK_ANNOTATION)
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw, type=PodRecord)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def read_end(pod: dict) -> EndRequest | None:
    raw = _annotations(pod).get(END_ANNOTATION)
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw, type=EndRequest)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


def end_patch(end: EndRequest) -> dict:
    """A merge patch recording why PAI ends the Pod, sent before the delete."""
    return {"metadata": {"annotations": {END_ANNOTATION: msgspec.json.encode(end).decode()}}}


def release_patch(pod: dict) -> dict:
    """A merge patch removing PAI's finalizer, leaving any other in place."""
    finalizers = [f for f in (pod.get("metadata") or {}).get("finalizers") or [] if f != FINALIZER]
    return {"metadata": {"finalizers": finalizers or None}}


def holds_finalizer(pod: dict) -> bool:
    return FINALIZER in ((pod.get("metadata") or {}).get("finalizers") or [])


def _annotations(pod: dict) -> dict:
    return (pod.get("metadata") or {}).get("annotations") or {}
