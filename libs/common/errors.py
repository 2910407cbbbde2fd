"""PAI's one error taxonomy (docs/architecture.md, "The bus").

- `BadInput`: the message or request can never succeed; a consumer terminates
  it (`term`) with the reason logged, rest answers 4xx.
- `Transient`: try again later; a consumer naks it with a growing delay.
- anything else is a bug: logged loudly, the process exits and is restarted.

Every error rest answers is a JSON body `{code, message}` (plus `details` where a
field is named). The codes are OpenPAI's rest-server codes, so a client written
for OpenPAI recognises them; `CODES` below is the one table of them, and each
class names its code from it.
"""

from __future__ import annotations

# OpenPAI's error codes -> HTTP status, in one place.
CODES: dict[str, int] = {
    "InvalidParametersError": 400,  # a request field is missing, mistyped or out of bounds
    "InvalidProtocolError": 400,  # a job's protocol is not valid
    "UnauthorizedUserError": 401,  # no valid token, wrong or expired credentials
    "IncorrectPasswordError": 401,  # login with a wrong password (or an unknown user: same answer)
    "ForbiddenUserError": 403,  # signed in, but not allowed this
    "ForbiddenKeyError": 403,  # an action the platform reserves for itself (built-in groups, one's own admin flag)
    "NoJobError": 404,
    "NoUserError": 404,
    "NoGroupError": 404,
    "NoVirtualClusterError": 404,
    "NoTokenError": 404,
    "NoStorageError": 404,  # a storage no admin declared (libs/common/storages.py)
    "NoRuleError": 404,  # a failure rule (libs/common/rules_messages.py)
    "NoMarketItemError": 404,  # a marketplace item not there, or not visible to the caller (services/rest/market)
    "NotFoundError": 404,  # no such route
    "MethodNotAllowed": 405,
    "ConflictJobError": 409,
    "ConflictUserError": 409,
    "ConflictGroupError": 409,
    "ConflictRuleError": 409,
    "PreconditionFailed": 412,  # a rules change based on a rule set changed since
    "RequestTimeout": 408,  # the request's body did not arrive in time (http_body_timeout_seconds)
    "RequestEntityTooLarge": 413,
    "UnsupportedMediaType": 415,
    "TooManyRequestsError": 429,
    "QuotaExceededError": 507,  # a per-user quota of stored jobs, their bytes or tokens (rest_user_max_*)
    "InternalError": 500,
    "ServiceUnavailable": 503,  # NATS away: retry after a moment
}

# What aiohttp's own answers (no route, wrong method, a body over its cap) are called.
HTTP_STATUS_CODES: dict[int, str] = {
    400: "InvalidParametersError",
    401: "UnauthorizedUserError",
    403: "ForbiddenUserError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    429: "TooManyRequestsError",
}


def _code(name: str) -> tuple[str, int]:
    return name, CODES[name]


class PaiError(Exception):
    """Base of PAI's domain errors; `status` is the HTTP status rest maps it to."""

    code, status = _code("InternalError")

    def __init__(self, message: str, *, details: object | None = None):
        super().__init__(message)
        self.message = message
        self.details = details


class BadInput(PaiError):
    code, status = _code("InvalidParametersError")


class Unauthorized(PaiError):
    code, status = _code("UnauthorizedUserError")


class IncorrectPassword(Unauthorized):
    code, status = _code("IncorrectPasswordError")


class Forbidden(PaiError):
    code, status = _code("ForbiddenUserError")


class ForbiddenKey(Forbidden):
    code, status = _code("ForbiddenKeyError")


class NotFound(PaiError):
    code, status = _code("NoJobError")


class NoUser(NotFound):
    code, status = _code("NoUserError")


class NoGroup(NotFound):
    code, status = _code("NoGroupError")


class NoVirtualCluster(NotFound):
    code, status = _code("NoVirtualClusterError")


class NoToken(NotFound):
    code, status = _code("NoTokenError")


class NoStorage(NotFound):
    code, status = _code("NoStorageError")


class Conflict(PaiError):
    code, status = _code("ConflictJobError")


class ConflictUser(Conflict):
    code, status = _code("ConflictUserError")


class ConflictGroup(Conflict):
    code, status = _code("ConflictGroupError")


class TooLarge(PaiError):
    code, status = _code("RequestEntityTooLarge")


class RequestTimeout(PaiError):
    code, status = _code("RequestTimeout")


class TooManyRequests(PaiError):
    code, status = _code("TooManyRequestsError")


class QuotaExceeded(PaiError):
    """A per-user limit: `details` names it (`limit`), its `value`, what is `used`
    and what to do (`remedy`); 507 for stored things, 429 for things in flight."""

    code, status = _code("QuotaExceededError")

    def __init__(self, message: str, *, limit: str, value: int, used: int, remedy: str, status: int = 507):
        super().__init__(f"{message}; {remedy}",
                         details={"limit": limit, "value": value, "used": used, "remedy": remedy})
        self.status = status
        if status == 429:
            self.code = "TooManyRequestsError"


class Transient(PaiError):
    """Retry later: `delay` seconds is a hint for the first retry."""

    code, status = _code("ServiceUnavailable")

    def __init__(self, message: str, *, delay: float = 1.0):
        super().__init__(message)
        self.delay = delay
