"""The ssh plugin on the Kubernetes backend, whatever the task's image: the Pod of a task
whose role runs the plugin gets an init container of PAI's launcher image writing the
sshd bundle into an emptyDir the task sees read-only at /pai/ssh, a writable working
directory, the plugin's port as a host port, and the job's key through the task's
script Secret, never in the Pod. Checked against Kubernetes' published schemas
(kubernetes-validate, strict). The bundle the init container makes, run under the
Pod's restricted securityContext: tests/integration/test_kube_ssh_restricted.py."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import kubernetes_validate
import pytest

from libs.common.messages import TaskPlacement
from libs.common.protocol import ssh as protocol_ssh
from libs.common.protocol.render import render_secrets
from services.launcher.backends import ssh_bundle
from services.launcher.backends.kube_pods import build_pod, task_script
from services.launcher.backends.kube_status import Exited, PullFailing, judge
from services.launcher.backends.kubernetes import SECRET_SCRIPT_ENV, with_secret_script
from services.launcher.core.tasks import TaskKey, TaskLaunch

VERSION = "1.30.0"
PAI_IMAGE = "registry.example/pai-launcher:0.2.0"
SSH_PORT = 20002


def ssh_launch(**overrides) -> tuple[TaskLaunch, str]:
    """A task of a role running the plugin, its commands as rest folds the plugin in."""
    key = TaskKey(job="alice~train", attempt=1, role="worker", index=0, taskAttempt=1)
    private, public = protocol_ssh.generate_key_pair("alice~train")
    profile_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIProfileKeyOfAlice"
    step = protocol_ssh.server_script("alice", public, [public.rsplit(" ", 1)[0], profile_key])
    fields = dict(
        key=key, vc="default", user="alice",
        placement=TaskPlacement(role="worker", index=0, node="node-a", hostIp="10.0.0.1"),
        commands=[step, protocol_ssh.exports(), "python train.py"],
        env={"PAI_JOB_NAME": key.job, "PAI_CONTAINER_SSH_PORT": str(SSH_PORT)},
        cpu=2, memoryMB=2048, gpu=1, dockerImageUri="busybox:1.36",
        ports={"ssh": [SSH_PORT], "http": [20001]},
    )
    fields.update(overrides)
    return TaskLaunch(**fields), private


def test_an_ssh_task_pod_gets_the_bundle_from_pais_image_through_an_init_container():
    launch, private = ssh_launch()
    pod = build_pod(launch, namespace="pai-jobs", ssh_image=PAI_IMAGE)
    secret = with_secret_script(pod, task_script([render_secrets(c, {protocol_ssh.SECRET_NAME: private})
                                                  for c in launch.commands]))
    kubernetes_validate.validate(pod, VERSION, strict=True)
    kubernetes_validate.validate(secret, VERSION, strict=True)
    spec = pod["spec"]
    (init,) = spec["initContainers"]
    (task,) = spec["containers"]
    assert init["image"] == PAI_IMAGE and task["image"] == "busybox:1.36"
    assert init["command"] == ["python", "-m", "services.launcher.backends.ssh_bundle", "/pai/ssh"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    init_mount = {m["mountPath"]: m for m in init["volumeMounts"]}["/pai/ssh"]
    task_mounts = {m["mountPath"]: m for m in task["volumeMounts"]}
    # The same emptyDir: written by the init container, read-only to the task.
    assert task_mounts["/pai/ssh"]["name"] == init_mount["name"]
    assert task_mounts["/pai/ssh"]["readOnly"] is True and not init_mount.get("readOnly")
    assert "emptyDir" in volumes[init_mount["name"]]
    # A working directory the job's uid may write (its .ssh: config, host key, passwd).
    assert "emptyDir" in volumes[task_mounts["/pai/work"]["name"]]
    env = {e["name"]: e for e in task["env"]}
    assert env["PAI_WORK_DIR"]["value"] == "/pai/work" and env["PAI_CONTAINER_SSH_PORT"]["value"] == str(SSH_PORT)
    # The plugin's port from the job's range, reachable at the node's address.
    assert {"containerPort": SSH_PORT, "hostPort": SSH_PORT, "protocol": "TCP"} in task["ports"]
    # The job's key: in the task's script Secret, read through its reference; not in the Pod.
    assert env[SECRET_SCRIPT_ENV]["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "script"}
    script = base64.b64decode(secret["data"]["script"]).decode()
    assert private.strip() in script and "AAAAIProfileKeyOfAlice" in script
    assert private.strip().splitlines()[1] not in json.dumps(pod)
    # The init container under the same restricted securityContext as the task, no GPU.
    assert init["securityContext"] == task["securityContext"] == {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert "nvidia.com/gpu" not in init["resources"]["limits"]
    assert init["resources"]["requests"] == task["resources"]["requests"]  # the Pod asks the node no more


def test_a_task_without_the_plugin_gets_no_init_container_nor_volumes():
    launch, _ = ssh_launch(env={"PAI_JOB_NAME": "alice~train"}, ports={"http": [20001]})
    spec = build_pod(launch, namespace="pai-jobs", ssh_image=PAI_IMAGE)["spec"]
    assert "initContainers" not in spec
    assert [v["name"] for v in spec["volumes"]] == ["dshm"]
    assert "PAI_WORK_DIR" not in {e["name"] for e in spec["containers"][0]["env"]}


def test_without_pais_image_the_task_gets_its_working_directory_and_no_bundle():
    launch, _ = ssh_launch()
    pod = build_pod(launch, namespace="pai-jobs")
    kubernetes_validate.validate(pod, VERSION, strict=True)
    spec = pod["spec"]
    assert "initContainers" not in spec  # the step uses the image's own sshd, or says it has none
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert "/pai/work" in mounts and "/pai/ssh" not in mounts


def _with_init(waiting: dict) -> dict:
    return {"metadata": {"name": "p"}, "spec": {"nodeName": "node-a"}, "status": {
        "phase": "Pending",
        "initContainerStatuses": [{"name": "pai-ssh-bundle", "state": {"waiting": waiting}}],
        "containerStatuses": [{"name": "worker", "state": {"waiting": {"reason": "PodInitializing"}}}]}}


def test_pais_image_failing_to_pull_for_the_init_container_ends_the_task_as_an_image_pull_failure():
    pod = _with_init({"reason": "ImagePullBackOff", "message": "pai-launcher:0.2.0 not found"})
    assert judge(pod, now=100.0, pull_since=90.0, pull_timeout=60) == PullFailing(deadline=150.0)
    ended = judge(pod, now=200.0, pull_since=90.0, pull_timeout=60)
    assert isinstance(ended, Exited) and ended.platformReason == "ImagePullBackOff"
    assert "pai-launcher:0.2.0 not found" in ended.platformMessage and ended.endPod


HAVE_OPENSSH = os.access(protocol_ssh.SSHD, os.X_OK) and os.access(ssh_bundle.SSH_CLIENT, os.X_OK) \
    and bool(list(Path("/usr/lib").glob(f"*/{protocol_ssh.NSS_WRAPPER}")))


@pytest.mark.skipif(not HAVE_OPENSSH, reason="needs openssh-server, openssh-client and libnss-wrapper (make test's ssh-deps)")
def test_the_init_containers_command_writes_the_bundle_into_the_empty_directory(tmp_path: Path, capsys):
    assert ssh_bundle.main([str(tmp_path)]) == 0
    assert (tmp_path / "sbin" / "sshd").read_text().startswith("#!/bin/sh\n")
    assert (tmp_path / "libexec" / "sshd").read_bytes() == Path(protocol_ssh.SSHD).read_bytes()
    assert (tmp_path / "lib" / protocol_ssh.NSS_WRAPPER).exists()
    assert "server bundle made" in capsys.readouterr().err


def test_the_init_container_never_fails_the_pod_where_it_cannot_make_the_bundle(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setattr(ssh_bundle, "_nss_wrapper", lambda: None)
    assert ssh_bundle.main([str(tmp_path)]) == 0
    assert list(tmp_path.iterdir()) == []
    said = capsys.readouterr().err
    assert "no server bundle for this task" in said and "libnss-wrapper" in said
