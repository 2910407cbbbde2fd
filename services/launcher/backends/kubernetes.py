"""The Kubernetes backend: every task instance is a Pod, bound to the placed node.

How a task runs (kube_pods for the Pod, kube_status for reading its status):
- `start` creates the Pod named after the task key. The name is the record: a
  second create of the same key is refused by the API (409 Conflict), which
  counts as "already started", so a task is never started twice, also across
  launcher restarts. Server errors and an unreachable API are retried for
  `api_retry_seconds` (as in every API call); a refusal (invalid Pod,
  quota, forbidden) or an outage that outlasts the retries ends the task with
  platformReason "LaunchFailed" and the API's message.
- State comes from one list-then-watch of PAI's Pods (kube_watch). Each Pod
  change is judged: a running container gives TaskRunning, an end gives
  TaskFinished with the container's exit code and signal and the last
  `log_tail_bytes` of its log; OOMKilled, Evicted, NodeLost and a lasting
  image pull failure ("ImagePullBackOff", after `image_pull_timeout_seconds`;
  the Pod is then deleted) become the platform reason.
- Every exit is reported exactly once per key until `forget`; a Pod that ended
  while the launcher was down is reported after `recover`. PAI's finalizer
  keeps a deleted Pod, with its final status, until `forget` removes it.
- Stop: `kill` writes the reason on the Pod (`pai/end`) and deletes it with
  the grace period; the kubelet's report of the container's end gives the
  TaskFinished, with the reason ("Killed" by default) as platformReason. When
  no report comes (a lost node), the task counts as ended `termination margin`
  seconds after the grace period, with exit code -1.
- A Pod deleted by anyone else, or gone while it ran, ends with "NodeLost".
- Secrets: a task whose commands use the job's secrets gets its script (the
  commands with the secrets filled in) from a Kubernetes Secret of its own,
  named like its Pod and created before it, through an environment variable
  `valueFrom.secretKeyRef` that its shell reads, unsets and runs
  (`with_secret_script`). The Pod spec carries only the references, as the
  JobSpec does; the Pod's `pai/secret` annotation names the Secret, which
  `forget` deletes with the Pod. Other tasks cost no extra API call.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import aiohttp
import msgspec
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException, load_incluster_config, load_kube_config

from libs.common.errors import NotFound, Transient
from services.launcher.backends import kube_names, terminals
from services.launcher.backends.kube_logs import read_log
from services.launcher.backends.kube_pods import (
    DEFAULT_IMAGE,
    DEFAULT_RUN_AS,
    KIND_LABEL,
    REGISTRY_SECRET_KIND,
    EndRequest,
    build_pod,
    end_patch,
    holds_finalizer,
    read_record,
    registry_secret,
    registry_secrets_of,
    release_patch,
    task_script,
)
from services.launcher.backends.kube_status import (
    NO_EXIT_CODE,
    Exited,
    Pending,
    PullFailing,
    Running,
    Terminating,
    image_pull_failing,
    judge,
)
from services.launcher.backends.kube_watch import PodWatch, list_pods, read_json
from services.launcher.core.tasks import BackendEvent, TaskFinished, TaskKey, TaskLaunch, TaskRunning

log = logging.getLogger(__name__)

DEFAULT_LOG_TAIL_BYTES = 64 * 1024
KILLED = "Killed"
LAUNCH_FAILED = "LaunchFailed"
# A single API call (not a watch) that takes longer than this has failed.
API_TIMEOUT_SECONDS = 30.0
MERGE_PATCH = "application/merge-patch+json"
_RETRY_DELAY_SECONDS = 0.5
_MAX_RETRY_DELAY_SECONDS = 5.0
_CONNECTION_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
# Every single API call (not the watch): raw JSON back, and a time limit.
_CALL = {"_preload_content": False, "_request_timeout": API_TIMEOUT_SECONDS}
_T = TypeVar("_T")


class _PodTask:
    """What the backend knows about one task's Pod."""

    __slots__ = (
        "key",
        "name",
        "container",
        "pod",
        "seen",
        "running_reported",
        "reported",
        "pull_since",
        "end",
        "timer",
    )

    def __init__(self, key: TaskKey, name: str, container: str):
        self.key = key
        self.name = name
        self.container = container
        self.pod: dict | None = None  # the latest version seen
        self.seen = 0  # sequence number of the latest observation
        self.running_reported = False
        self.reported = False  # its TaskFinished is out
        self.pull_since: float | None = None  # first seen waiting on a failing image pull
        self.end: EndRequest | None = None  # PAI's own end request, when the annotation could not be written
        self.timer: asyncio.TimerHandle | None = None


class KubernetesBackend:
    """Runs task instances as Kubernetes Pods; see the module docstring."""

    name = "kubernetes"

    def __init__(
        self,
        api_client: ApiClient | None,
        *,
        namespace: str,
        log_tail_bytes: int = DEFAULT_LOG_TAIL_BYTES,
        watch_timeout_seconds: int = 300,
        image_pull_timeout_seconds: float = 120.0,
        termination_margin_seconds: float = 30.0,
        api_retry_seconds: float = 30.0,
        default_image: str = DEFAULT_IMAGE,
        host_network: bool = False,
        job_host_network: bool = True,
        run_as: tuple[int, int] = DEFAULT_RUN_AS,
        ssh_image: str = "",
        clock: Callable[[], float] = time.time,
        connect: Callable[[], Awaitable[ApiClient]] | None = None,
    ):
        """`api_client` talks to the cluster; or None with `connect`, which makes
        one on first use (loading a kubeconfig needs the event loop)."""
        if api_client is None and connect is None:
            raise ValueError("give an api_client or a connect function")
        self.namespace = namespace
        self.log_tail_bytes = log_tail_bytes
        self.watch_timeout_seconds = watch_timeout_seconds
        self.image_pull_timeout_seconds = image_pull_timeout_seconds
        self.termination_margin_seconds = termination_margin_seconds
        self.api_retry_seconds = api_retry_seconds
        self.default_image = default_image
        self.host_network = host_network
        self.job_host_network = job_host_network  # a job may ask for its node's network
        if min(run_as) <= 0:
            raise ValueError(f"task Pods run as a non-root uid and gid, not {run_as} (kube_task_uid, kube_task_gid)")
        self.run_as = run_as
        self.ssh_image = ssh_image  # PAI's image the ssh plugin's init container runs (kube_pods)
        self._clock = clock
        self._client = api_client
        self._connect = connect
        self._api = CoreV1Api(api_client) if api_client is not None else None
        self._connecting = asyncio.Lock()
        self._tasks: dict[str, _PodTask] = {}
        self._forgotten: set[str] = set()
        self._strangers: set[str] = set()
        self._queue: asyncio.Queue[BackendEvent | None] = asyncio.Queue()
        self._watcher: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._seq = 0
        self._closed = False

    @classmethod
    async def from_config(cls, api_url: str | None, namespace: str, **options) -> KubernetesBackend:
        """A backend for the API at `api_url` (plain HTTP, no credentials), or when
        None, for the cluster this process runs in, else the current kubeconfig."""
        return cls(await load_client(api_url), namespace=namespace, **options)

    @classmethod
    def from_config_sync(cls, api_url: str | None, namespace: str, **options) -> KubernetesBackend:
        """Like `from_config`, for a caller that cannot await: the configuration is
        loaded on the backend's first call."""
        return cls(None, namespace=namespace, connect=lambda: load_client(api_url), **options)

    # -- Backend -------------------------------------------------------------

    async def recover(self) -> list[TaskKey]:
        api = await self._ready()
        version = await self._retrying("listing PAI's Pods", self._resync)
        self._ensure_watching(version)
        await self._remove_leftover_registry_secrets(api)
        return sorted(task.key for task in self._tasks.values())

    async def _remove_leftover_registry_secrets(self, api: CoreV1Api) -> None:
        """A job's registry Secret whose job has no Pod left: a launcher that died between
        deleting the job's last Pod and its Secret left it. Here, before any start, so a
        Secret just made for a Pod about to be created is never taken for one."""
        selector = f"{kube_names.POD_SELECTOR},{KIND_LABEL}={REGISTRY_SECRET_KIND}"
        live = {kube_names.job_label(task.key.job) for task in self._tasks.values()}
        try:
            listed = await self._retrying("listing registry Secrets", lambda: self._json(
                api.list_namespaced_secret(self.namespace, label_selector=selector, **_CALL)))
            for item in listed.get("items") or []:
                meta = item.get("metadata") or {}
                if (meta.get("labels") or {}).get(kube_names.JOB_LABEL) not in live:
                    await self._delete_secret(api, meta["name"])
        except (ApiException, *_CONNECTION_ERRORS) as exc:  # not fatal: tried again at the next start
            log.warning("removing leftover registry Secrets failed: %s", _describe(exc))

    async def start(self, launch: TaskLaunch, *, secret_commands: list[str] | None = None) -> None:
        """Create the task's Pod once; `secret_commands`: its commands with the
        job's secrets filled in, given through a Secret of its own."""
        api = await self._ready()
        name = kube_names.pod_name(launch.key)
        if name in self._tasks or name in self._forgotten:
            return  # started before: never twice
        self._ensure_watching()
        if launch.hostNetwork and not self.job_host_network:
            launch = msgspec.structs.replace(launch, hostNetwork=False)  # the admin does not let jobs ask
        manifest = build_pod(
            launch, namespace=self.namespace, default_image=self.default_image, host_network=self.host_network,
            run_as=self.run_as, ssh_image=self.ssh_image,
        )
        task = self._track(launch.key, name, manifest["spec"]["containers"][0]["name"])
        registry = registry_secret(launch, self.namespace)
        if registry is not None:  # the job's, shared by its tasks: made by the first, 409 for the others
            try:
                await self._retrying(
                    f"creating Secret {registry['metadata']['name']}",
                    lambda: self._json(api.create_namespaced_secret(self.namespace, registry, **_CALL)),
                )
            except ApiException as exc:
                if exc.status != 409:
                    await self._launch_failed(task, f"the Kubernetes API refused the job's registry Secret: "
                                                    f"{exc.status} {exc.reason}")
                    return
            except _CONNECTION_ERRORS as exc:
                await self._launch_failed(task, f"the Kubernetes API could not be reached: {exc!r}")
                return
        if secret_commands is not None:
            secret = with_secret_script(manifest, task_script(secret_commands))
            try:
                await self._retrying(
                    f"creating Secret {name}",
                    lambda: self._json(api.create_namespaced_secret(self.namespace, secret, **_CALL)),
                )
            except ApiException as exc:
                if exc.status != 409:  # 409: an earlier launcher made it, for this same task
                    await self._launch_failed(task, f"the Kubernetes API refused the task's Secret: {exc.status} {exc.reason}")
                    return
            except _CONNECTION_ERRORS as exc:
                await self._launch_failed(task, f"the Kubernetes API could not be reached: {exc!r}")
                return
        try:
            created = await self._retrying(
                f"creating Pod {name}",
                lambda: self._json(api.create_namespaced_pod(self.namespace, manifest, **_CALL)),
            )
        except ApiException as exc:
            if exc.status == 409:
                await self._adopt_existing(api, task)  # an earlier launcher created it
            else:
                await self._launch_failed(task, f"the Kubernetes API refused the Pod: {exc.status} {exc.reason}")
            return
        except _CONNECTION_ERRORS as exc:
            await self._launch_failed(task, f"the Kubernetes API could not be reached: {exc!r}")
            return
        await self._observe(created)

    async def kill(self, key: TaskKey, *, grace_seconds: float, reason: str) -> None:
        api = await self._ready()
        name = kube_names.pod_name(key)
        if name in self._forgotten:
            return
        task = self._tasks.get(name)
        if task is None or task.pod is None:
            pod = await self._get_pod(api, name)
            if pod is None:
                return  # unknown, or already gone (its exit is reported by the watch)
            await self._observe(pod)
            task = self._tasks.get(name)
        if task is None or task.reported:
            return  # not a PAI task, or it ended on its own first
        end = EndRequest(reason=reason or KILLED, graceSeconds=grace_seconds, requestedAt=self._clock())
        task.end = end
        deleted = await self._end_pod(api, task, end, grace_seconds=grace_seconds)
        if deleted is not None:
            await self._observe(deleted)  # a Pod that never ran ends now; else its deadline is armed
        elif not task.reported:
            await self._judge(task, gone=True)

    def events(self) -> AsyncIterator[BackendEvent]:
        return self._event_stream()

    async def open_terminal(self, key: TaskKey, *, cols: int, rows: int) -> terminals.KubeExecTerminal:
        """A shell in the task's Pod, through Kubernetes' exec (its container's user,
        working directory and environment)."""
        await self._ready()
        name = kube_names.pod_name(key)
        task = self._tasks.get(name)
        if task is None or task.reported:
            raise NotFound(f"no running Pod of task {key.role}[{key.index}] of {key.job}")
        assert self._client is not None
        try:
            return await terminals.KubeExecTerminal.open(self._client.configuration, self.namespace, name, task.container,
                                                         cols=cols, rows=rows)
        except (ApiException, aiohttp.ClientError, OSError) as exc:
            raise Transient(f"Kubernetes did not open a shell in Pod {self.namespace}/{name}: {_describe(exc)}") from exc

    async def read_log(self, key: TaskKey, *, tail_bytes: int | None = None) -> bytes:
        api = await self._ready()
        name = kube_names.pod_name(key)
        task = self._tasks.get(name)
        container = task.container if task is not None else kube_names.dns_label(key.role, fallback="task")
        try:
            return await read_log(api, self.namespace, name, container, tail_bytes=tail_bytes)
        except ApiException as exc:
            if exc.status == 404:
                raise NotFound(f"no Pod {name} for task {key.slug}") from exc
            if exc.status == 400:
                return b""  # the container has not started: no output yet
            raise Transient(f"reading the log of Pod {name} failed: {exc.status} {exc.reason}") from exc
        except _CONNECTION_ERRORS as exc:
            raise Transient(f"reading the log of Pod {name} failed: {exc!r}") from exc

    async def forget(self, key: TaskKey) -> None:
        api = await self._ready()
        name = kube_names.pod_name(key)
        self._forgotten.add(name)
        task = self._tasks.pop(name, None)
        pod = task.pod if task is not None else None
        if task is not None:
            self._disarm(task)
        try:
            if pod is None:
                pod = await self._get_pod(api, name)
                if pod is None:
                    return
            if holds_finalizer(pod):
                await self._patch(api, name, release_patch(pod))
            await self._delete(api, name)
            secret = _annotations_of(pod).get(SECRET_ANNOTATION)
            if secret:
                await self._delete_secret(api, secret)
            if not any(other.key.job == key.job for other in self._tasks.values()):
                for registry in registry_secrets_of(pod):  # the job's last Pod: its registry login goes too
                    await self._delete_secret(api, registry)
        except (ApiException, *_CONNECTION_ERRORS) as exc:
            # Not fatal: the exit is recorded; after a restart the Pod is
            # reported again and forgotten again.
            log.warning("removing Pod %s failed: %s", name, _describe(exc))

    async def close(self) -> None:
        """Stop watching and close the client; the Pods carry on (`recover` finds them)."""
        if self._closed:
            return
        self._closed = True
        pending = [t for t in (self._watcher, *self._background) if t is not None]
        for running in pending:
            running.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in self._tasks.values():
            self._disarm(task)
        if self._client is not None:
            await self._client.close()
        self._queue.put_nowait(None)

    # -- watching ------------------------------------------------------------

    async def _ready(self) -> CoreV1Api:
        if self._closed:
            raise RuntimeError("the Kubernetes backend is closed")
        if self._api is None:
            async with self._connecting:
                if self._api is None:
                    assert self._connect is not None
                    self._client = await self._connect()
                    self._api = CoreV1Api(self._client)
        return self._api

    def _ensure_watching(self, version: str | None = None) -> None:
        if self._watcher is not None or self._closed:
            return
        assert self._api is not None
        watch = PodWatch(
            self._api,
            self.namespace,
            selector=kube_names.POD_SELECTOR,
            resync=self._resync,
            on_event=self._on_watch_event,
            timeout_seconds=self.watch_timeout_seconds,
        )
        self._watcher = asyncio.create_task(watch.run(version), name="kubernetes-pod-watch")

    async def _resync(self) -> str:
        """List every PAI Pod, judge each, and notice the ones that disappeared."""
        api = await self._ready()
        # The list is a consistent read made after this point: a task seen
        # before it and missing from it is gone.
        listed_after = self._seq
        pods, version = await list_pods(api, self.namespace, kube_names.POD_SELECTOR)
        present = set()
        for pod in pods:
            present.add((pod.get("metadata") or {}).get("name"))
            await self._observe(pod)
        for task in list(self._tasks.values()):
            if task.name not in present and task.pod is not None and not task.reported and task.seen <= listed_after:
                await self._judge(task, gone=True)
        return version

    async def _on_watch_event(self, kind: str, pod: dict) -> None:
        await self._observe(pod, gone=kind == "DELETED")

    async def _event_stream(self) -> AsyncIterator[BackendEvent]:
        if not self._closed:
            await self._ready()
            self._ensure_watching()
        while True:
            event = await self._queue.get()
            if event is None:
                self._queue.put_nowait(None)  # let any other reader end too
                return
            yield event

    # -- judging -------------------------------------------------------------

    async def _observe(self, pod: dict, *, gone: bool = False) -> None:
        name = (pod.get("metadata") or {}).get("name") or ""
        if name in self._forgotten:
            if gone:
                self._forgotten.discard(name)  # removed for good: nothing more will come
            return
        task = self._tasks.get(name)
        if task is None:
            record = read_record(pod)
            if record is None:
                if name not in self._strangers:
                    self._strangers.add(name)
                    log.warning("Pod %s carries PAI's label but no readable task annotation; ignoring it", name)
                return
            containers = (pod.get("spec") or {}).get("containers") or [{}]
            task = self._track(record.key, name, containers[0].get("name") or "")
        if not gone and not _not_older(pod, task.pod):
            return  # a list that was overtaken by the watch
        task.pod = pod
        self._seq += 1
        task.seen = self._seq
        await self._judge(task, gone=gone)

    async def _judge(self, task: _PodTask, *, gone: bool = False) -> None:
        if task.reported or task.pod is None:
            self._disarm(task)
            return
        now = self._clock()
        if image_pull_failing(task.pod):
            task.pull_since = now if task.pull_since is None else task.pull_since
        else:
            task.pull_since = None
        verdict = judge(
            task.pod,
            now=now,
            gone=gone,
            pull_since=task.pull_since,
            pull_timeout=self.image_pull_timeout_seconds,
            termination_margin=self.termination_margin_seconds,
            end=task.end,
        )
        match verdict:
            case Pending():
                self._disarm(task)
            case Running(node=node):
                self._disarm(task)
                self._report_running(task, node)
            case Terminating(deadline=deadline) | PullFailing(deadline=deadline):
                self._arm(task, deadline)
            case Exited():
                await self._finish(task, verdict, gone=gone)

    async def _finish(self, task: _PodTask, exited: Exited, *, gone: bool = False) -> None:
        task.reported = True  # first, so that a concurrent look does not report it again
        self._disarm(task)
        if exited.started:
            self._report_running(task, _node_of(task))
        api = await self._ready()
        tail = b""
        if exited.started and not gone:
            tail = await self._log_tail(api, task)
        self._queue.put_nowait(
            TaskFinished(
                key=task.key,
                exitCode=exited.exitCode,
                signal=exited.signal,
                platformReason=exited.platformReason,
                platformMessage=exited.platformMessage,
                userLogTail=tail.decode(errors="replace"),
                logPath=self._log_path(task),
            )
        )
        if exited.endPod:
            end = EndRequest(reason=exited.platformReason, message=exited.platformMessage, requestedAt=self._clock())
            try:
                await self._end_pod(api, task, end, grace_seconds=None)
            except (ApiException, *_CONNECTION_ERRORS) as exc:
                # Reported all the same; the Pod is deleted by `forget` at the latest.
                log.warning("ending Pod %s failed: %s", task.name, _describe(exc))

    async def _launch_failed(self, task: _PodTask, message: str) -> None:
        await self._finish(task, Exited(exitCode=NO_EXIT_CODE, platformReason=LAUNCH_FAILED, platformMessage=message))

    def _report_running(self, task: _PodTask, node: str) -> None:
        if task.running_reported:
            return
        task.running_reported = True
        image = ""
        if task.pod is not None:
            containers = (task.pod.get("spec") or {}).get("containers") or [{}]
            image = containers[0].get("image") or ""
        detail = f"pod {self.namespace}/{task.name}, image {image}"
        self._queue.put_nowait(TaskRunning(key=task.key, node=node or _node_of(task), detail=detail, at=self._clock()))

    def _arm(self, task: _PodTask, deadline: float) -> None:
        """Judge the task again at `deadline` (a wall-clock time), when no event may come."""
        self._disarm(task)
        delay = max(0.0, deadline - self._clock())
        task.timer = asyncio.get_running_loop().call_later(delay, self._on_deadline, task.name)

    def _disarm(self, task: _PodTask) -> None:
        if task.timer is not None:
            task.timer.cancel()
            task.timer = None

    def _on_deadline(self, name: str) -> None:
        task = self._tasks.get(name)
        if task is None or task.reported or self._closed:
            return
        task.timer = None
        self._in_background(self._judge(task))

    # -- API calls -----------------------------------------------------------

    def _track(self, key: TaskKey, name: str, container: str) -> _PodTask:
        task = _PodTask(key, name, container)
        self._tasks[name] = task
        return task

    async def _adopt_existing(self, api: CoreV1Api, task: _PodTask) -> None:
        pod = await self._get_pod(api, task.name)
        if pod is not None:
            await self._observe(pod)
        else:
            # It existed a moment ago and is gone already: nobody saw how it ended.
            task.pod = {"metadata": {"name": task.name}}
            await self._judge(task, gone=True)

    async def _get_pod(self, api: CoreV1Api, name: str) -> dict | None:
        try:
            return await self._retrying(
                f"reading Pod {name}", lambda: self._json(api.read_namespaced_pod(name, self.namespace, **_CALL))
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def _patch(self, api: CoreV1Api, name: str, patch: dict) -> dict:
        return await self._retrying(
            f"patching Pod {name}",
            lambda: self._json(
                api.patch_namespaced_pod(name, self.namespace, patch, _content_type=MERGE_PATCH, **_CALL)
            ),
        )

    async def _delete_secret(self, api: CoreV1Api, name: str) -> None:
        try:
            await self._retrying(
                f"deleting Secret {name}", lambda: self._json(api.delete_namespaced_secret(name, self.namespace, **_CALL))
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def _delete(self, api: CoreV1Api, name: str, *, grace_seconds: int | None = None) -> dict:
        return await self._retrying(
            f"deleting Pod {name}",
            lambda: self._json(
                api.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace_seconds, **_CALL)
            ),
        )

    async def _end_pod(
        self, api: CoreV1Api, task: _PodTask, end: EndRequest, *, grace_seconds: float | None
    ) -> dict | None:
        """Record why PAI ends the Pod, then delete it; returns the Pod as deleted,
        or None when it is gone (already, or at once)."""
        try:
            await self._patch(api, task.name, end_patch(end))
        except ApiException as exc:
            if exc.status == 404:
                return None
            # Go on: the reason is also kept in memory (task.end).
            log.warning("recording the end of Pod %s failed: %s %s", task.name, exc.status, exc.reason)
        grace = None if grace_seconds is None else max(0, math.ceil(grace_seconds))
        try:
            deleted = await self._delete(api, task.name, grace_seconds=grace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        # A graceful delete answers with the Pod; one that removed it at once, with a Status.
        return deleted if deleted.get("kind", "Pod") == "Pod" and deleted.get("metadata") else None

    async def _retrying(self, what: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """`call()`, again after server errors and lost connections, for up to
        `api_retry_seconds`; a refusal (4xx) is raised at once."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.api_retry_seconds
        delay = _RETRY_DELAY_SECONDS
        while True:
            try:
                return await call()
            except ApiException as exc:
                if not _transient(exc.status) or loop.time() >= give_up_at:
                    raise
                failure = _describe(exc)
            except _CONNECTION_ERRORS as exc:
                if loop.time() >= give_up_at:
                    raise
                failure = _describe(exc)
            log.warning("%s failed (%s); retrying in %.1fs", what, failure, delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, _MAX_RETRY_DELAY_SECONDS)

    @staticmethod
    async def _json(request: Awaitable[aiohttp.ClientResponse]) -> dict:
        return await read_json(await request)

    async def _log_tail(self, api: CoreV1Api, task: _PodTask) -> bytes:
        try:
            return await read_log(api, self.namespace, task.name, task.container, tail_bytes=self.log_tail_bytes)
        except (ApiException, *_CONNECTION_ERRORS) as exc:
            log.info("no log tail for Pod %s: %s", task.name, exc)
            return b""

    def _log_path(self, task: _PodTask) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{task.name}/log?container={task.container}"

    def _in_background(self, coro: Awaitable[None]) -> None:
        running = asyncio.ensure_future(coro)
        self._background.add(running)
        running.add_done_callback(self._background_done)

    def _background_done(self, running: asyncio.Task[None]) -> None:
        self._background.discard(running)
        if not running.cancelled() and running.exception() is not None:
            log.error("Kubernetes backend background work failed", exc_info=running.exception())


async def load_client(api_url: str | None) -> ApiClient:
    """A client for `api_url` (plain HTTP), or the in-cluster service account,
    or the current kubeconfig context."""
    configuration = Configuration()
    if api_url:
        configuration.host = api_url.rstrip("/")
    else:
        try:
            load_incluster_config(client_configuration=configuration)
        except ConfigException:
            await load_kube_config(client_configuration=configuration)
    return ApiClient(configuration)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return repr(exc)


def _transient(status: int | None) -> bool:
    return status is None or status == 0 or status == 429 or status >= 500


def _not_older(pod: dict, seen: dict | None) -> bool:
    """Whether `pod` is at least as new as `seen` (resourceVersions compared as
    numbers when both are: a list answer can arrive after newer watch events)."""
    if seen is None:
        return True
    new = (pod.get("metadata") or {}).get("resourceVersion")
    old = (seen.get("metadata") or {}).get("resourceVersion")
    try:
        return int(new) >= int(old)
    except (TypeError, ValueError):
        return True


def _node_of(task: _PodTask) -> str:
    if task.pod is not None:
        node = (task.pod.get("spec") or {}).get("nodeName")
        if node:
            return node
    return ""


# -- secrets -----------------------------------------------------------------

SECRET_ANNOTATION = "pai/secret"
SECRET_SCRIPT_KEY = "script"
SECRET_SCRIPT_ENV = "PAI_TASK_SCRIPT"
# The container's shell takes its script from the Secret's variable, removes
# the variable (the task's programs do not inherit it) and runs the script
# (errexit applies inside eval as with -c).
SECRET_SCRIPT_LOADER = f'__pai_script=${SECRET_SCRIPT_ENV}; unset {SECRET_SCRIPT_ENV}; eval "$__pai_script"'


def with_secret_script(manifest: dict, script: str) -> dict:
    """Point the Pod `manifest` (changed in place) at a Secret holding its
    script; returns that Secret, named and labelled like the Pod."""
    meta = manifest["metadata"]
    container = manifest["spec"]["containers"][0]
    container["command"] = [container["command"][0], "-c", SECRET_SCRIPT_LOADER]
    container["env"] = [
        *container["env"],
        {"name": SECRET_SCRIPT_ENV, "valueFrom": {"secretKeyRef": {"name": meta["name"], "key": SECRET_SCRIPT_KEY}}},
    ]
    meta["annotations"][SECRET_ANNOTATION] = meta["name"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": dict(meta["labels"])},
        "type": "Opaque",
        "data": {SECRET_SCRIPT_KEY: base64.b64encode(script.encode()).decode()},
    }


def _annotations_of(pod: dict) -> dict:
    return (pod.get("metadata") or {}).get("annotations") or {}
