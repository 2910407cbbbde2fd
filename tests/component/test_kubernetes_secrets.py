"""The Kubernetes backend keeps a task's secrets out of its Pod: they are in a
Secret of the task's own, read through `valueFrom.secretKeyRef`, and removed
with the Pod."""

from __future__ import annotations

import base64
import json
import subprocess

from services.launcher.backends import kube_names
from services.launcher.backends.kubernetes import SECRET_SCRIPT_ENV, SECRET_SCRIPT_LOADER
from services.launcher.core.tasks import TaskFinished, TaskRunning
from tests.component.test_kubernetes_backend import cluster, pod_of, task_key, task_launch  # noqa: F401 - fixture

SECRET = "s3cret-Kube-Value"
REFERENCES = ["login --token <% $secrets.token %>", "python train.py"]
FILLED_IN = [f"login --token {SECRET}", "python train.py"]


def secret_named(cluster, name: str) -> dict | None:
    for (resource, _ns, obj_name), obj in cluster.emulator.objects.items():
        if resource.plural == "secrets" and obj_name == name and not obj.deleted:
            return obj.raw
    return None


async def test_a_task_with_secrets_reads_its_script_from_a_secret_of_its_own(cluster):
    backend, events = await cluster.backend()
    key = task_key()
    await backend.start(task_launch(key, commands=REFERENCES), secret_commands=FILLED_IN)

    pod = pod_of(cluster, key)
    name = kube_names.pod_name(key)
    assert SECRET not in json.dumps(pod)
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["/bin/bash", "-c", SECRET_SCRIPT_LOADER]
    script_env = [item for item in container["env"] if item["name"] == SECRET_SCRIPT_ENV]
    assert script_env == [{"name": SECRET_SCRIPT_ENV, "valueFrom": {"secretKeyRef": {"name": name, "key": "script"}}}]

    secret = secret_named(cluster, name)
    assert secret is not None and secret["metadata"]["labels"] == pod["metadata"]["labels"]
    script = base64.b64decode(secret["data"]["script"]).decode()
    assert script.startswith("set -e") and f"login --token {SECRET}\npython train.py" in script

    await cluster.kubelet.run(name)
    await events.next(TaskRunning, key)
    await cluster.kubelet.exit(name, 0)
    await events.next(TaskFinished, key)
    await backend.forget(key)
    assert cluster.emulator.pod(name) is None and secret_named(cluster, name) is None


async def test_a_task_without_secrets_makes_no_secret(cluster):
    backend, _ = await cluster.backend()
    key = task_key()
    await backend.start(task_launch(key))
    assert secret_named(cluster, kube_names.pod_name(key)) is None
    assert all(request.resource is None or request.resource.plural != "secrets" for request in cluster.emulator)


def test_the_loader_runs_the_script_from_the_variable_and_hides_it_from_children():
    # The container's shell, as the kubelet would start it, with the Secret's value in its environment.
    script = "set -e\necho first\nenv | grep -c PAI_TASK_SCRIPT || true\nfalse\necho never\n"
    done = subprocess.run(["bash", "-c", SECRET_SCRIPT_LOADER], env={SECRET_SCRIPT_ENV: script, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)
    assert done.stdout.split() == ["first", "0"]
    assert done.returncode == 1
