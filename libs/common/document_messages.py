"""What an admin-editable document's commands answer, without the transport (no nats).

A document an admin edits at run time (the runtime's failure rules, the monitor's
alert rules) is kept in one KV key by the service that applies it
(`libs.common.documents`); rest forwards the admin's command over request/reply
and turns the answer's `Outcome` into the matching HTTP error here. The service
cores build their answers from these types, so this module loads no asyncio,
nats or aiohttp.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from libs.common.errors import BadInput, Conflict, NotFound, PaiError, Transient


class Outcome(StrEnum):
    OK = "ok"
    INVALID = "invalid"  # the document or the request is wrong: `problems` says where
    NOT_FOUND = "not_found"  # no entry of that name in the document
    STALE = "stale"  # the document changed since the revision the admin named
    BUSY = "busy"  # others kept changing the document; try again
    UNAVAILABLE = "unavailable"  # the service could not reach the document's store


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    path: str  # field path inside what was sent, e.g. "rules[2] (JobFailed).threshold"
    message: str


def raise_for_outcome(
    outcome: Outcome, message: str, problems: list[Problem], *, invalid_rule: str,
    stale: type[PaiError], not_found: type[PaiError] = NotFound, busy: type[PaiError] = Conflict,
) -> None:
    """Raise the PAI error an answer stands for (nothing for OK): `stale` a 412
    (the document's own), `invalid_rule` names the check each problem failed in
    the 400's `errors`."""
    match outcome:
        case Outcome.OK:
            return
        case Outcome.INVALID:
            raise BadInput(message, details={"errors": [
                {"path": p.path, "rule": invalid_rule, "message": p.message} for p in problems]})
        case Outcome.NOT_FOUND:
            raise not_found(message)
        case Outcome.STALE:
            raise stale(message)
        case Outcome.BUSY:
            raise busy(message)
        case Outcome.UNAVAILABLE:
            raise Transient(message)
