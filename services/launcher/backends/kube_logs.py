"""Reading the end of a container's log through the Kubernetes API.

The API can cut a log by lines from the end (`tailLines`) and by bytes from
the start of what it sends (`limitBytes`), but not by bytes from the end, which
is what failure analysis wants ("the last 64 KiB"). So: ask for a number of
lines that likely covers the wanted bytes, with a byte cap as a guard against
huge lines; ask for four times more lines while the answer is short and the log
is longer; ask for fewer when the cap cut the answer; keep the last bytes.
"""

from __future__ import annotations

from kubernetes_asyncio.client import CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from services.launcher.backends.kube_watch import error_message

# Bytes per line assumed for the first request (short lines are common in logs).
ASSUMED_LINE_BYTES = 32
MAX_ATTEMPTS = 6
MIN_CAP_BYTES = 1024 * 1024
LOG_TIMEOUT_SECONDS = 60.0


async def read_log(
    api: CoreV1Api,
    namespace: str,
    pod: str,
    container: str,
    *,
    tail_bytes: int | None = None,
) -> bytes:
    """The container's log, or its last `tail_bytes` bytes (None: all of it)."""
    if tail_bytes is None:
        return await _fetch(api, namespace, pod, container)
    if tail_bytes <= 0:
        return b""
    cap = max(4 * tail_bytes, MIN_CAP_BYTES)
    lines = max(16, tail_bytes // ASSUMED_LINE_BYTES)
    shrunk = False
    data = b""
    for _ in range(MAX_ATTEMPTS):
        data = await _fetch(api, namespace, pod, container, tail_lines=lines, limit_bytes=cap)
        if len(data) >= cap and lines > 1:
            # The cap cut the answer, so it is the start of the window, not its end.
            lines, shrunk = max(1, lines // 4), True
            continue
        whole_log = data.count(b"\n") < lines
        if len(data) >= tail_bytes or whole_log or shrunk:
            break
        lines *= 4
    return data[-tail_bytes:]


async def _fetch(
    api: CoreV1Api,
    namespace: str,
    pod: str,
    container: str,
    *,
    tail_lines: int | None = None,
    limit_bytes: int | None = None,
) -> bytes:
    # Raw bytes: the client would try to parse the log as JSON otherwise.
    response = await api.read_namespaced_pod_log(
        pod,
        namespace,
        container=container,
        tail_lines=tail_lines,
        limit_bytes=limit_bytes,
        _preload_content=False,
        _request_timeout=LOG_TIMEOUT_SECONDS,
    )
    try:
        body = await response.read()
    finally:
        response.release()
    if not 200 <= response.status < 300:
        raise ApiException(status=response.status, reason=error_message(body))
    return body
