"""How full JetStream is, read by the cluster monitor from JetStream's API.

Every stream and bucket has limits with discard-new (libs/common/jetstream_limits.py):
a full one refuses writes, loudly. These series show it coming:
`pai_jetstream_stream_bytes / pai_jetstream_stream_max_bytes` per stream and bucket
(and the same for messages), and the account's whole store
(`pai_jetstream_store_bytes / pai_jetstream_store_max_bytes`, the latter only when the
account has a limit). Read every STORE_FILL_SECONDS: `$JS.API.INFO` and
`$JS.API.STREAM.INFO.<stream>` of PAI's stream and buckets, which the monitor's NATS
user may ask (libs/common/busauth.py) and nothing more.
"""

from __future__ import annotations

import asyncio
import logging

import nats.errors
import nats.js.errors

from libs.common.errors import Transient
from libs.common.service import ServiceContext
from libs.common.subjects import STREAM, Bucket
from services.monitor import metrics

log = logging.getLogger("pai.monitor.store")

STORE_FILL_SECONDS = 30.0
_TROUBLE = (nats.errors.Error, asyncio.TimeoutError, OSError, Transient)


def streams() -> list[tuple[str, str]]:
    """(JetStream stream, KV bucket or "") of everything PAI stores."""
    return [(STREAM, ""), *((f"KV_{bucket.value}", bucket.value) for bucket in Bucket)]


async def read_once(ctx: ServiceContext) -> None:
    js = ctx.bus.js
    account = await js.account_info()
    limit = account.limits.max_storage if account.limits is not None else None
    metrics.record_store(used=account.storage, limit=limit if limit and limit > 0 else None)
    for stream, bucket in streams():
        try:
            info = await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            continue  # a bucket of a newer PAI than this store was made by
        config, state = info.config, info.state
        metrics.record_stream(stream, bucket, used_bytes=state.bytes, messages=state.messages,
                              max_bytes=config.max_bytes, max_messages=config.max_msgs)


async def follow(ctx: ServiceContext) -> None:
    while True:
        try:
            await read_once(ctx)
        except _TROUBLE as error:
            log.warning("reading JetStream's fill: %r; trying again in %.0f s", error, STORE_FILL_SECONDS)
        await asyncio.sleep(STORE_FILL_SECONDS)
