"""A Kubernetes API for Pods over real HTTP, and a kubelet stand-in that drives it.

No Kubernetes cluster exists on the dev machines, so the Kubernetes backend is
tested against kmock's `KubernetesEmulator`: a real aiohttp server speaking the
API's paths and JSON, storing objects in memory (create, get, merge-patch,
delete with finalizers, list, watch). What PAI's backend relies on and kmock
0.8 leaves out is added here through kmock's own extension points (its docs
ask to subclass the emulator for special behaviour):

- resourceVersion: every change gets the next number, stamped on the stored
  object; a list answer carries the current number;
- watch from a resourceVersion (the changes after it, from a change log),
  `timeoutSeconds`, and `labelSelector` (on lists too);
- uid, creationTimestamp, namespace and phase Pending on create, as the API
  server sets them;
- the `pods/<name>/log` subresource with `tailLines` and `limitBytes`;
- `end_watches()`: the server drops its watch connections, optionally with a
  `410 Gone` ERROR event first (the client must list again);
- the `pods/<name>/exec` subresource over a WebSocket, in Kubernetes' channel
  protocols (v4.channel.k8s.io, v5.channel.k8s.io): the kubelet's part is played by
  this machine, which runs the command on a pty in the container's environment
  (`env`) and working directory; stdin, stdout, resize and the closing status
  travel on their channels as they do from a real API server (`exec_sessions`
  counts them).

`Kubelet` reports container states through the same HTTP API (PATCH of the
`status` subresource), as the node agent would, and writes the logs.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import copy
import datetime
import fcntl
import json
import os
import signal
import struct
import termios
import uuid
from typing import Any

import aiohttp.web
import attrs
import kmock

NAMESPACE = "pai-jobs"
EXEC_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")


def utc_now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).isoformat()


@attrs.define(kw_only=True)
class _RecordingBus(kmock.Bus):
    """kmock hands every change of an object to its resource's bus; this one also logs it."""

    emulator: Any = None
    resource: Any = None

    async def put(self, *items: Any) -> None:
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("object"), dict):
                await self.emulator._record(self.resource, item)
        await super().put(*items)


class _Buses(dict):
    def __init__(self, emulator: Any):
        super().__init__()
        self.emulator = emulator

    def __missing__(self, resource: Any) -> _RecordingBus:
        bus = self[resource] = _RecordingBus(emulator=self.emulator, resource=resource)
        return bus


@attrs.define(kw_only=True)
class PodApiEmulator(kmock.KubernetesEmulator):
    logs: dict[tuple[str, str], bytes] = attrs.field(factory=dict, init=False)
    # Accepted creations per object name (a refused duplicate does not count).
    created: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)
    _revision: int = attrs.field(default=0, init=False)
    _change_revisions: list[int] = attrs.field(factory=list, init=False)
    _changes: list[tuple[Any, dict]] = attrs.field(factory=list, init=False)
    _changed: asyncio.Condition = attrs.field(factory=asyncio.Condition, init=False)
    _watch_generation: int = attrs.field(default=0, init=False)
    _expired_generation: int = attrs.field(default=0, init=False)
    # Exec streams opened, and what each ran (the `command` parameters).
    exec_sessions: list[list[str]] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._buses = _Buses(self)

    # -- what tests use ------------------------------------------------------

    def pod(self, name: str, namespace: str = NAMESPACE) -> dict | None:
        """The stored Pod, or None when it does not exist (or was deleted)."""
        for (resource, ns, pod_name), obj in self.objects.items():
            if resource.plural == "pods" and ns == namespace and pod_name == name and not obj.deleted:
                return copy.deepcopy(obj.raw)
        return None

    def pod_reads(self, *, watch: bool) -> list[kmock.Request]:
        """The list (watch=False) or watch (watch=True) requests for Pods so far."""
        return [
            request
            for request in self
            if request.method == kmock.method.GET
            and request.resource is not None
            and request.resource.plural == "pods"
            and request.name is None
            and (request.params.get("watch", "").lower() in ("true", "1")) == watch
        ]

    async def end_watches(self, *, expired: bool = False) -> None:
        """Close every open watch stream, as an API server does from time to time;
        `expired`: with a 410 Gone ERROR event first, as a server does whose
        watch cache moved past the stream (the client must list again)."""
        async with self._changed:
            self._watch_generation += 1
            self._expired_generation = self._watch_generation if expired else self._expired_generation
            self._changed.notify_all()

    # -- server side ---------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource is not None and request.resource.plural == "pods" and request.subresource == "exec":
            return await self._serve_exec(request)
        if request.resource is not None and request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("namespace", request.namespace)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", utc_now())
            if request.resource.plural == "pods":
                request.data.setdefault("status", {"phase": "Pending"})
            if self.pod(meta.get("name"), meta.get("namespace")) is None:
                self.created[meta.get("name")] += 1
        return await super()._handle(request)

    async def _record(self, resource: Any, event: dict) -> None:
        self._revision += 1
        # The stored object shares its metadata with the event's object, so
        # lists and gets show the new version too.
        event["object"].setdefault("metadata", {})["resourceVersion"] = str(self._revision)
        self._change_revisions.append(self._revision)
        self._changes.append((resource, copy.deepcopy(event)))
        async with self._changed:
            self._changed.notify_all()

    async def _serve_list(self, request: kmock.Request) -> Any:
        # kmock recognises only `watch=true`; clients generated from the API's
        # OpenAPI spec send `watch=True`, which the API server accepts as well.
        if request.params.get("watch", "").lower() in ("true", "1"):
            return self._serve_watch(request)
        selector = _parse_selector(request.params.get("labelSelector"))
        return {
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": str(self._revision)},
            "items": self._current(request, selector),
        }

    async def _serve_watch(self, request: kmock.Request) -> Any:
        yield b""  # send the headers: the stream is open even if nothing happens
        selector = _parse_selector(request.params.get("labelSelector"))
        version = request.params.get("resourceVersion") or ""
        timeout = request.params.get("timeoutSeconds")
        loop = asyncio.get_running_loop()
        ends_at = loop.time() + float(timeout) if timeout else None
        generation = self._watch_generation
        if version in ("", "0"):
            cursor = self._revision
            for obj in self._current(request, selector):
                yield {"type": "ADDED", "object": obj}
        else:
            cursor = int(version)
        while True:
            start = bisect.bisect_right(self._change_revisions, cursor)
            changes = list(zip(self._change_revisions[start:], self._changes[start:], strict=True))
            for revision, (resource, event) in changes:
                cursor = revision
                if resource == request.resource and _selected(event["object"], request.namespace, selector):
                    yield copy.deepcopy(event)
            remaining = None if ends_at is None else ends_at - loop.time()
            if generation != self._watch_generation:
                if self._expired_generation > generation:
                    yield _expired(f"too old resource version: {cursor}")
                return
            if remaining is not None and remaining <= 0:
                return
            async with self._changed:
                if self._revision == cursor and generation == self._watch_generation:
                    try:
                        await asyncio.wait_for(self._changed.wait(), remaining)
                    except TimeoutError:
                        pass

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        if request.subresource == "log":
            return self._serve_log(request)
        return await super()._serve_fetch(request)

    async def _serve_exec(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        pod = self.pod(request.name, request.namespace)
        if pod is None:
            raise kmock.KubernetesObjectNotFoundError()
        command = raw.query.getall("command", [])
        wanted = raw.query.get("container")
        containers = pod["spec"]["containers"]
        container = next((c for c in containers if c["name"] == wanted), containers[0] if not wanted else None)
        if container is None or not command or raw.query.get("tty", "").lower() not in ("true", "1"):
            return aiohttp.web.json_response({"kind": "Status", "status": "Failure", "code": 400,
                                              "message": "the emulator's exec wants a container, a command and tty"},
                                             status=400)
        ws = aiohttp.web.WebSocketResponse(protocols=EXEC_PROTOCOLS)
        await ws.prepare(raw)
        self.exec_sessions.append(list(command))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp"}
        env.update({item["name"]: str(item.get("value", "")) for item in container.get("env", [])})
        workdir = container.get("workingDir") or "/"
        master, slave = os.openpty()
        try:
            process = await asyncio.create_subprocess_exec(
                *command, stdin=slave, stdout=slave, stderr=slave, start_new_session=True, env=env,
                cwd=workdir if os.path.isdir(workdir) else "/")
        finally:
            os.close(slave)
        loop = asyncio.get_running_loop()
        output: asyncio.Queue[bytes] = asyncio.Queue()

        def readable() -> None:
            try:
                data = os.read(master, 65536)
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(master)
            output.put_nowait(data)

        os.set_blocking(master, False)
        loop.add_reader(master, readable)

        async def to_client() -> None:
            while data := await output.get():
                await ws.send_bytes(b"\x01" + data)

        async def from_client() -> None:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.BINARY or not msg.data:
                    continue
                channel, data = msg.data[0], msg.data[1:]
                if channel == 0:
                    os.write(master, data)
                elif channel == 4:
                    size = json.loads(data)
                    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", size["Height"], size["Width"], 0, 0))

        pumps = [asyncio.ensure_future(to_client()), asyncio.ensure_future(from_client())]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGHUP)
        code = await process.wait()
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(master)
        os.close(master)
        status = {"metadata": {}, "status": "Success"} if code == 0 else {
            "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}
        if not ws.closed:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_bytes(b"\x03" + json.dumps(status).encode())
            await ws.close()
        return ws

    def _serve_log(self, request: kmock.Request) -> bytes:
        if self.pod(request.name, request.namespace) is None:
            raise kmock.KubernetesObjectNotFoundError()
        data = self.logs.get((request.namespace, request.name), b"")
        if request.params.get("tailLines"):
            data = b"".join(data.splitlines(keepends=True)[-int(request.params["tailLines"]) :])
        if request.params.get("limitBytes"):
            data = data[: int(request.params["limitBytes"])]
        return data

    def _current(self, request: kmock.Request, selector: list[tuple[str, str, str]]) -> list[dict]:
        return [
            copy.deepcopy(obj.raw)
            for (resource, namespace, _), obj in self.objects.items()
            if resource == request.resource
            and not obj.deleted
            and (request.namespace is None or namespace == request.namespace)
            and _selected(obj.raw, None, selector)
        ]


def _expired(message: str) -> dict:
    status = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 410, "reason": "Expired"}
    status["message"] = message
    return {"type": "ERROR", "object": status}


def _parse_selector(text: str | None) -> list[tuple[str, str, str]]:
    """`a=b,c!=d,e,!f` as (key, operator, value) triples."""
    terms = []
    for term in (text or "").split(","):
        term = term.strip()
        if not term:
            continue
        if "!=" in term:
            key, value = term.split("!=", 1)
            terms.append((key.strip(), "!=", value.strip()))
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            terms.append((key.strip(), "=", value.strip()))
        elif term.startswith("!"):
            terms.append((term[1:].strip(), "!", ""))
        else:
            terms.append((term, "exists", ""))
    return terms


def _selected(obj: dict, namespace: str | None, selector: list[tuple[str, str, str]]) -> bool:
    meta = obj.get("metadata") or {}
    if namespace is not None and meta.get("namespace") != namespace:
        return False
    labels = meta.get("labels") or {}
    for key, operator, value in selector:
        if operator == "=" and labels.get(key) != value:
            return False
        if operator == "!=" and labels.get(key) == value:
            return False
        if operator == "exists" and key not in labels:
            return False
        if operator == "!" and key in labels:
            return False
    return True


class Kubelet:
    """Plays the kubelet of every node: reports what the containers of PAI's Pods
    do, through the API over HTTP, and writes their output."""

    def __init__(self, emulator: PodApiEmulator, namespace: str = NAMESPACE):
        self.emulator = emulator
        self.namespace = namespace

    def write_log(self, name: str, data: bytes) -> None:
        key = (self.namespace, name)
        self.emulator.logs[key] = self.emulator.logs.get(key, b"") + data

    async def run(self, name: str) -> None:
        await self._report(name, "Running", {"running": {"startedAt": utc_now()}})

    async def exit(
        self, name: str, exit_code: int, *, reason: str | None = None, message: str = "", log: bytes = b""
    ) -> None:
        self.write_log(name, log)
        terminated = {
            "exitCode": exit_code,
            "reason": reason or ("Completed" if exit_code == 0 else "Error"),
            "startedAt": utc_now(),
            "finishedAt": utc_now(),
        }
        if message:
            terminated["message"] = message
        await self._report(name, "Succeeded" if exit_code == 0 else "Failed", {"terminated": terminated})

    async def evict(self, name: str, message: str) -> None:
        terminated = {"exitCode": 137, "reason": "Error", "startedAt": utc_now(), "finishedAt": utc_now()}
        await self._report(name, "Failed", {"terminated": terminated}, reason="Evicted", message=message)

    async def wait_on_image(self, name: str, reason: str = "ImagePullBackOff", message: str = "") -> None:
        waiting = {"reason": reason, "message": message or f'Back-off pulling image "{self._image(name)}"'}
        await self._report(name, "Pending", {"waiting": waiting})

    async def lose_node(self, name: str) -> None:
        """What the node controller of old clusters did to Pods of a dead node."""
        pod = self.emulator.pod(name, self.namespace) or {}
        message = f"Node {pod['spec']['nodeName']} which was running pod {name} is unresponsive"
        status = {"phase": "Unknown", "reason": "NodeLost", "message": message}
        await self._patch(name, {"status": status})

    async def _report(self, name: str, phase: str, state: dict, *, reason: str = "", message: str = "") -> None:
        container = self._container(name)
        status: dict = {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "imageID": f"docker-pullable://{container['image']}",
                    "containerID": f"containerd://{uuid.uuid5(uuid.NAMESPACE_URL, name).hex}",
                    "ready": "running" in state,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }
        if reason:
            status["reason"] = reason
            status["message"] = message
        await self._patch(name, {"status": status})

    async def _patch(self, name: str, body: dict) -> None:
        response = await self.emulator.patch(
            f"/api/v1/namespaces/{self.namespace}/pods/{name}/status",
            json=body,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert response.status == 200, await response.text()

    def _container(self, name: str) -> dict:
        pod = self.emulator.pod(name, self.namespace)
        assert pod is not None, f"no Pod {name}"
        return pod["spec"]["containers"][0]

    def _image(self, name: str) -> str:
        return self._container(name)["image"]


async def delete_pod(emulator: PodApiEmulator, name: str, namespace: str = NAMESPACE) -> int:
    """`kubectl delete pod`: someone other than PAI deletes it."""
    response = await emulator.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return response.status


async def wait_until(predicate, *, timeout: float = 5.0, what: str = "the condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
