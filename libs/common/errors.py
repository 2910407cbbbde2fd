"""PAI's one error taxonomy (DESIGN.md, "How the services talk").

- `BadInput`: the message or request can never succeed; a consumer terminates
  it (`term`) with the reason logged, rest answers 4xx.
- `Transient`: try again later; a consumer naks it with a growing delay.
- anything else is a bug: logged loudly, the process exits and is restarted.
"""

from __future__ import annotations


class PaiError(Exception):
    """Base of PAI's domain errors; `status` is the HTTP status rest maps it to."""

    status = 500
    code = "InternalError"

    def __init__(self, message: str, *, details: object | None = None):
        super().__init__(message)
        self.message = message
        self.details = details


class BadInput(PaiError):
    status = 400
    code = "BadRequest"


class Unauthorized(PaiError):
    status = 401
    code = "UnauthorizedUserError"


class Forbidden(PaiError):
    status = 403
    code = "ForbiddenUserError"


class NotFound(PaiError):
    status = 404
    code = "NoJobError"


class Conflict(PaiError):
    status = 409
    code = "ConflictJobError"


class TooLarge(PaiError):
    status = 413
    code = "RequestEntityTooLarge"


class Transient(PaiError):
    """Retry later: `delay` seconds is a hint for the first retry."""

    status = 503
    code = "ServiceUnavailable"

    def __init__(self, message: str, *, delay: float = 1.0):
        super().__init__(message)
        self.delay = delay
