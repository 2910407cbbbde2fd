"""What rest owns in KV: submitted jobs and users/tokens."""

from __future__ import annotations

import msgspec

from libs.common.protocol.model import JobSpec


class SubmittedJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job as accepted at intake (bucket pai_jobs, key user.name)."""

    job: str
    user: str
    name: str
    vc: str
    spec: JobSpec
    config: dict  # the submitted document, secrets masked
    warnings: list[str] = []
    submittedAt: float
    # Set once JobSubmitted is on the bus; a record left False by a crash is
    # published again when rest starts (the event id dedupes it).
    published: bool = False


class User(msgspec.Struct, frozen=True, kw_only=True):
    """Bucket pai_users, key `user.<name>`; tokens are stored as `token.<sha256>` -> name."""

    username: str
    admin: bool = False
    email: str = ""
    virtualClusters: list[str] = []  # empty: every VC


class NewUser(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of POST /api/v2/users, read strictly: `"admin": "false"` is refused, not an admin."""

    username: str
    admin: bool = False
    email: str = ""
