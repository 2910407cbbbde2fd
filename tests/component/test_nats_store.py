"""The JetStream store as the platform's bootstrap makes it, on a real nats-server:
explicit limits from libs/common/jetstream_limits.py on the event stream and every
bucket, changed settings applied to an existing store, full stores refusing new
writes rather than dropping old ones; and clients given several servers."""

from __future__ import annotations

import nats.js.errors
import pytest

from libs.common import busauth
from libs.common.bus import Bus
from libs.common.config import Config
from libs.common.jetstream_limits import BUCKETS, EVENTS, OTHER_BUCKET, store_settings
from libs.common.natsserver import free_port
from libs.common.subjects import STREAM, Bucket


@pytest.fixture(scope="module")
def nats_server(own_nats_server):
    """Bootstrapped with the shipped table; the tests here change the store's settings."""
    return own_nats_server


async def platform_bus(server) -> Bus:
    return await Bus.connect(server.url, name="store-test", **server.login(busauth.PLATFORM))


async def test_the_event_stream_and_every_bucket_carry_the_tables_limits(nats_server) -> None:
    bus = await platform_bus(nats_server)
    try:
        await bus.bootstrap(store_settings(Config()))
        events = (await bus.js.stream_info(STREAM)).config
        assert (events.max_bytes, events.max_msg_size, events.max_age, events.duplicate_window) == (
            EVENTS.max_bytes, EVENTS.max_message_bytes, EVENTS.max_age_seconds, EVENTS.duplicate_window_seconds)
        assert events.discard == nats.js.api.DiscardPolicy.NEW
        for bucket in Bucket:
            limits = BUCKETS.get(bucket, OTHER_BUCKET)
            config = (await bus.js.stream_info(f"KV_{bucket.value}")).config
            assert (config.max_bytes, config.max_msg_size, config.max_msgs_per_subject) == (
                limits.max_bytes, limits.max_message_bytes, 1), bucket
            assert config.discard == nats.js.api.DiscardPolicy.NEW, bucket
            if bucket is Bucket.JOB_METRICS:  # a task's samples go with the job's logs
                assert config.max_age == Config().retention_finished_seconds
            else:
                assert not config.max_age, f"{bucket} entries must not expire"
    finally:
        await bus.close()


async def test_changed_settings_reach_an_existing_store_and_a_full_bucket_refuses_new_writes(nats_server) -> None:
    bus = await platform_bus(nats_server)
    try:
        small = Config(nats_bucket_max_bytes=16 * 1024, nats_events_max_bytes=1024 * 1024, nats_max_message_bytes=2048)
        await bus.bootstrap(store_settings(small))
        assert (await bus.js.stream_info(STREAM)).config.max_bytes == 1024 * 1024
        rules = await bus.kv(Bucket.RULES)
        with pytest.raises(nats.js.errors.APIError, match="maximum"):  # over the message size
            await rules.put("too-big", b"x" * 4096)
        written = 0
        with pytest.raises(nats.js.errors.APIError):  # full: refused, not making room
            for n in range(100):
                await rules.put(f"key-{n}", b"x" * 1024)
                written += 1
        assert 0 < written < 100
        assert (await rules.get("key-0")).value == b"x" * 1024, "the oldest entry must be kept"
    finally:
        # Back to the table, for what else runs on this server.
        for n in range(100):
            try:
                await (await bus.kv(Bucket.RULES)).purge(f"key-{n}")
            except Exception:  # noqa: BLE001 - keys never written
                pass
        await bus.bootstrap(store_settings(Config()))
        await bus.close()


def test_config_overrides_keep_the_lease_small_and_count_the_whole_store() -> None:
    settings = store_settings(Config(nats_replicas=3, nats_max_message_bytes=4 * 1024 * 1024))
    assert settings.replicas == 3
    assert settings.events.max_message_bytes == 4 * 1024 * 1024
    assert settings.bucket(Bucket.JOBS).max_message_bytes == 4 * 1024 * 1024
    assert settings.bucket(Bucket.LEASES).max_message_bytes == BUCKETS[Bucket.LEASES].max_message_bytes
    assert settings.total_bytes() == EVENTS.max_bytes + sum(settings.bucket(b).max_bytes for b in Bucket)


async def test_a_client_given_several_servers_uses_one_that_answers(nats_server) -> None:
    dead = f"nats://127.0.0.1:{free_port()}"
    bus = await Bus.connect(f"{dead}, {nats_server.url}", name="store-test", connect_timeout=20,
                            **nats_server.login(busauth.PLATFORM))  # fmt: skip
    try:
        assert (await bus.js.stream_info(STREAM)).config.name == STREAM
    finally:
        await bus.close()


async def test_a_retention_shorter_than_the_duplicate_window_still_makes_the_store(nats_server) -> None:
    # Job metrics are kept as long as logs (retention_finished_seconds); nats-server refuses
    # a stream whose duplicate window is longer than its max age.
    bus = await platform_bus(nats_server)
    try:
        await bus.bootstrap(store_settings(Config(retention_finished_seconds=10.0, nats_events_max_age_seconds=30.0)))
        metrics = (await bus.js.stream_info(f"KV_{Bucket.JOB_METRICS.value}")).config
        assert (metrics.max_age, metrics.duplicate_window) == (10.0, 10.0)
        events = (await bus.js.stream_info(STREAM)).config
        assert (events.max_age, events.duplicate_window) == (30.0, 30.0)
    finally:
        await bus.bootstrap(store_settings(Config()))
        await bus.close()
