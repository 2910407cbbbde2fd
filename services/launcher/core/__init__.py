"""The launcher's pure core: job and task lifecycle (see `lifecycle.LauncherCore`)."""

from services.launcher.core.actions import Action, ForgetTask, KillTask, Publish, SaveJob, StartTask, StartTimer
from services.launcher.core.env import PeerAddress, task_env
from services.launcher.core.events import (
    Archived,
    BackoffElapsed,
    LauncherEvent,
    LogsPruned,
    Placed,
    PortsBusy,
    PreemptRequested,
    StopRequested,
    Submitted,
    Verdict,
    from_message,
)
from services.launcher.core.invariants import InvariantViolation
from services.launcher.core.lifecycle import LauncherCore
from services.launcher.core.transitions import IllegalTransition

__all__ = [
    "Action",
    "Archived",
    "BackoffElapsed",
    "ForgetTask",
    "IllegalTransition",
    "InvariantViolation",
    "KillTask",
    "LauncherCore",
    "LauncherEvent",
    "LogsPruned",
    "PeerAddress",
    "Placed",
    "PortsBusy",
    "PreemptRequested",
    "Publish",
    "SaveJob",
    "StartTask",
    "StartTimer",
    "StopRequested",
    "Submitted",
    "Verdict",
    "from_message",
    "task_env",
]
