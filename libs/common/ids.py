"""Typed identifiers shared by every service.

A job id is OpenPAI's `{user}~{name}`. NATS subjects and KV keys cannot hold `~`
in every position we need, so `job_key` gives the bus-safe form `{user}.{name}`.
"""

from __future__ import annotations

import re
from typing import NewType

JobId = NewType("JobId", str)
UserName = NewType("UserName", str)
VcName = NewType("VcName", str)
NodeName = NewType("NodeName", str)
EventId = NewType("EventId", str)

# OpenPAI's rule for job names, user names and VC names: no dots, so they are
# safe as single NATS subject tokens and KV key segments.
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]+$")


def job_id(user: str, name: str) -> JobId:
    return JobId(f"{user}~{name}")


def split_job_id(jid: str) -> tuple[str, str]:
    user, sep, name = jid.partition("~")
    if not sep or not NAME_PATTERN.match(user) or not NAME_PATTERN.match(name):
        raise ValueError(f"job id {jid!r} is not of the form user~name")
    return user, name


def job_key(jid: str) -> str:
    """The KV key / subject tail for a job: `user.name`."""
    user, name = split_job_id(jid)
    return f"{user}.{name}"


def job_id_from_key(key: str) -> JobId:
    user, _, name = key.partition(".")
    return job_id(user, name)


def node_token(node: str) -> str:
    """Node names are often IP addresses; dots are not allowed in one subject token."""
    return re.sub(r"[^a-zA-Z0-9_-]", "_", node)
