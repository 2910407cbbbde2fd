"""The ssh plugin's server under a Kubernetes task Pod's restricted securityContext, with
real parts: the Pod the launcher makes for an ssh job (kube_pods.build_pod) played by
podman on this machine. Its init container's command writes the sshd bundle into an
empty directory (run here on the node, as the Pod's uid, with no capabilities and no
privilege escalation: the launcher image it names is not built on the dev machines);
its task container runs the Pod's script from its Secret in an image without OpenSSH
nor a C library (busybox-static), as the Pod's uid and gid, every capability dropped,
no_new_privs, the engine's default seccomp profile (what RuntimeDefault is), the bundle
read-only at /pai/ssh and the working directory an empty one. Debian's ssh client then
logs in with the job's key and with a profile key, and is refused with another key.

What differs from a cluster: the container shares the node's network (the Pod network
and its host port are the CNI's), and its shell is /bin/sh, the image having no bash
(the Pod runs /bin/bash; the step is written for both).
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from libs.common.messages import TaskPlacement
from libs.common.protocol import ssh as protocol_ssh
from libs.common.protocol.render import render_secrets
from services.launcher.backends import engine as engine_api
from services.launcher.backends.kube_pods import build_pod, task_script
from services.launcher.backends.kubernetes import SECRET_SCRIPT_ENV, with_secret_script
from services.launcher.core.tasks import TaskKey, TaskLaunch
from tests.integration.test_ssh import keygen, ssh

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/pai-test-busybox:1"
LOGIN = "alice"


def _unavailable() -> str | None:
    if shutil.which("podman") is None or shutil.which("setpriv") is None:
        return "needs podman and setpriv (make container-deps)"
    if os.geteuid() != 0:
        return "runs rootful podman and setpriv: run as root"
    if not (os.access(protocol_ssh.SSHD, os.X_OK) and shutil.which("ssh") and shutil.which("ssh-keygen")
            and list(Path("/usr/lib").glob(f"*/{protocol_ssh.NSS_WRAPPER}"))):
        return "needs Debian's openssh-server, openssh-client and libnss-wrapper (make test's ssh-deps)"
    if subprocess.run(["sh", str(REPO / "tests/containers/build-images.sh")], env=engine_api.podman_env(),
                      capture_output=True).returncode:
        return "the test image could not be built (tests/containers/build-images.sh)"
    return None


UNAVAILABLE = _unavailable()
if UNAVAILABLE:
    pytest.skip(UNAVAILABLE, allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sshd_runs_in_a_restricted_pod_of_an_image_without_openssh(tmp_path: Path):
    port = free_port()
    private, public = protocol_ssh.generate_key_pair("alice~ksshr")
    profile_key, profile_pub = keygen(tmp_path, "profile")
    stranger_key, _ = keygen(tmp_path, "stranger")
    authorized = [public.rsplit(" ", 1)[0], protocol_ssh.public_key_line(profile_pub) or ""]
    key = TaskKey(job="alice~ksshr", attempt=1, role="worker", index=0, taskAttempt=1)
    launch = TaskLaunch(
        key=key, vc="default", user=LOGIN,
        placement=TaskPlacement(role="worker", index=0, node="node-a", hostIp="127.0.0.1"),
        commands=[protocol_ssh.server_script(LOGIN, public, authorized), protocol_ssh.exports(), "sleep 120"],
        env={"PAI_JOB_NAME": key.job, "PAI_CONTAINER_SSH_PORT": str(port), "PAI_CURRENT_TASK_ROLE_NAME": "worker"},
        dockerImageUri=IMAGE, ports={"ssh": [port]},
    )
    pod = build_pod(launch, namespace="pai-jobs", ssh_image="pai-launcher:test")
    secret = with_secret_script(pod, task_script([render_secrets(c, {protocol_ssh.SECRET_NAME: private})
                                                  for c in launch.commands]))
    spec = pod["spec"]
    (init,), (task,) = spec["initContainers"], spec["containers"]
    pod_ctx, ctx = spec["securityContext"], task["securityContext"]
    assert pod_ctx["runAsNonRoot"] and pod_ctx["runAsUser"] != 0 and pod_ctx["seccompProfile"]["type"] == "RuntimeDefault"
    assert ctx == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}} == init["securityContext"]
    uid, gid = pod_ctx["runAsUser"], pod_ctx["runAsGroup"]

    # The Pod's emptyDirs: world-writable directories, as the kubelet makes them.
    dirs = {v["name"]: tmp_path / v["name"] for v in spec["volumes"] if "emptyDir" in v}
    for made in dirs.values():
        made.mkdir()
        made.chmod(0o777)
    # The init container: its command, as the Pod's uid, unprivileged, into its emptyDir.
    (init_mount,) = init["volumeMounts"]
    python, *args, into = init["command"]
    assert python == "python" and into == init_mount["mountPath"]
    made = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs",
                           "--inh-caps=-all", "--bounding-set=-all", "--", sys.executable, *args,
                           str(dirs[init_mount["name"]])], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and "server bundle made" in made.stderr, made.stderr

    # The task container, as the Pod says.
    assert not ctx["allowPrivilegeEscalation"] and ctx["capabilities"]["drop"] == ["ALL"]
    binds = [f"{dirs[m['name']]}:{m['mountPath']}{':ro' if m.get('readOnly') else ''}"
             for m in task["volumeMounts"] if m["name"] in dirs]
    env = {e["name"]: e["value"] for e in task["env"] if "value" in e}
    (ref,) = [e["valueFrom"]["secretKeyRef"] for e in task["env"] if "valueFrom" in e]
    env[SECRET_SCRIPT_ENV] = base64.b64decode(secret["data"][ref["key"]]).decode()
    assert task["command"][0] == "/bin/bash"
    name = f"pai-kssh-{uuid.uuid4().hex[:8]}"
    podman = ["podman", "run", "-d", "--name", name, f"--user={uid}:{gid}", "--cap-drop=all",
              "--security-opt=no-new-privileges", "--network=host",
              *[f"--volume={b}" for b in binds], *[f"--env={k}={v}" for k, v in env.items()],
              task["image"], "/bin/sh", *task["command"][1:]]
    penv = engine_api.podman_env()
    started = subprocess.run(podman, env=penv, capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    try:
        log = ""
        for _ in range(100):
            log = subprocess.run(["podman", "logs", name], env=penv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True).stdout
            if "sshd listening" in log or "not run" in log or "failed" in log:
                break
            time.sleep(0.1)
        assert f"sshd listening on port {port} as {LOGIN}" in log, log

        job_key = tmp_path / "job_key"
        job_key.write_text(private)
        job_key.chmod(0o600)
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {public}\n")  # the job's key is every task's host key
        probe = ("id -u; id -g; cat /etc/pai-image; echo $PAI_CURRENT_TASK_ROLE_NAME; "
                 "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status")
        for identity in (job_key, profile_key):
            done = ssh(identity, known_hosts, LOGIN, "127.0.0.1", str(port), probe)
            assert done.returncode == 0, done.stderr
            lines = done.stdout.split("\n")
            assert lines[:4] == [str(uid), str(gid), "pai-test-busybox", "worker"], done.stdout
            status = dict(line.split(":\t", 1) for line in lines[4:] if line)
            # The session (and the sshd it comes from) holds no capability, cannot gain
            # privileges, and is under the engine's seccomp filter.
            assert status == {"CapEff": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}, done.stdout
        refused = ssh(stranger_key, known_hosts, LOGIN, "127.0.0.1", str(port), "true")
        assert refused.returncode != 0 and "Permission denied" in refused.stderr
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], env=penv, capture_output=True, timeout=60)
