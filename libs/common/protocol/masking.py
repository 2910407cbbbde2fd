"""Keep secrets out of what PAI shows back: the stored config and error messages.

The protocol asks that `secrets` be kept from anybody reading the job later
(GET .../config, job cloning, logs); registry passwords under a docker image's
`auth` are treated the same way. Commands keep secret references, not values
(render.py); the launcher fills them in and scrubs the values from what a task
prints before PAI shows it (`scrub_text`, `scrub_bytes`).
"""

from __future__ import annotations

from libs.common.protocol.model import FieldError
from libs.common.protocol.paths import RawMapping

MASK = "******"


def masked_config(data: RawMapping) -> RawMapping:
    """A copy of the document with secret values replaced; untouched parts are shared, not copied."""
    config = dict(data)
    if isinstance(config.get("secrets"), dict):
        config["secrets"] = _mask_values(config["secrets"])
    if isinstance(config.get("prerequisites"), list):
        config["prerequisites"] = [_mask_auth(item) for item in config["prerequisites"]]
    return config


def secret_values(data: RawMapping) -> list[str]:
    """Every secret text in the document, longest first so a secret inside another is masked whole."""
    found: list[str] = []

    def collect(value: object) -> None:
        if isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)
        elif isinstance(value, (str, int, float)) and not isinstance(value, bool) and str(value):
            found.append(str(value))

    collect(data.get("secrets"))
    prerequisites = data.get("prerequisites")
    for item in prerequisites if isinstance(prerequisites, list) else []:
        auth = item.get("auth") if isinstance(item, dict) else None
        if isinstance(auth, dict) and auth.get("password") is not None:
            collect(auth["password"])
    return sorted(set(found), key=len, reverse=True)


def scrub_errors(errors: list[FieldError], secrets: list[str]) -> list[FieldError]:
    if not secrets:
        return errors
    return [_scrub(error, secrets) for error in errors]


def _scrub(error: FieldError, secrets: list[str]) -> FieldError:
    message = error.message
    for secret in secrets:
        message = message.replace(secret, MASK)
    if message == error.message:
        return error
    return FieldError(path=error.path, rule=error.rule, message=message, line=error.line)


def _mask_values(value: object) -> object:
    if isinstance(value, dict):
        return {key: _mask_values(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_mask_values(item) for item in value]
    return MASK


def _mask_auth(prerequisite: object) -> object:
    if not isinstance(prerequisite, dict) or not isinstance(prerequisite.get("auth"), dict):
        return prerequisite
    auth = prerequisite["auth"]
    if "password" not in auth:
        return prerequisite
    return {**prerequisite, "auth": {**auth, "password": MASK}}


def scrub_text(text: str, secrets: list[str]) -> str:
    """`text` with every secret (longest first, see secret_values) replaced by MASK."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def scrub_bytes(data: bytes, secrets: list[str]) -> bytes:
    for secret in secrets:
        raw = secret.encode()
        if raw in data:
            data = data.replace(raw, MASK.encode())
    return data
