"""The Kubernetes backend against a Kubernetes API emulator over real HTTP.

No cluster runs on the dev machines: the backend talks HTTP to kmock's API
emulator (extended in kube_emulator), and the tests play the kubelet by
patching Pod status through the same API. The client library is never
patched or mocked.
"""

from __future__ import annotations

import asyncio
import json
import socket
from datetime import UTC, datetime

import hypothesis.strategies as st
import kmock
import msgspec
import pytest
from hypothesis import given

from libs.common.errors import NotFound
from libs.common.messages import TaskPlacement
from services.launcher.backends import kube_names, terminals
from services.launcher.backends.kube_pods import (
    DEFAULT_IMAGE,
    END_ANNOTATION,
    FINALIZER,
    LEAF_CELL_ISOLATION_ANNOTATION,
    EndRequest,
    read_record,
)
from services.launcher.backends.kube_status import Exited, Pending, PullFailing, Running, Terminating, judge
from services.launcher.backends.kubernetes import KubernetesBackend
from services.launcher.core.tasks import TaskFinished, TaskKey, TaskLaunch, TaskRunning
from tests.component.kube_emulator import NAMESPACE, Kubelet, PodApiEmulator, delete_pod, wait_until

pytestmark = pytest.mark.timeout(30)

NODE = "gpu-node-3"


def task_key(index: int = 0, *, job: str = "alice~mnist", role: str = "worker", attempt: int = 1) -> TaskKey:
    return TaskKey(job=job, attempt=attempt, role=role, index=index)


def task_launch(key: TaskKey | None = None, **overrides) -> TaskLaunch:
    key = key or task_key()
    fields = dict(
        key=key,
        vc="research",
        user="alice",
        placement=TaskPlacement(
            role=key.role,
            index=key.index,
            node=NODE,
            hostIp="10.0.0.3",
            gpus=[2, 3],
            leafCells=["rack0/gpu-node-3/2", "rack0/gpu-node-3/3"],
            skuType="V100",
        ),
        commands=["python prepare.py", "python train.py --epochs 3"],
        env={"PAI_JOB_NAME": key.job, "PAI_CURRENT_TASK_ROLE_NAME": key.role, "CUDA_VISIBLE_DEVICES": "2,3"},
        cpu=4,
        memoryMB=8192,
        gpu=2,
        ports={"http": [20001], "ssh": [20002]},
        dockerImageUri="registry.example.com/alice/trainer:1.2",
        imagePullSecret="alice-registry",
    )
    fields.update(overrides)
    return TaskLaunch(**fields)


class Recorder:
    """Collects a backend's events as they come (reading them in the test
    itself would cancel the stream on a timeout)."""

    def __init__(self, backend: KubernetesBackend):
        self.events: list = []
        self._task = asyncio.create_task(self._pump(backend))

    async def _pump(self, backend: KubernetesBackend) -> None:
        async for event in backend.events():
            self.events.append(event)

    def of(self, kind: type, key: TaskKey) -> list:
        return [event for event in self.events if isinstance(event, kind) and event.key == key]

    async def next(self, kind: type, key: TaskKey, *, timeout: float = 5.0):
        await wait_until(lambda: self.of(kind, key), timeout=timeout, what=f"{kind.__name__} of {key.slug}")
        return self.of(kind, key)[0]


class Cluster:
    def __init__(self, emulator: PodApiEmulator, url: str):
        self.emulator = emulator
        self.url = url
        self.kubelet = Kubelet(emulator)
        self._backends: list[KubernetesBackend] = []

    async def backend(self, **options) -> tuple[KubernetesBackend, Recorder]:
        options.setdefault("watch_timeout_seconds", 20)
        backend = await KubernetesBackend.from_config(self.url, NAMESPACE, **options)
        self._backends.append(backend)
        return backend, Recorder(backend)

    async def close(self) -> None:
        for backend in self._backends:
            await backend.close()


@pytest.fixture
async def cluster():
    emulator = PodApiEmulator()
    async with emulator, kmock.Server(emulator) as server:
        cluster = Cluster(emulator, str(server.url).rstrip("/"))
        try:
            yield cluster
        finally:
            await cluster.close()
            await emulator.end_watches()


def pod_of(cluster: Cluster, key: TaskKey) -> dict:
    pod = cluster.emulator.pod(kube_names.pod_name(key))
    assert pod is not None, f"no Pod for {key.slug}"
    return pod


async def started(cluster: Cluster, **options) -> tuple[KubernetesBackend, Recorder, TaskKey, str]:
    """A backend with one task whose container runs."""
    backend, events = await cluster.backend(**options)
    key = task_key()
    await backend.start(task_launch(key))
    name = kube_names.pod_name(key)
    await cluster.kubelet.run(name)
    await events.next(TaskRunning, key)
    return backend, events, key, name


# -- names ---------------------------------------------------------------------

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-", min_size=1, max_size=80)
keys = st.builds(
    TaskKey,
    job=st.builds(lambda user, name: f"{user}~{name}", names, names),
    attempt=st.integers(1, 10_000),
    role=names,
    index=st.integers(0, 10_000),
    taskAttempt=st.integers(0, 100),
)


@given(keys, keys)
def test_pod_names_are_dns_labels_and_differ_for_different_tasks(first, second):
    assert kube_names.is_dns_label(kube_names.pod_name(first))
    # The same key read back from a Pod's annotation names the same Pod.
    read_back = msgspec.json.decode(msgspec.json.encode(first), type=TaskKey)
    assert kube_names.pod_name(read_back) == kube_names.pod_name(first)
    if first != second:
        assert kube_names.pod_name(first) != kube_names.pod_name(second)


@pytest.mark.parametrize(
    ("job", "label"),
    [
        ("alice~mnist", "alice.mnist"),
        ("Alice~MNIST_v2", "Alice.MNIST_v2"),
        ("_bob~-retry-", None),
        ("carol~" + "x" * 100, None),
    ],
    ids=["plain", "upper-and-underscore-kept", "edge-punctuation", "too-long"],
)
def test_job_label_is_a_valid_label_value(job, label):
    value = kube_names.job_label(job)
    assert kube_names.is_label_value(value)
    if label is not None:
        assert value == label


# -- judging a Pod's status (pure) ---------------------------------------------

NOW = 1_800_000_000.0
STARTED = {"running": {"startedAt": "2027-01-15T08:00:00Z"}}


def pod_with(
    phase: str = "Running",
    state: dict | None = None,
    *,
    reason: str = "",
    message: str = "",
    deleted_at: float | None = None,
    end: EndRequest | None = None,
) -> dict:
    meta: dict = {"name": "p", "annotations": {}}
    if deleted_at is not None:
        meta["deletionTimestamp"] = datetime.fromtimestamp(deleted_at, UTC).isoformat()
    if end is not None:
        meta["annotations"][END_ANNOTATION] = msgspec.json.encode(end).decode()
    status: dict = {"phase": phase}
    if state is not None:
        status["containerStatuses"] = [{"name": "worker", "state": state}]
    if reason:
        status["reason"] = reason
        status["message"] = message
    return {"metadata": meta, "spec": {"nodeName": NODE}, "status": status}


def terminated(code: int, reason: str = "Error", **extra) -> dict:
    return {"terminated": {"exitCode": code, "reason": reason, **extra}}


STOP = EndRequest(reason="Stopped", message="alice asked", graceSeconds=10, requestedAt=NOW - 5)
LONG_AGO_STOP = EndRequest(reason="Stopped", message="alice asked", graceSeconds=10, requestedAt=NOW - 100)
MEMORY_LOW = "The node was low on resource: memory."


class AnyText:
    """Equal to any non-empty text: for messages that explain in prose."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)

    def __repr__(self) -> str:
        return "<any text>"


def ran(code: int, reason: str = "", message: str | AnyText = "", signal: int | None = None) -> Exited:
    return Exited(exitCode=code, signal=signal, platformReason=reason, platformMessage=message, started=True)


def never_ran(reason: str, message: str | AnyText, *, end_pod: bool = False) -> Exited:
    return Exited(exitCode=-1, platformReason=reason, platformMessage=message, endPod=end_pod)


def waiting(reason: str, message: str) -> dict:
    return {"waiting": {"reason": reason, "message": message}}


def case(name: str, pod: dict, expected, **options):
    return pytest.param(pod, options, expected, id=name)


JUDGE_CASES = [
    case("pending-no-container", pod_with("Pending"), Pending()),
    case("container-creating", pod_with("Pending", waiting("ContainerCreating", "")), Pending()),
    case("running", pod_with("Running", STARTED), Running(node=NODE)),
    case("succeeded", pod_with("Succeeded", terminated(0, "Completed")), ran(0)),
    case("failed-exit-3", pod_with("Failed", terminated(3)), ran(3)),
    case("exit-137-is-signal-9", pod_with("Failed", terminated(137)), ran(137, signal=9)),
    case("oom-killed", pod_with("Failed", terminated(137, "OOMKilled")), ran(137, "OOMKilled", signal=9)),
    case(
        "evicted",
        pod_with("Failed", terminated(137), reason="Evicted", message=MEMORY_LOW),
        ran(137, "Evicted", MEMORY_LOW, signal=9),
    ),
    case(
        "kubelet-refused-without-container",
        pod_with("Failed", reason="OutOfnvidia.com/gpu", message="not enough GPUs"),
        Exited(exitCode=-1, platformReason="OutOfnvidia.com/gpu", platformMessage="not enough GPUs"),
    ),
    case(
        "container-cannot-run",
        pod_with("Failed", terminated(128, "ContainerCannotRun", message="exec: python: not found")),
        ran(128, "ContainerCannotRun", "exec: python: not found"),
    ),
    case(
        "node-lost",
        pod_with("Unknown", STARTED, reason="NodeLost", message="node gone"),
        ran(-1, "NodeLost", "node gone"),
    ),
    case(
        "stopped-by-pai-then-sigterm",
        pod_with("Failed", terminated(143), deleted_at=NOW, end=STOP),
        ran(143, "Stopped", "alice asked", signal=15),
    ),
    case(
        "stopping-within-grace",
        pod_with("Running", STARTED, deleted_at=NOW - 5, end=STOP),
        Terminating(deadline=NOW + 5 + 30),
    ),
    case(
        "stopping-never-confirmed",
        pod_with("Running", STARTED, deleted_at=NOW - 100, end=LONG_AGO_STOP),
        ran(-1, "Stopped", AnyText()),
    ),
    case("stopped-before-it-ran", pod_with("Pending", deleted_at=NOW, end=STOP), never_ran("Stopped", "alice asked")),
    case("deleted-outside-pai-running", pod_with("Running", STARTED, deleted_at=NOW), Terminating(deadline=NOW + 30)),
    case(
        "deleted-outside-pai-then-sigterm",
        pod_with("Failed", terminated(143), deleted_at=NOW),
        ran(143, "NodeLost", AnyText(), signal=15),
    ),
    case("vanished-while-running", pod_with("Running", STARTED), ran(-1, "NodeLost", AnyText()), gone=True),
    case("vanished-after-stop", pod_with("Running", STARTED, end=STOP), ran(-1, "Stopped", "alice asked"), gone=True),
    case("vanished-after-exit-keeps-exit", pod_with("Failed", terminated(2)), ran(2), gone=True),
    case(
        "image-pull-failing-recently",
        pod_with("Pending", waiting("ImagePullBackOff", "not found")),
        PullFailing(deadline=NOW + 50),
        pull_since=NOW - 10,
        pull_timeout=60,
    ),
    case(
        "image-pull-failing-too-long",
        pod_with("Pending", waiting("ErrImagePull", "manifest unknown")),
        never_ran("ImagePullBackOff", "ErrImagePull: manifest unknown", end_pod=True),
        pull_since=NOW - 61,
        pull_timeout=60,
    ),
    case(
        "invalid-image-name-at-once",
        pod_with("Pending", waiting("InvalidImageName", "bad ref")),
        never_ran("ImagePullBackOff", "InvalidImageName: bad ref", end_pod=True),
    ),
]


@pytest.mark.parametrize(("pod", "options", "expected"), JUDGE_CASES)
def test_judge_reads_pod_status(pod, options, expected):
    assert judge(pod, now=NOW, **options) == expected


container_states = st.one_of(
    st.none(),
    st.just(STARTED),
    st.builds(waiting, st.sampled_from(["ContainerCreating", "ErrImagePull", "ImagePullBackOff"]), st.just("")),
    st.builds(terminated, st.integers(0, 255), st.sampled_from(["Completed", "Error", "OOMKilled"])),
)


@given(
    phase=st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
    state=container_states,
    pod_reason=st.sampled_from(["", "Evicted", "NodeLost"]),
    deleted_at=st.sampled_from([None, NOW - 1000, NOW]),
    end=st.sampled_from([None, STOP]),
    gone=st.booleans(),
)
def test_a_container_exit_code_is_never_lost_and_a_deleted_pod_never_runs(
    phase, state, pod_reason, deleted_at, end, gone
):
    pod = pod_with(phase, state, reason=pod_reason, deleted_at=deleted_at, end=end)
    verdict = judge(pod, now=NOW, gone=gone, pull_since=NOW)
    if state is not None and "terminated" in state:
        assert verdict == Exited(
            exitCode=state["terminated"]["exitCode"],
            signal=verdict.signal,
            platformReason=verdict.platformReason,
            platformMessage=verdict.platformMessage,
            started=True,
        )
    if gone or deleted_at is not None or pod_reason == "NodeLost":
        assert not isinstance(verdict, (Running, Pending, PullFailing))
    if end is not None and isinstance(verdict, Exited):
        assert verdict.platformReason == "Stopped"


# -- the Pod -------------------------------------------------------------------


async def test_start_creates_a_pod_bound_to_the_placed_node(cluster):
    backend, _ = await cluster.backend()
    key = task_key()
    await backend.start(task_launch(key))

    pod = pod_of(cluster, key)
    spec, meta = pod["spec"], pod["metadata"]
    container = spec["containers"][0]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert spec["nodeName"] == NODE
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["imagePullSecrets"] == [{"name": "alice-registry"}]
    assert container["image"] == "registry.example.com/alice/trainer:1.2"
    assert container["command"][:2] == ["/bin/bash", "-c"]
    assert "python prepare.py\npython train.py --epochs 3" in container["command"][2]
    assert container["command"][2].startswith("set -e")
    assert env["PAI_JOB_NAME"] == "alice~mnist" and env["PAI_CURRENT_TASK_ROLE_NAME"] == "worker"
    # The container sees its two GPUs as 0 and 1; the node's indices are in the annotation.
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert meta["annotations"][LEAF_CELL_ISOLATION_ANNOTATION] == "2,3"
    assert container["resources"]["limits"] == {"cpu": "4", "memory": "8192Mi", "nvidia.com/gpu": "2"}
    assert container["resources"]["requests"] == {"cpu": "4", "memory": "8192Mi"}
    assert [p["containerPort"] for p in container["ports"]] == [20001, 20002]
    assert meta["labels"] == {
        "app.kubernetes.io/managed-by": "pai-launcher",
        "pai/job": "alice.mnist",
        "pai/user": "alice",
        "pai/vc": "research",
        "pai/role": "worker",
        "pai/index": "0",
        "pai/attempt": "1",
        "pai/task-attempt": "0",
    }
    assert meta["finalizers"] == [FINALIZER]
    record = read_record(pod)
    assert record is not None and record.key == key and record.placement.gpus == [2, 3]
    assert record.placement.leafCells == ["rack0/gpu-node-3/2", "rack0/gpu-node-3/3"]


async def test_a_job_without_image_or_gpus_gets_the_default_image_and_no_gpu_limit(cluster):
    backend, _ = await cluster.backend()
    key = task_key()
    placement = TaskPlacement(role="worker", index=0, node=NODE)
    await backend.start(
        task_launch(
            key,
            placement=placement,
            gpu=0,
            dockerImageUri=None,
            imagePullSecret=None,
            ports={},
            env={"CUDA_VISIBLE_DEVICES": ""},
        )
    )

    container = pod_of(cluster, key)["spec"]["containers"][0]
    assert container["image"] == DEFAULT_IMAGE
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": ""} in container["env"]
    assert "imagePullSecrets" not in pod_of(cluster, key)["spec"]


async def test_starting_twice_creates_one_pod_also_from_a_new_launcher(cluster):
    first, _ = await cluster.backend()
    key = task_key()
    await asyncio.gather(first.start(task_launch(key)), first.start(task_launch(key)))
    await first.start(task_launch(key))
    second, events = await cluster.backend()
    await second.start(task_launch(key))  # an earlier launcher made it: 409, adopted

    name = kube_names.pod_name(key)
    assert cluster.emulator.created[name] == 1
    await cluster.kubelet.run(name)
    assert (await events.next(TaskRunning, key)).node == NODE


async def test_a_create_that_failed_on_the_server_is_retried_without_a_second_pod(cluster):
    failure = {"kind": "Status", "code": 500, "message": "etcd timeout"}
    cluster.emulator[f"post /api/v1/namespaces/{NAMESPACE}/pods"][:1] << 500 << failure  # stored, but answered 500
    backend, events = await cluster.backend()
    key = task_key()
    await backend.start(task_launch(key))

    assert cluster.emulator.created[kube_names.pod_name(key)] == 1
    await cluster.kubelet.run(kube_names.pod_name(key))
    await events.next(TaskRunning, key)
    assert not events.of(TaskFinished, key)


async def test_a_pod_the_cluster_refuses_ends_the_task_as_launch_failed(cluster):
    cluster.emulator[f"post /api/v1/namespaces/{NAMESPACE}/pods"] << 403 << {
        "kind": "Status",
        "code": 403,
        "message": 'pods "x" is forbidden: exceeded quota: gpu-quota',
    }
    backend, events = await cluster.backend()
    key = task_key()
    await backend.start(task_launch(key))

    finished = await events.next(TaskFinished, key)
    assert (finished.exitCode, finished.platformReason) == (-1, "LaunchFailed")
    assert "exceeded quota" in finished.platformMessage
    assert not events.of(TaskRunning, key)


# -- exits -----------------------------------------------------------------------

EXITS = [
    ("success", lambda k, n: k.exit(n, 0, log=b"epoch 3 done\n"), dict(exitCode=0, signal=None, platformReason="")),
    ("failure", lambda k, n: k.exit(n, 3, log=b"Traceback...\nValueError: bad\n"), dict(exitCode=3, platformReason="")),
    (
        "oom-killed",
        lambda k, n: k.exit(n, 137, reason="OOMKilled", log=b"loading\n"),
        dict(exitCode=137, signal=9, platformReason="OOMKilled"),
    ),
    (
        "evicted",
        lambda k, n: k.evict(n, "The node was low on resource: memory."),
        dict(exitCode=137, platformReason="Evicted", platformMessage="The node was low on resource: memory."),
    ),
    ("node-lost", lambda k, n: k.lose_node(n), dict(exitCode=-1, platformReason="NodeLost")),
]


@pytest.mark.parametrize(("kubelet_does", "expected"), [e[1:] for e in EXITS], ids=[e[0] for e in EXITS])
async def test_the_watch_reports_how_the_container_ended(cluster, kubelet_does, expected):
    _, events, key, name = await started(cluster)
    cluster.kubelet.write_log(name, b"starting\n")
    await kubelet_does(cluster.kubelet, name)

    finished = await events.next(TaskFinished, key)
    for field, value in expected.items():
        assert getattr(finished, field) == value, field
    if expected["exitCode"] >= 0:
        assert finished.userLogTail.startswith("starting\n")
    assert finished.logPath.endswith(f"/pods/{name}/log?container=worker")
    assert [type(e) for e in events.events] == [TaskRunning, TaskFinished]


async def test_the_log_tail_is_the_end_of_the_output(cluster):
    backend, events, key, name = await started(cluster, log_tail_bytes=100)
    output = b"".join(f"step {i:04d} loss {1 / (i + 1):.6f}\n".encode() for i in range(500))
    await cluster.kubelet.exit(name, 1, log=output)

    finished = await events.next(TaskFinished, key)
    assert finished.userLogTail.encode() == output[-100:]
    assert await backend.read_log(key) == output
    assert await backend.read_log(key, tail_bytes=7000) == output[-7000:]
    with pytest.raises(NotFound):
        await backend.read_log(task_key(9))


async def test_a_lasting_image_pull_failure_ends_the_task_and_deletes_the_pod(cluster):
    backend, events = await cluster.backend(image_pull_timeout_seconds=0.3)
    key = task_key()
    await backend.start(task_launch(key))
    name = kube_names.pod_name(key)
    denied = 'pull access denied for "registry.example.com/alice/trainer"'
    await cluster.kubelet.wait_on_image(name, "ErrImagePull", denied)

    finished = await events.next(TaskFinished, key)
    assert (finished.exitCode, finished.platformReason) == (-1, "ImagePullBackOff")
    assert "pull access denied" in finished.platformMessage
    # Deleted, and kept by the finalizer until the exit is recorded.
    await wait_until(lambda: pod_of(cluster, key)["metadata"].get("deletionTimestamp"), what="the Pod deleted")
    pod = pod_of(cluster, key)
    assert json.loads(pod["metadata"]["annotations"][END_ANNOTATION])["reason"] == "ImagePullBackOff"
    assert not events.of(TaskRunning, key)


async def test_an_image_pull_that_heals_is_not_an_exit(cluster):
    backend, events = await cluster.backend(image_pull_timeout_seconds=0.5)
    key = task_key()
    await backend.start(task_launch(key))
    name = kube_names.pod_name(key)
    await cluster.kubelet.wait_on_image(name)
    await asyncio.sleep(0.1)
    await cluster.kubelet.run(name)
    await events.next(TaskRunning, key)

    await asyncio.sleep(0.6)  # past the pull timeout
    assert not events.of(TaskFinished, key)
    assert not pod_of(cluster, key)["metadata"].get("deletionTimestamp")


# -- stop --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "reported"), [("Stopped", "Stopped"), ("", "Killed")], ids=["given-reason", "default-killed"]
)
async def test_kill_deletes_the_pod_with_the_grace_period_and_reports_the_reason(cluster, reason, reported):
    backend, events, key, name = await started(cluster)
    await backend.kill(key, grace_seconds=7, reason=reason)

    deletes = [r for r in cluster.emulator if r.method == kmock.method.DELETE and r.name == name]
    assert [r.params.get("gracePeriodSeconds") for r in deletes] == ["7"]
    assert pod_of(cluster, key)["metadata"].get("deletionTimestamp")
    assert not events.of(TaskFinished, key)  # the container still runs its grace period
    await cluster.kubelet.exit(name, 143, log=b"caught SIGTERM, saving checkpoint\n")

    finished = await events.next(TaskFinished, key)
    assert (finished.exitCode, finished.signal, finished.platformReason) == (143, 15, reported)
    assert "saving checkpoint" in finished.userLogTail


async def test_kill_before_the_container_runs_ends_the_task_at_once(cluster):
    backend, events = await cluster.backend()
    key = task_key()
    await backend.start(task_launch(key))
    await backend.kill(key, grace_seconds=30, reason="Preempted")

    finished = await events.next(TaskFinished, key)
    assert (finished.exitCode, finished.platformReason) == (-1, "Preempted")
    assert not events.of(TaskRunning, key)


async def test_kill_on_a_node_that_never_answers_ends_after_grace_and_margin(cluster):
    backend, events, key, _ = await started(cluster, termination_margin_seconds=0.3)
    await backend.kill(key, grace_seconds=0, reason="Stopped")

    finished = await events.next(TaskFinished, key)
    assert (finished.exitCode, finished.platformReason) == (-1, "Stopped")
    assert "node may be lost" in finished.platformMessage


async def test_kill_of_unknown_or_finished_tasks_is_harmless(cluster):
    backend, events, key, name = await started(cluster)
    await backend.kill(task_key(7), grace_seconds=1, reason="Stopped")
    await cluster.kubelet.exit(name, 0)
    await events.next(TaskFinished, key)
    await backend.kill(key, grace_seconds=1, reason="Stopped")

    assert len(events.of(TaskFinished, key)) == 1
    assert events.of(TaskFinished, key)[0].platformReason == ""
    assert not pod_of(cluster, key)["metadata"].get("deletionTimestamp")


async def test_a_pod_deleted_outside_pai_ends_as_node_lost(cluster):
    _, events, key, name = await started(cluster)
    assert await delete_pod(cluster.emulator, name) == 200  # kubectl delete pod
    await cluster.kubelet.exit(name, 143)

    finished = await events.next(TaskFinished, key)
    assert (finished.exitCode, finished.platformReason) == (143, "NodeLost")


# -- exactly once, forget, recovery --------------------------------------------------


async def test_forget_removes_the_pod_and_nothing_is_reported_again(cluster):
    backend, events, key, name = await started(cluster)
    await cluster.kubelet.exit(name, 0)
    await events.next(TaskFinished, key)
    await backend.forget(key)

    assert cluster.emulator.pod(name) is None
    assert await backend.recover() == []
    assert len(events.of(TaskFinished, key)) == 1


async def test_each_exit_is_reported_once_across_dropped_and_expired_watches(cluster):
    _, events, key, name = await started(cluster)
    await cluster.kubelet.exit(name, 1)
    await events.next(TaskFinished, key)

    lists, watches = len(cluster.emulator.pod_reads(watch=False)), len(cluster.emulator.pod_reads(watch=True))
    await cluster.emulator.end_watches(expired=True)  # 410 Gone: the backend must list again
    await wait_until(lambda: len(cluster.emulator.pod_reads(watch=False)) > lists, what="a new list")
    # The new watch starts once the list was judged.
    await wait_until(lambda: len(cluster.emulator.pod_reads(watch=True)) > watches, what="a new watch")

    assert len(events.of(TaskFinished, key)) == 1
    assert len(events.of(TaskRunning, key)) == 1


async def test_the_watch_goes_on_from_its_last_version_after_the_server_drops_it(cluster):
    _, events, key, name = await started(cluster)
    watches = cluster.emulator.pod_reads(watch=True)
    await cluster.emulator.end_watches()
    await wait_until(lambda: len(cluster.emulator.pod_reads(watch=True)) > len(watches), what="a new watch")
    resumed = cluster.emulator.pod_reads(watch=True)[-1]
    await cluster.kubelet.exit(name, 4)

    assert (await events.next(TaskFinished, key)).exitCode == 4
    assert int(resumed.params["resourceVersion"]) == int(pod_of(cluster, key)["metadata"]["resourceVersion"]) - 1


async def test_a_pod_that_vanished_while_the_watch_was_down_ends_as_node_lost(cluster):
    _, events, key, name = await started(cluster)
    # Gone without a trace (no DELETED event), and the watch expires: only the next list can tell.
    for object_key in [k for k in cluster.emulator.objects if k[2] == name]:
        del cluster.emulator.objects[object_key]
    await cluster.emulator.end_watches(expired=True)

    finished = await events.next(TaskFinished, key)
    assert (finished.exitCode, finished.platformReason) == (-1, "NodeLost")


async def test_recovery_adopts_pods_and_reports_one_that_ended_meanwhile(cluster):
    first, _ = await cluster.backend()
    running, ended = task_key(0), task_key(1)
    for key in (running, ended):
        await first.start(task_launch(key))
        await cluster.kubelet.run(kube_names.pod_name(key))
    await first.close()
    await cluster.kubelet.exit(kube_names.pod_name(ended), 1, log=b"RuntimeError: CUDA error\n")

    second, events = await cluster.backend()
    assert await second.recover() == [running, ended]
    finished = await events.next(TaskFinished, ended)
    assert (finished.exitCode, finished.userLogTail) == (1, "RuntimeError: CUDA error\n")
    assert (await events.next(TaskRunning, running)).node == NODE
    assert not events.of(TaskFinished, running)

    await cluster.kubelet.exit(kube_names.pod_name(running), 0)
    assert (await events.next(TaskFinished, running)).exitCode == 0


async def test_recovery_keeps_the_stop_reason_of_a_pod_stopped_before_the_restart(cluster):
    first, _, key, name = await started(cluster)
    await first.kill(key, grace_seconds=5, reason="Preempted")
    await first.close()
    await cluster.kubelet.exit(name, 143)

    second, events = await cluster.backend()
    assert await second.recover() == [key]
    finished = await events.next(TaskFinished, key)
    assert (finished.exitCode, finished.platformReason) == (143, "Preempted")


async def test_the_sync_factory_connects_on_first_use(cluster):
    backend = KubernetesBackend.from_config_sync(cluster.url, NAMESPACE)
    try:
        await backend.start(task_launch())
        assert await backend.recover() == [task_key()]
    finally:
        await backend.close()


async def test_an_unreachable_api_ends_the_start_as_launch_failed():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    backend = await KubernetesBackend.from_config(f"http://127.0.0.1:{closed_port}", NAMESPACE, api_retry_seconds=0.3)
    events = Recorder(backend)
    try:
        await backend.start(task_launch())
        finished = await events.next(TaskFinished, task_key())
        assert (finished.exitCode, finished.platformReason) == (-1, "LaunchFailed")
        assert "could not be reached" in finished.platformMessage
    finally:
        await backend.close()


# -- a browser terminal: Kubernetes' exec ----------------------------------------


async def test_a_terminal_in_a_pod_runs_through_kubernetes_exec(cluster):
    """The launcher's shell in a Pod (backends/terminals.py, KubeExecTerminal): an exec
    WebSocket on the API server in Kubernetes' channel protocol, with a tty, in the task's
    container (its environment); keys on stdin, a resize on its channel, the shell's
    output on stdout; closing it ends the shell. A task with no running Pod: NotFound."""
    backend, _, key, name = await started(cluster)
    channel = await backend.open_terminal(key, cols=90, rows=20)
    try:
        assert channel.mode == "pod"
        await channel.write(b"echo $PAI_CURRENT_TASK_ROLE_NAME $PAI_JOB_NAME; stty size; echo done-$((6*7))\n")
        seen = await _read_until(channel, b"\ndone-42")
        lines = [line.strip() for line in seen.decode().replace("\r", "").split("\n")]
        at = lines.index("done-42")
        assert lines[at - 2: at] == ["worker alice~mnist", "20 90"], lines
        await channel.resize(100, 30)
        await channel.write(b"stty size\n")
        await _read_until(channel, b"30 100")
        assert cluster.emulator.exec_sessions == [list(terminals.CONTAINER_SHELL)]
        await channel.write(b"exit 3\n")
        while await asyncio.wait_for(channel.read(), 10):
            pass  # the rest of the output, then the stream's end
        assert json.loads(channel.status)["details"]["causes"][0]["message"] == "3"  # the shell's exit, as Kubernetes says it
    finally:
        await channel.close()
    with pytest.raises(NotFound):
        await backend.open_terminal(task_key(7), cols=80, rows=24)


async def _read_until(channel, wanted: bytes) -> bytes:
    seen = b""
    while wanted not in seen.replace(b"\r", b""):
        chunk = await asyncio.wait_for(channel.read(), 10)
        assert chunk, f"the shell ended early; it showed {seen!r}"
        seen += chunk
    return seen
