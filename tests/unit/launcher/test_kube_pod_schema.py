"""The Pods (and Secrets) the Kubernetes backend makes, checked against Kubernetes' own
published OpenAPI schemas (kubernetes-validate, strict: an unknown field is an error),
not only against PAI's API emulator: every kind of storage, shm, GPUs, ports, a
registry login and a task whose script comes from a Secret."""

from __future__ import annotations

import kubernetes_validate
import pytest

from libs.common.messages import TaskPlacement
from libs.common.storages import Storage, StorageData
from services.launcher.backends.kube_pods import build_pod, registry_secret
from services.launcher.backends.kubernetes import with_secret_script
from services.launcher.core.tasks import TaskKey, TaskLaunch

VERSION = "1.30.0"  # a release the schemas ship for and clusters run

STORAGES = [
    Storage(name="Team_Data", type="hostPath", data=StorageData(path="/srv/pai-storage/team")),
    Storage(name="share", type="nfs", data=StorageData(server="nfs.example", path="/export"), readOnly=True,
            mountOptions=["vers=4"]),
    Storage(name="ckpt", type="pvc", mountPath="/checkpoints"),
]


def launch(**overrides) -> TaskLaunch:
    key = TaskKey(job="Alice~MNIST_v2", attempt=3, role="Worker_Role", index=7, taskAttempt=1)
    fields = dict(
        key=key, vc="research", user="Alice",
        placement=TaskPlacement(role=key.role, index=key.index, node="gpu-node-3", hostIp="10.0.0.3", gpus=[2, 3],
                                skuType="V100"),
        commands=["python train.py"], env={"PAI_JOB_NAME": key.job}, cpu=4, memoryMB=8192, gpu=2,
        ports={"http": [20001], "ssh": [20002]},
    )
    return TaskLaunch(**{**fields, **overrides})


CASES = {
    "plain": launch(),
    "cpu only, no ports": launch(gpu=0, ports={}, placement=TaskPlacement(role="Worker_Role", index=7, node="n",
                                                                          hostIp="10.0.0.4")),
    "storages and shm": launch(storages=STORAGES, shmMB=4096),
    "the user's own part of a storage": launch(storages=[Storage(
        name="team", type="hostPath", data=StorageData(path="/srv/team"), subPath="Alice")]),
    "registry login": launch(dockerImageUri="registry.example:5000/team/train:1",
                             dockerImageAuth={"username": "bot", "password": "p", "registryuri": "registry.example:5000"}),
    "cluster pull secret and login": launch(imagePullSecret="cluster-registry", dockerImageAuth={"username": "u"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_pod_is_valid_against_kubernetes_schemas(case: str) -> None:
    kubernetes_validate.validate(build_pod(CASES[case], namespace="pai-jobs"), VERSION, strict=True)


def test_a_pod_whose_script_is_in_a_secret_and_that_secret_are_valid() -> None:
    pod = build_pod(CASES["storages and shm"], namespace="pai-jobs")
    secret = with_secret_script(pod, "set -e\necho hi\n")
    kubernetes_validate.validate(pod, VERSION, strict=True)
    kubernetes_validate.validate(secret, VERSION, strict=True)


def test_the_registry_secret_is_valid() -> None:
    secret = registry_secret(CASES["registry login"], "pai-jobs")
    assert secret is not None
    kubernetes_validate.validate(secret, VERSION, strict=True)


def test_the_schema_check_catches_a_broken_pod() -> None:
    # The check is real: a volume of no known type, or a misspelt field, is refused.
    pod = build_pod(CASES["storages and shm"], namespace="pai-jobs")
    pod["spec"]["volumes"][1]["hostPth"] = pod["spec"]["volumes"][1].pop("hostPath")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, VERSION, strict=True)


@pytest.mark.parametrize("case", list(CASES))
def test_every_pod_runs_least_privileged_on_the_pod_network_by_default(case: str) -> None:
    # Kubernetes' "restricted" Pod Security profile: non-root, no escalation, no
    # capabilities, the runtime's seccomp profile; the Pod network unless asked.
    pod = build_pod(CASES[case], namespace="pai-jobs", run_as=(1234, 5678))
    spec = pod["spec"]
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1234, "runAsGroup": 5678,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = spec["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert spec["hostNetwork"] is False and "dnsPolicy" not in spec
    assert spec["automountServiceAccountToken"] is False


def test_an_admin_may_put_a_pod_on_the_node_network_and_it_stays_valid() -> None:
    pod = build_pod(CASES["plain"], namespace="pai-jobs", host_network=True)
    assert pod["spec"]["hostNetwork"] is True and pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    kubernetes_validate.validate(pod, VERSION, strict=True)


def test_the_backend_refuses_to_run_tasks_as_root() -> None:
    from services.launcher.backends.kubernetes import KubernetesBackend

    with pytest.raises(ValueError, match="kube_task_uid"):
        KubernetesBackend(None, namespace="pai-jobs", connect=lambda: None, run_as=(0, 0))  # type: ignore[arg-type,return-value]


def test_a_job_may_ask_for_its_nodes_network() -> None:
    pod = build_pod(launch(hostNetwork=True), namespace="pai-jobs")
    assert pod["spec"]["hostNetwork"] is True
    kubernetes_validate.validate(pod, VERSION, strict=True)


def test_the_job_protocol_carries_the_host_network_request_to_the_launch() -> None:
    from libs.common.protocol import parse_job

    text = ("protocolVersion: 2\nname: net\ntype: job\nprerequisites:\n- {name: img, type: dockerimage, uri: 'busybox:1'}\n"
            "taskRoles:\n  main:\n    instances: 1\n    dockerImage: img\n"
            "    extraContainerOptions: {hostNetwork: true}\n    commands: [echo hi]\n")
    parsed = parse_job(text, user="alice")
    (role,) = parsed.spec.taskRoles
    assert role.hostNetwork is True
    assert not [w for w in parsed.warnings if "hostNetwork" in w]
