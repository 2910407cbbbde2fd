"""The bus's connection: connecting (with jittered retries, to a cluster's
servers), the link it runs on (`bus_client`), the idempotent bootstrap of the
event stream and every KV bucket, opening buckets, and closing.

The layers above build on `Connection`: `publish.Publisher` (deduplicated
publishes and KV writes, their acks awaited together), `consume.Consumer`
(durable pull consumers under PAI's ack rules), and `Bus` is the last of them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from typing import Any, Self

import nats
import nats.errors
import nats.js
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js import api
from nats.js.kv import KeyValue

from libs.common import busauth, reconnect
from libs.common.bus import wire
from libs.common.bus.answers import StoreAcks
from libs.common.bus.link import BUS_CLIENTS, BusClient, Link, register
from libs.common.errors import Transient
from libs.common.jetstream_limits import StoreSettings
from libs.common.subjects import STREAM, STREAM_SUBJECTS, Bucket

log = logging.getLogger("pai.bus")

# Dead-server detection: a connection whose pings go unanswered this many times
# in a row is given up and the client reconnects to another server (4-6 s), well
# within the single-active services' 10 s lease.
PING_INTERVAL_SECONDS = 2.0
MAX_OUTSTANDING_PINGS = 2
# How long the platform's bootstrap waits for JetStream (a cluster electing its
# leader) before it gives up; JetStream's "temporarily unavailable" error code.
STORE_READY_SECONDS = 60.0
JS_TEMPORARILY_UNAVAILABLE = 10008
DRAIN_SECONDS = 2.0
# The client a connection runs when `Bus.connect` is not told: the config field
# `bus_client` (libs/common/config.py) by its environment variable, so a process
# started with the platform's environment runs the one its config names.
BUS_CLIENT_ENV = "PAI_BUS_CLIENT"


def default_client() -> BusClient:
    value = os.environ.get(BUS_CLIENT_ENV, "fast")
    for client in BUS_CLIENTS:
        if value == client:
            return client
    raise ValueError(f"{BUS_CLIENT_ENV}={value!r}: bus_client must be one of {', '.join(BUS_CLIENTS)}")



class Connection:
    """One NATS connection, its link (`bus_client`), its JetStream context and opened KV buckets."""

    def __init__(self, nc: NatsClient, name: str, *, user: str = "", client: BusClient | None = None):
        self.nc = nc
        self.name = name
        self.user = user  # the NATS user (busauth.ACCESS); "" on a server without auth
        self._kv: dict[Bucket, KeyValue] = {}
        client = client or default_client()
        # The fast link checks nats-py's internals here, at connect: a nats-py it
        # does not know fails now, naming its version, never mid-flight.
        self.link: Link = register(wire.FastLink(nc) if client == "fast" else Link(nc))
        if self.link.fast:
            wire.install(nc)
        self._store_acks = StoreAcks(self.link)
        self.js = self.link.jetstream(self._store_acks)

    @classmethod
    async def connect(
        cls, url: str, *, name: str, user: str = "", nkey_seed: str = "", password: str = "",
        connect_timeout: float = 30.0, client: BusClient | None = None, tls_ca_file: str = "",
    ) -> Self:
        """Connect as NATS user `user`, retrying until NATS answers or `connect_timeout` passes.

        The user proves who it is with its nkey (`nkey_seed`: it signs the server's
        nonce; busauth), or with `password` on a NATS of your own that uses them.
        A wrong or unknown key raises PermissionError at once, without retrying.

        `url` may list the servers of a NATS cluster, comma-separated; the client
        picks one and, when it goes, moves to another (and to those the cluster
        announces). NATS may be restarting (chaos, `pai up` resuming); once
        connected the client reconnects by itself forever. Every try, first connect
        and reconnect, waits a jittered, growing delay (libs/common/reconnect.py), so
        a thousand clients cut off together do not come back in lockstep. Replies
        come under the user's own inbox prefix, the only one its permissions let it
        subscribe to. `client`: the link it runs (`bus_client`, module doc of
        bus/link.py); by default what `PAI_BUS_CLIENT` says, else `fast`.
        `tls_ca_file`: servers given as tls:// are checked against this CA (else
        the system's); their name must match the URL's host.
        """
        deadline = time.monotonic() + connect_timeout
        servers = server_urls(url)
        login: dict[str, Any] = {}
        if user:
            login["inbox_prefix"] = busauth.inbox_prefix(user)
            if nkey_seed:
                login["nkeys_seed_str"] = busauth.user_seed(nkey_seed)
            else:
                login.update(user=user, password=password)
        if tls_ca_file or any(server.startswith("tls://") for server in servers):
            import ssl

            login["tls"] = ssl.create_default_context(cafile=tls_ca_file or None)
        rng = random.Random()
        attempt = 0
        last_error: list[Exception | None] = [None]  # what the server last answered a try

        async def on_error(exc: Exception) -> None:
            last_error[0] = exc
            await _log_nats_error(exc)

        while True:
            try:
                nc = await nats.connect(
                    servers=servers,
                    name=name,
                    **login,
                    # The first connect tries each server twice, then gives up to the
                    # jittered wait below; once connected, never give up (set after).
                    max_reconnect_attempts=1,
                    reconnect_time_wait=0.1,
                    reconnect_to_server_handler=reconnect.server_chooser(rng),
                    connect_timeout=2,
                    # A server cut off by the network sends no reset: only
                    # unanswered pings tell. nats-py's default (2 min x 2) would
                    # leave a service talking into the void for four minutes.
                    ping_interval=PING_INTERVAL_SECONDS,
                    max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                    error_cb=on_error,
                    disconnected_cb=_log_disconnected,
                )
                nc.options["max_reconnect_attempts"] = -1  # read by each reconnect
                bus = cls(nc, name, user=user, client=client)
                await bus.link.start()
                return bus
            except (TimeoutError, OSError, nats.errors.Error) as exc:
                refused = next((e for e in (last_error[0], exc) if reconnect.is_auth_refusal(e)), None)
                if refused is not None:
                    # A wrong or unknown key stays wrong: say so now, not after the timeout.
                    raise PermissionError(f"NATS at {url} refused the credentials of user {user or '(none)'!r}: "
                                          f"{refused}") from exc
                if time.monotonic() > deadline:
                    raise
                delay = reconnect.jittered_delay(attempt, rng)
                attempt += 1
                log.warning("NATS at %s not reachable yet (%s); retrying in %.2fs", url, last_error[0] or exc, delay)
                await asyncio.sleep(delay)

    async def bootstrap(self, settings: StoreSettings | None = None) -> None:
        """Create or update the event stream and every KV bucket with `settings`
        (replicas and limits, jetstream_limits), idempotently; or, as a service
        user, which may not create them (busauth), wait until they exist.

        On a NATS cluster just formed, JetStream answers "unavailable" until its
        nodes have elected a leader: the platform retries until `STORE_READY_SECONDS`.
        """
        if not busauth.may_create_store(self.user):
            await self._wait_for_store()
            return
        settings = settings or StoreSettings()
        deadline = time.monotonic() + STORE_READY_SECONDS
        retry: Exception
        while True:
            try:
                await _add_or_update(self.js, _event_stream_config(settings))
                for bucket in Bucket:
                    await _add_or_update(self.js, _bucket_stream_config(bucket, settings))
                return
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError) as exc:
                retry = exc
            except nats.js.errors.APIError as exc:
                if exc.err_code != JS_TEMPORARILY_UNAVAILABLE:
                    raise
                retry = exc
            if time.monotonic() > deadline:
                raise Transient(f"JetStream not ready after {STORE_READY_SECONDS:.0f}s: {retry!r}") from retry
            log.warning("JetStream not ready to create the store yet (%r); retrying", retry)
            await asyncio.sleep(0.5)

    async def _wait_for_store(self) -> None:
        """Until the platform's bootstrap (`pai up`, the chart's Job) made the stream
        and this user's buckets: a store still being created is not an empty one."""
        waited = 0.0
        while True:
            try:
                await self.js.stream_info(STREAM)
                for bucket in busauth.buckets_of(self.user):
                    await self.kv(bucket)
                return
            except (nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError) as exc:
                if waited % 10 < 0.5:
                    log.warning("waiting for the platform to create the event stream and buckets (%r)", exc)
                await asyncio.sleep(0.5)
                waited += 0.5

    async def kv(self, bucket: Bucket) -> KeyValue:
        if bucket not in self._kv:
            try:
                self._kv[bucket] = await self.js.key_value(bucket.value)
            except nats.js.errors.BucketNotFoundError:
                if not busauth.may_create_store(self.user):
                    raise
                try:
                    self._kv[bucket] = await self.js.create_key_value(
                        bucket=bucket.value, history=1, storage=api.StorageType.FILE
                    )
                except nats.js.errors.BadRequestError:  # another service created it first
                    self._kv[bucket] = await self.js.key_value(bucket.value)
        return self._kv[bucket]

    async def round_trip(self) -> None:
        """Return once the server has read everything sent before the call: a
        subscription just made is then served (`Link.round_trip`; nats-py's
        own `flush()` does not promise it)."""
        await self.link.round_trip()

    async def close(self) -> None:
        """Flush what is pending and disconnect, without waiting long.

        A subscription holding messages no one took makes nats-py's drain
        wait its full timeout.
        """
        try:
            await asyncio.wait_for(self.nc.drain(), DRAIN_SECONDS)
        except Exception:  # drain timed out, or NATS is gone: nothing left to flush
            await self.nc.close()



def server_urls(url: str) -> list[str]:
    """The servers of a comma-separated `nats_url` ("nats://a:4222, nats://b:4222")."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ValueError(f"no NATS server in {url!r}")
    return servers


def _event_stream_config(settings: StoreSettings) -> api.StreamConfig:
    limits = settings.events
    return api.StreamConfig(
        name=STREAM,
        subjects=STREAM_SUBJECTS,
        storage=api.StorageType.FILE,
        retention=api.RetentionPolicy.LIMITS,
        num_replicas=settings.replicas,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=limits.duplicate_window_seconds,
        max_age=limits.max_age_seconds or None,
        max_bytes=limits.max_bytes,
        max_msg_size=limits.max_message_bytes,
    )


def _bucket_stream_config(bucket: Bucket, settings: StoreSettings) -> api.StreamConfig:
    """The stream behind a KV bucket, as nats-py's `create_key_value` makes it (so
    `js.key_value` opens it), with PAI's limits; built here so an existing bucket
    is updated in place rather than refused as "already in use"."""
    limits = settings.bucket(bucket)
    return api.StreamConfig(
        name=f"KV_{bucket.value}",
        subjects=[f"$KV.{bucket.value}.>"],
        storage=api.StorageType.FILE,
        num_replicas=settings.replicas,
        allow_rollup_hdrs=True,
        allow_msg_ttl=True,
        deny_delete=True,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=limits.duplicate_window_seconds,
        max_age=limits.max_age_seconds or None,
        max_bytes=limits.max_bytes,
        max_consumers=-1,
        max_msg_size=limits.max_message_bytes,
        max_msgs=-1,
        max_msgs_per_subject=1,  # history 1: a bucket holds current state
    )


async def _add_or_update(js: Any, config: api.StreamConfig) -> None:
    try:
        await js.add_stream(config)
    except nats.js.errors.BadRequestError:  # exists with other settings: apply ours
        await js.update_stream(config)



async def _log_nats_error(exc: Exception) -> None:
    log.warning("NATS error: %r", exc)


async def _log_disconnected() -> None:
    log.warning("disconnected from NATS; reconnecting")
