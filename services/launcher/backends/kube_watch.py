"""List, then watch, PAI's Pods: the backend's only view of what the cluster does.

The usual informer loop of Kubernetes clients, kept small:
- `resync()` (the backend's) lists the Pods and returns the list's
  resourceVersion; the watch starts from there, so no change between the
  list and the watch is missed;
- each watch asks the server to end it after `timeout_seconds` (servers drop
  long watches anyway) and carries on from the last resourceVersion it saw,
  also from BOOKMARK events;
- `410 Gone` (the version is older than what the server still keeps) means
  changes were lost: list again;
- any other failure (server down, connection reset) waits, growing up to
  `max_retry_delay`, and lists again: a list is idempotent for the backend,
  a missed event is not.

The API's JSON is used as it is (no model classes): a Pod is a dict.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

import aiohttp
from kubernetes_asyncio.client import CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

GONE = 410
LIST_TIMEOUT_SECONDS = 60.0
# A watch that stays silent this long past its own server-side timeout is dead.
READ_SLACK_SECONDS = 30.0


class WatchExpired(Exception):
    """The server no longer has the changes since our resourceVersion."""


async def read_json(response: aiohttp.ClientResponse) -> dict:
    """The body of an API response made with `_preload_content=False`; raises on errors."""
    try:
        body = await response.read()
    finally:
        response.release()
    if not 200 <= response.status < 300:
        raise ApiException(status=response.status, reason=error_message(body))
    return json.loads(body)


async def list_pods(api: CoreV1Api, namespace: str, selector: str) -> tuple[list[dict], str]:
    """Every Pod matching `selector`, and the resourceVersion of that list."""
    response = await api.list_namespaced_pod(
        namespace, label_selector=selector, _preload_content=False, _request_timeout=LIST_TIMEOUT_SECONDS
    )
    body = await read_json(response)
    return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion") or "")


class PodWatch:
    def __init__(
        self,
        api: CoreV1Api,
        namespace: str,
        *,
        selector: str,
        resync: Callable[[], Awaitable[str]],
        on_event: Callable[[str, dict], Awaitable[None]],
        timeout_seconds: int = 300,
        min_retry_delay: float = 0.5,
        max_retry_delay: float = 10.0,
    ):
        self.api = api
        self.namespace = namespace
        self.selector = selector
        self.timeout_seconds = timeout_seconds
        self.min_retry_delay = min_retry_delay
        self.max_retry_delay = max_retry_delay
        self._resync = resync
        self._on_event = on_event

    async def run(self, resource_version: str | None = None) -> None:
        """Watch until cancelled; `resource_version` skips the first list."""
        version = resource_version
        delay = self.min_retry_delay
        while True:
            try:
                if version is None:
                    version = await self._resync()
                version = await self._watch_once(version)
                delay = self.min_retry_delay
            except WatchExpired:
                log.info("pod watch expired at resourceVersion %s; listing again", version)
                version = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the watch must outlive any failure; it lists again
                log.warning("pod watch failed (%s: %s); listing again in %.1fs", type(exc).__name__, exc, delay)
                version = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_retry_delay)

    async def _watch_once(self, version: str) -> str:
        """One watch request; returns the resourceVersion to go on from."""
        response = await self.api.list_namespaced_pod(
            self.namespace,
            label_selector=self.selector,
            watch=True,
            resource_version=version or None,
            timeout_seconds=self.timeout_seconds,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(total=None, sock_read=self.timeout_seconds + READ_SLACK_SECONDS),
        )
        try:
            if response.status == GONE:
                raise WatchExpired()
            if not 200 <= response.status < 300:
                raise ApiException(status=response.status, reason=error_message(await response.read()))
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, pod = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if pod.get("code") == GONE:
                        raise WatchExpired()
                    raise ApiException(status=pod.get("code"), reason=pod.get("message"))
                if kind != "BOOKMARK":
                    await self._on_event(kind, pod)
                version = str((pod.get("metadata") or {}).get("resourceVersion") or version)
            return version
        finally:
            response.close()


def error_message(body: bytes) -> str:
    try:
        status = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")[:500]
    if isinstance(status, dict):
        return str(status.get("message") or status.get("reason") or status)[:500]
    return str(status)[:500]
