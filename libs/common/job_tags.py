"""A job tag asked for over the bus: the monitor's tag-job alert action asks, rest
answers by changing the job's tags through its own tag code (services/rest/tag_requests.py),
so the monitor needs no API token. Only the monitor may ask (libs/common/busauth.py):
the bus's permission is the authority, as an admin's token is on the HTTP route."""

from __future__ import annotations

import msgspec

from libs.common.document_messages import Outcome


class TagRequest(msgspec.Struct, frozen=True, kw_only=True):
    job: str  # user~name
    tag: str  # as the API takes it (1-64 of letters, digits, _ . : -)
    by: str = ""  # who asks, for the log: "alert <rule>"


class TagReply(msgspec.Struct, frozen=True, kw_only=True):
    outcome: Outcome  # OK; INVALID (the tag), NOT_FOUND (the job): asking again changes nothing
    message: str = ""
