"""The ssh plugin at intake, and the job's key pair for its owner.

At submission of a job asking for OpenPAI's `ssh` plugin, rest generates the job's
key pair, reads the owner's profile keys (`extension.sshKeys`) and folds the server
into the job's roles (libs/common/protocol/ssh.py). The private key goes two ways:
sealed with the job's secrets for the launcher (as any secret: the tasks get it, no
service log or event carries it), and kept for `GET /api/v2/jobs/{id}/ssh`, which
hands it to the job's owner alone, in rest's own bucket (pai_users, which only
services read: `jobssh.<job key>`), deleted with the job.
"""

from __future__ import annotations

from typing import Any

import msgspec

from libs.common import ids
from libs.common.bus import Bus, get_json
from libs.common.errors import BadInput
from libs.common.protocol import ssh
from libs.common.protocol.model import JobSpec
from libs.common.protocol.paths import RawMapping
from libs.common.subjects import Bucket
from services.rest.identity import store as identity_store


class JobKeyPair(msgspec.Struct, frozen=True, kw_only=True):
    privateKey: str
    publicKey: str


def key_of(jid: str) -> str:
    return f"jobssh.{ids.job_key(jid)}"


async def prepare(bus: Bus, user: str, jid: str, spec: JobSpec, config: RawMapping, secrets: RawMapping
                  ) -> tuple[JobSpec, RawMapping, JobKeyPair | None]:
    """(spec, secrets to seal, the key pair to keep) of a job; unchanged without the plugin."""
    request = ssh.ssh_request(config)
    if request is None:
        return spec, secrets, None
    declared = config.get("secrets")
    if isinstance(declared, dict) and ssh.SECRET_NAME in declared:
        raise BadInput(f"secrets.{ssh.SECRET_NAME}: the name is PAI's (the ssh plugin's job key); rename the secret",
                       details={"errors": [{"path": f"secrets.{ssh.SECRET_NAME}", "rule": "reserved",
                                            "message": "reserved by the ssh plugin"}]})
    found = await identity_store.get_user(bus, user)
    profile = ssh.profile_keys(found[0].extension) if found is not None else []
    private, public = ssh.generate_key_pair(f"pai-job-{jid}")
    spec = ssh.with_ssh(spec, request, public, profile)
    return spec, {**secrets, ssh.SECRET_NAME: private}, JobKeyPair(privateKey=private, publicKey=public)


async def keep(bus: Bus, jid: str, pair: JobKeyPair) -> None:
    await (await bus.kv(Bucket.USERS)).put(key_of(jid), msgspec.json.encode(pair))


async def read(bus: Bus, jid: str) -> JobKeyPair | None:
    got = await get_json(await bus.kv(Bucket.USERS), key_of(jid), JobKeyPair)
    return got[0] if got is not None else None


async def forget(bus: Bus, jid: str) -> None:
    try:
        await (await bus.kv(Bucket.USERS)).purge(key_of(jid))
    except Exception:  # noqa: BLE001 - nothing kept (a job without the plugin): nothing to forget
        pass


def key_pair_view(jid: str, pair: JobKeyPair | None, *, with_private: bool) -> dict[str, Any] | None:
    """OpenPAI's keyPair, its key files named; the private key's text for the owner only."""
    if pair is None:
        return None
    name = ids.job_key(jid)
    view: dict[str, Any] = {"publicKeyFileName": f"{name}.pub", "privateKeyFileName": name,
                            "publicKey": pair.publicKey}
    if with_private:
        view["privateKey"] = pair.privateKey
    return view
