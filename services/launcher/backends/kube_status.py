"""What a Pod's status means for its task: still waiting, running, or ended how.

Pure: `judge` reads one Pod (as the API's JSON) and the current time and
returns a verdict; the backend acts on it (reports, arms a timer, ends the
Pod). The rules, first match wins:

1. A terminated container, or phase Succeeded/Failed: the task ended. Exit code
   and signal from the container (-1 when it never ran; a code 128+n without
   an explicit signal counts as signal n, as the shell reports it). The
   platform reason, most telling first: PAI's own end request (stop,
   preemption: the `pai/end` annotation), the Pod's reason (Evicted, NodeLost,
   OutOfcpu, ...), the container's reason unless ordinary (OOMKilled,
   ContainerCannotRun, ...), NodeLost for a deletion PAI did not ask for.
2. The Pod object is gone without a final status: its end request's reason, or
   NodeLost (something outside PAI removed it, or its node went away).
3. Pod reason NodeLost: the node stopped answering; the task is lost (with
   PAI's end reason when PAI was stopping it anyway).
4. Being deleted: ended at once when the container never started; otherwise
   wait for the kubelet to report the container's end until the grace period
   plus a margin is over (a lost node never reports), then count it as ended
   with exit code -1.
5. Waiting on an image pull: an image name that can never work ends the task
   at once; a failing pull (ErrImagePull, ImagePullBackOff) ends it once it
   has lasted `pull_timeout` seconds, since a registry hiccup heals itself.
   Either way the platform reason is ImagePullBackOff and the Pod is ended.
6. A running container: running. Anything else: pending.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from services.launcher.backends.kube_pods import EndRequest, read_end

# The exit code of a task whose container never reported one (the local
# backend uses the same value for a task that never ran).
NO_EXIT_CODE = -1
NODE_LOST = "NodeLost"
IMAGE_PULL_FAILED = "ImagePullBackOff"
PULL_RETRYING = frozenset({"ErrImagePull", "ImagePullBackOff"})
PULL_HOPELESS = frozenset({"InvalidImageName", "ErrImageNeverPull"})
# Container termination reasons that say nothing beyond the exit code.
ORDINARY_TERMINATION = frozenset({"", "Completed", "Error"})
MAX_SIGNAL = 64


class Pending(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    pass


class Running(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    node: str


class Exited(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    exitCode: int
    signal: int | None = None
    platformReason: str = ""
    platformMessage: str = ""
    started: bool = False  # the container ran at some point
    endPod: bool = False  # the backend must still delete the Pod (PAI decided the end)


class Terminating(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Deleted, waiting for the kubelet to report the container's end until `deadline`."""

    deadline: float


class PullFailing(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The image pull keeps failing; the task ends at `deadline` unless it heals."""

    deadline: float


Verdict = Pending | Running | Exited | Terminating | PullFailing


def judge(
    pod: dict,
    *,
    now: float,
    gone: bool = False,
    pull_since: float | None = None,
    pull_timeout: float = 120.0,
    termination_margin: float = 30.0,
    end: EndRequest | None = None,
) -> Verdict:
    """The verdict on `pod` at wall-clock time `now`.

    `gone`: the Pod object was deleted; `pull_since`: when the backend first saw
    it waiting on a failing image pull; `end`: PAI's end request when the Pod
    does not carry one yet (its annotation wins).
    """
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    end = read_end(pod) or end
    container = _container_status(status)
    state = container.get("state") or {}
    terminated = state.get("terminated")
    running = state.get("running")
    waiting = _waiting(status)
    phase = status.get("phase") or "Pending"
    pod_reason = status.get("reason") or ""
    pod_message = status.get("message") or ""
    deleted_at = _timestamp(meta.get("deletionTimestamp"))
    started = bool(running or terminated)

    if terminated or phase in ("Succeeded", "Failed"):
        exit_code = _exit_code(terminated)
        reason, message = _exit_reason(end, pod_reason, pod_message, terminated, deleted_at is not None)
        return Exited(
            exitCode=exit_code,
            signal=_signal(terminated, exit_code),
            platformReason=reason,
            platformMessage=message,
            started=started,
        )
    if gone:
        if end is not None:
            return Exited(
                exitCode=NO_EXIT_CODE, platformReason=end.reason, platformMessage=end.message, started=started
            )
        return Exited(
            exitCode=NO_EXIT_CODE,
            platformReason=NODE_LOST,
            platformMessage="the Pod disappeared before it finished; PAI did not delete it "
            "(its node was lost, or someone removed it)",
            started=started,
        )
    if pod_reason == NODE_LOST:
        reason, message = (end.reason, end.message) if end is not None else (NODE_LOST, pod_message)
        return Exited(exitCode=NO_EXIT_CODE, platformReason=reason, platformMessage=message, started=started)
    if deleted_at is not None:
        reason = end.reason if end is not None else NODE_LOST
        if not started:
            message = end.message if end is not None else "the Pod was deleted before it ran; PAI did not delete it"
            return Exited(exitCode=NO_EXIT_CODE, platformReason=reason, platformMessage=message)
        asked_until = end.requestedAt + end.graceSeconds if end is not None else deleted_at
        deadline = max(deleted_at, asked_until) + termination_margin
        if now < deadline:
            return Terminating(deadline=deadline)
        return Exited(
            exitCode=NO_EXIT_CODE,
            platformReason=reason,
            platformMessage=(end.message + "; " if end is not None and end.message else "")
            + f"the container did not report its end within {termination_margin:g}s after the grace period; "
            "its node may be lost",
            started=started,
        )
    waiting_reason = waiting.get("reason") or ""
    if waiting_reason in PULL_HOPELESS:
        return _pull_failed(waiting)
    if waiting_reason in PULL_RETRYING:
        since = now if pull_since is None else pull_since
        if now - since >= pull_timeout:
            return _pull_failed(waiting)
        return PullFailing(deadline=since + pull_timeout)
    if running:
        return Running(node=(pod.get("spec") or {}).get("nodeName") or "")
    return Pending()


def image_pull_failing(pod: dict) -> bool:
    """Whether the Pod waits on an image pull that failed (the clock for rule 5)."""
    return (_waiting(pod.get("status") or {}).get("reason") or "") in PULL_RETRYING


def _pull_failed(waiting: dict) -> Exited:
    detail = waiting.get("reason") or IMAGE_PULL_FAILED
    message = waiting.get("message") or ""
    return Exited(
        exitCode=NO_EXIT_CODE,
        platformReason=IMAGE_PULL_FAILED,
        platformMessage=f"{detail}: {message}" if message else detail,
        endPod=True,
    )


def _exit_reason(
    end: EndRequest | None,
    pod_reason: str,
    pod_message: str,
    terminated: dict | None,
    deleting: bool,
) -> tuple[str, str]:
    container_reason = (terminated or {}).get("reason") or ""
    container_message = (terminated or {}).get("message") or ""
    if end is not None:
        return end.reason, end.message
    if pod_reason:
        return pod_reason, pod_message
    if container_reason not in ORDINARY_TERMINATION:
        return container_reason, container_message
    if deleting:
        return NODE_LOST, "the Pod was deleted while it ran; PAI did not delete it"
    return "", pod_message or container_message


def _exit_code(terminated: dict | None) -> int:
    if not terminated:
        return NO_EXIT_CODE
    code = terminated.get("exitCode")
    return int(code) if isinstance(code, int) else NO_EXIT_CODE


def _signal(terminated: dict | None, exit_code: int) -> int | None:
    explicit = (terminated or {}).get("signal")
    if isinstance(explicit, int) and explicit > 0:
        return explicit
    if 128 < exit_code <= 128 + MAX_SIGNAL:
        return exit_code - 128
    return None


def _container_status(status: dict) -> dict:
    # One container per Pod: the task's.
    statuses = status.get("containerStatuses") or []
    return statuses[0] if statuses else {}


def _waiting(status: dict) -> dict:
    # An init container's failing pull (the ssh plugin's, of PAI's own image) holds the
    # task container in PodInitializing: judged as the task's own image would be.
    for init in status.get("initContainerStatuses") or []:
        waiting = (init.get("state") or {}).get("waiting") or {}
        if (waiting.get("reason") or "") in PULL_RETRYING | PULL_HOPELESS:
            return waiting
    return (_container_status(status).get("state") or {}).get("waiting") or {}


def _timestamp(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None
