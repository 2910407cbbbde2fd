"""A job's secrets on the bus: sealed by rest at intake, opened by the launcher at launch.

Stored once, in the `pai_secrets` bucket under the job's key, before the job
record exists (so a launcher that sees the job can always find them), sealed
with the launcher's public key (libs.common.sealing) and bound to the job key.
Only a job whose commands reference a secret has an entry, and only such a job
costs the launcher a read (`needs_secrets`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import msgspec
import nats.js.errors

from libs.common import sealing
from libs.common.errors import Conflict, Transient
from libs.common.protocol.masking import secret_values
from libs.common.protocol.render import has_secret_references


class SecretsUnavailable(Transient):
    """The platform cannot seal or open secrets (no key configured or readable)."""


def needs_secrets(commands: list[str]) -> bool:
    return has_secret_references(commands)


@functools.lru_cache(maxsize=4)
def _public_key(path: str):
    return sealing.load_public_key(path)


@functools.lru_cache(maxsize=4)
def _private_key(path: str):
    return sealing.load_private_key(path)


def public_key(path: str):
    if not path:
        raise SecretsUnavailable("this platform has no key to seal job secrets with (secrets_public_key_file is not set)")
    try:
        return _public_key(str(Path(path).expanduser()))
    except (OSError, ValueError) as exc:
        raise SecretsUnavailable(f"the key to seal job secrets with cannot be read: {type(exc).__name__}") from None


def private_key(path: str):
    if not path:
        raise SecretsUnavailable("the launcher has no key to open job secrets with (secrets_private_key_file is not set)")
    try:
        return _private_key(str(Path(path).expanduser()))
    except (OSError, ValueError) as exc:
        raise SecretsUnavailable(f"the key to open job secrets with cannot be read: {type(exc).__name__}") from None


async def store(kv, key_file: str, job_key: str, secrets: dict, *, job_exists) -> None:
    """Seal `secrets` and store them under `job_key`, once.

    An entry already there belongs either to a live job of the same name
    (`await job_exists()` is true: 409, and the entry is left alone) or to an
    intake cut short before its record was written (replaced).
    """
    blob = sealing.seal(public_key(key_file), msgspec.json.encode(secrets), aad=job_key.encode())
    try:
        # Not kv.create: on a conflict it reads the entry back, and rest may
        # not read this bucket (it only writes it).
        await kv.update(job_key, blob, last=0)
    except nats.js.errors.KeyWrongLastSequenceError:
        if await job_exists():
            raise Conflict(f"job {job_key} already exists; job names are unique per user") from None
        await kv.put(job_key, blob)


async def fetch(kv, key_file: str, job_key: str) -> dict:
    """The opened secrets of a job; raises SecretsUnavailable if they cannot be had."""
    try:
        entry = await kv.get(job_key)
    except nats.js.errors.KeyNotFoundError:
        raise SecretsUnavailable(f"the sealed secrets of {job_key} are missing") from None
    try:
        plain = sealing.open_sealed(private_key(key_file), entry.value or b"", aad=job_key.encode())
    except sealing.SealError as exc:
        raise SecretsUnavailable(f"the sealed secrets of {job_key} do not open: {exc}") from None
    return msgspec.json.decode(plain)


def values_of(secrets: dict) -> list[str]:
    """Every secret text to scrub from what PAI shows, longest first."""
    return secret_values({"secrets": secrets})
