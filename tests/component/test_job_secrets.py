"""Job secrets in the `pai_secrets` bucket: rest stores them sealed, once; the
launcher alone opens them; what a task prints is scrubbed of them."""

from __future__ import annotations

import pytest

from libs.common import job_secrets, sealing
from libs.common.bus import Bus
from libs.common.errors import Conflict
from libs.common.protocol.masking import MASK, scrub_bytes, scrub_text
from libs.common.subjects import Bucket

SECRETS = {"token": "tok-123456", "nested": {"key": "inner-7890"}, "n": 4242}


@pytest.fixture
def keys(tmp_path):
    sealing.write_key_pair(tmp_path / "secrets.key", tmp_path / "secrets.pub")
    return str(tmp_path / "secrets.pub"), str(tmp_path / "secrets.key")


async def connect(nats_server, user: str) -> Bus:
    return await Bus.connect(nats_server.url, name=f"secrets-test-{user}", **nats_server.login(user))


async def test_rest_stores_sealed_and_the_launcher_opens(nats_server, keys):
    public, private = keys
    rest, launcher = await connect(nats_server, "rest"), await connect(nats_server, "launcher")
    try:
        await job_secrets.store(await rest.kv(Bucket.SECRETS), public, "alice.sealed", SECRETS, job_exists=_no)
        readable = await launcher.kv(Bucket.SECRETS)
        raw = (await readable.get("alice.sealed")).value
        assert b"tok-123456" not in raw and b"inner-7890" not in raw
        opened = await job_secrets.fetch(readable, private, "alice.sealed")
        assert opened == SECRETS
    finally:
        await rest.close()
        await launcher.close()


async def test_a_second_intake_of_a_live_job_is_refused_and_leaves_its_secrets(nats_server, keys):
    public, private = keys
    rest, launcher = await connect(nats_server, "rest"), await connect(nats_server, "launcher")
    try:
        kv = await rest.kv(Bucket.SECRETS)
        await job_secrets.store(kv, public, "alice.twice", SECRETS, job_exists=_no)
        with pytest.raises(Conflict):
            await job_secrets.store(kv, public, "alice.twice", {"token": "other"}, job_exists=_yes)
        assert await job_secrets.fetch(await launcher.kv(Bucket.SECRETS), private, "alice.twice") == SECRETS
        # An intake cut short before its record was written is simply replaced.
        await job_secrets.store(kv, public, "alice.twice", {"token": "kept"}, job_exists=_no)
        assert await job_secrets.fetch(await launcher.kv(Bucket.SECRETS), private, "alice.twice") == {"token": "kept"}
        assert rest.nc.is_connected  # rest never touched what it may not read
    finally:
        await rest.close()
        await launcher.close()


async def test_missing_or_foreign_secrets_do_not_open(nats_server, keys, tmp_path):
    public, _ = keys
    other = tmp_path / "other"
    other.mkdir()
    sealing.write_key_pair(other / "secrets.key", other / "secrets.pub")
    rest, launcher = await connect(nats_server, "rest"), await connect(nats_server, "launcher")
    try:
        kv, readable = await rest.kv(Bucket.SECRETS), await launcher.kv(Bucket.SECRETS)
        with pytest.raises(job_secrets.SecretsUnavailable):
            await job_secrets.fetch(readable, str(other / "secrets.key"), "alice.nothing-stored")
        await job_secrets.store(kv, public, "alice.foreign", SECRETS, job_exists=_no)
        with pytest.raises(job_secrets.SecretsUnavailable):
            await job_secrets.fetch(readable, str(other / "secrets.key"), "alice.foreign")
        with pytest.raises(job_secrets.SecretsUnavailable):
            await job_secrets.store(kv, "", "alice.no-key", SECRETS, job_exists=_no)
    finally:
        await rest.close()
        await launcher.close()


def test_scrubbing_masks_every_secret_value_longest_first():
    values = job_secrets.values_of({"a": "abc", "b": "abcdef", "n": 4242, "flag": True, "empty": ""})
    assert values[0] == "abcdef" and set(values) == {"abcdef", "abc", "4242"}
    text = "x abcdef y abc z 4242 true"
    assert scrub_text(text, values) == f"x {MASK} y {MASK} z {MASK} true"
    assert scrub_bytes(text.encode(), values) == f"x {MASK} y {MASK} z {MASK} true".encode()
    assert scrub_text(text, []) == text


async def _no() -> None:
    return None


async def _yes() -> bool:
    return True
