"""What the launcher core asks its shell to do.

Contract for the shell: persist every `SaveJob` of one `handle()` call (they come
first in the list, one per job the call changed) before doing any other action
of that call, then do the rest in order; the publications may all wait until
the end of the call (each is in its job's saved outbox already), keeping their
order. Publishing uses `event.id` as `Nats-Msg-Id`.
"""

from __future__ import annotations

import msgspec

from libs.common import messages
from libs.common.records import JobRecord
from services.launcher.core.tasks import TaskKey, TaskLaunch


class SaveJob(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Write the job status document to the `pai_job_status` bucket."""

    record: JobRecord


class StartTask(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    launch: TaskLaunch


class KillTask(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    key: TaskKey
    reason: str
    grace_seconds: float


class Publish(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    event: messages.Event


class StartTimer(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Deliver `BackoffElapsed(job, attempt)` to the core at wall-clock time `at`."""

    job: str
    attempt: int
    at: float


class ForgetTask(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The task's exit is recorded; the backend may drop its bookkeeping."""

    key: TaskKey


Action = SaveJob | StartTask | KillTask | Publish | StartTimer | ForgetTask
