"""The few fields of the launcher's job record that the monitor needs after a restart.

The launcher owns `pai_job_status` (`libs.common.records.JobRecord`). The monitor
reads only the job's VC, state, attempt and when it finished, and ignores every other field, so
the record can grow without the monitor having to follow.
"""

from __future__ import annotations

import msgspec

from libs.common.messages import JobState


class StoredJob(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    vc: str
    state: JobState = JobState.WAITING  # the record leaves its defaults out
    attempt: int = 1
    completedTime: float | None = None  # set once finished


_decoder = msgspec.json.Decoder(StoredJob)


def decode_stored_job(data: bytes) -> StoredJob:
    """Raises msgspec.ValidationError/DecodeError on a value without those fields."""
    return _decoder.decode(data)
