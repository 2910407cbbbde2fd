"""`pai up` creates the store with the configuration's settings: a
`nats_bucket_max_bytes` set for the platform is what each bucket gets, on a new
store and on one made before with other sizes (the remedy for a full bucket)."""

from __future__ import annotations

import asyncio

from cli.up import Platform
from libs.common.bus import Bus
from libs.common.busauth import PLATFORM, load_or_create_credentials
from libs.common.config import Config
from libs.common.natsserver import free_port
from libs.common.subjects import STREAM, Bucket


async def _sizes(platform: Platform) -> tuple[int, int, int]:
    bus = await Bus.connect(platform.nats.url, name="test-sizes", **platform.nats.login(PLATFORM))
    try:
        jobs = (await bus.js.stream_info(f"KV_{Bucket.JOBS.value}")).config.max_bytes
        users = (await bus.js.stream_info(f"KV_{Bucket.USERS.value}")).config.max_bytes
        events = (await bus.js.stream_info(STREAM)).config.max_bytes
        return jobs, users, events
    finally:
        await bus.close()


def _start_store(data, **settings) -> Platform:
    platform = Platform(Config(data_dir=str(data), **settings), print_fn=lambda *_: None)
    platform.logs.mkdir(parents=True, exist_ok=True)
    platform.nats_credentials = load_or_create_credentials(platform.data / "nats-credentials.json")
    platform.start_store(free_port())
    return platform


def test_pai_up_applies_the_configured_store_sizes_to_a_new_and_an_existing_store(tmp_path) -> None:
    first = _start_store(tmp_path, nats_bucket_max_bytes=3 * 1024 * 1024, nats_events_max_bytes=5 * 1024 * 1024)
    try:
        assert asyncio.run(_sizes(first)) == (3 * 1024 * 1024, 3 * 1024 * 1024, 5 * 1024 * 1024)
    finally:
        first.nats.stop()
    # The same data dir started again with a bigger bucket size: the existing store grows.
    again = _start_store(tmp_path, nats_bucket_max_bytes=7 * 1024 * 1024)
    try:
        jobs, users, _ = asyncio.run(_sizes(again))
        assert (jobs, users) == (7 * 1024 * 1024, 7 * 1024 * 1024)
    finally:
        again.nats.stop()
