"""The bus is authenticated and least-privilege (libs/common/busauth.py), against the
session's real nats-server, which runs with the users and permissions `pai up` gives it.

A denied publish does not fail the publisher's call: nats-server drops it and tells the
client with a `-ERR 'Permissions Violation ...'`. So each check looks at both: the
server's refusal reached the client, and nothing changed in the store (read back as
the platform user).
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js import api

from libs.common import busauth
from libs.common.bus import Bus
from libs.common.natsserver import NatsServer
from libs.common.subjects import STREAM, Bucket, Kind, kind_filter

# Every test on both of the bus's clients (tests/conftest.py: bus_client).
pytestmark = pytest.mark.usefixtures("bus_client")
RUN = uuid.uuid4().hex[:8]
VC = f"authvc{RUN}"  # no other test's consumer looks at this VC


class Client:
    """A bus logged in as one user, remembering what the server refused it."""

    def __init__(self, bus: Bus):
        self.bus = bus
        self.refusals: list[str] = []

    async def _on_error(self, exc: Exception) -> None:
        self.refusals.append(str(exc).lower())

    async def refused(self, verb: str, subject: str) -> bool:
        """Whether the server refused `verb` ("publish" or "subscription") on `subject`."""
        await self.bus.round_trip()
        needle = f'permissions violation for {verb} to "{subject.lower()}"'
        for _ in range(40):
            if any(needle in r for r in self.refusals):
                return True
            await asyncio.sleep(0.05)
        return False

    async def try_publish(self, subject: str, data: bytes = b"{}") -> bool:
        """Publish; True when the server refused it."""
        await self.bus.nc.publish(subject, data)
        return await self.refused("publish", subject)

    async def try_subscribe(self, subject: str) -> bool:
        await self.bus.nc.subscribe(subject)
        return await self.refused("subscription", subject)


@pytest.fixture
async def login(nats_server: NatsServer) -> AsyncIterator:
    opened: list[Bus] = []

    async def connect(user: str) -> Client:
        bus = await Bus.connect(nats_server.url, name=f"auth-test-{user}", **nats_server.login(user))
        client = Client(bus)
        bus.nc._error_cb = client._on_error  # the refusals, instead of only logging them
        opened.append(bus)
        return client

    yield connect
    for bus in opened:
        await bus.close()


@pytest.fixture
async def platform(login) -> Bus:
    return (await login("platform")).bus


async def stored_on(platform: Bus, subject: str) -> bool:
    """Whether the event stream holds a message on `subject`."""
    try:
        await platform.js.get_last_msg(STREAM, subject)
    except nats.js.errors.NotFoundError:
        return False
    return True


async def key_exists(platform: Bus, bucket: Bucket, key: str) -> bool:
    try:
        await (await platform.kv(bucket)).get(key)
    except nats.js.errors.KeyNotFoundError:
        return False
    return True


def event_subject(kind: Kind, by: str = "mallory") -> str:
    """A subject of `kind` that no other check of this run uses."""
    return f"pai.v1.{kind.value}.{VC}.{by}.j{RUN}"


# --- who may connect ---------------------------------------------------------------------


async def test_a_client_without_credentials_is_refused(nats_server):
    with pytest.raises((nats.errors.Error, nats.errors.NoServersError)) as refused:
        await nats.connect(nats_server.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
    assert "authorization violation" in repr(refused.value).lower() or isinstance(refused.value, nats.errors.NoServersError)


async def test_a_password_is_refused(nats_server):
    """Users log in with nkeys only: a password, even for a real user name, is refused."""
    with pytest.raises((nats.errors.Error, nats.errors.NoServersError)):
        await nats.connect(
            nats_server.url, user="platform", password="guessed", allow_reconnect=False, max_reconnect_attempts=0,
            connect_timeout=2,
        )


async def test_an_unknown_key_is_refused(nats_server):
    stranger = busauth.new_user_key().seed
    with pytest.raises(PermissionError, match="refused the credentials of user 'platform'.*Authorization Violation"):
        await Bus.connect(nats_server.url, name="auth-test-stranger", user="platform", nkey_seed=stranger)


async def raw_connect(server, connect: dict) -> str:
    """The server's first answer to CONNECT `connect` (by hand: the nonce it sent is
    signed as the test says, which no client library would do wrongly)."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        info = json.loads((await reader.readline()).decode().removeprefix("INFO "))
        body = {"verbose": False, "pedantic": False, **connect}
        if "sign_with" in body:
            body["sig"] = base64.urlsafe_b64encode(body.pop("sign_with").sign(info["nonce"].encode())).decode().rstrip("=")
        writer.write(b"CONNECT " + json.dumps(body).encode() + b"\r\nPING\r\n")
        await writer.drain()
        return (await asyncio.wait_for(reader.readline(), 5)).decode().strip()
    finally:
        writer.close()


async def test_a_users_public_key_is_refused_without_its_seed(nats_server):
    """Claiming the platform's public key, signing the nonce with another key."""
    import nkeys

    claimed = nats_server.auth.users[busauth.PLATFORM].public
    own = nkeys.from_seed(bytearray(nats_server.auth.seed(busauth.PLATFORM).encode()))
    other = nkeys.from_seed(bytearray(busauth.new_user_key().seed.encode()))
    assert await raw_connect(nats_server, {"nkey": claimed, "sign_with": own}) == "PONG"  # the check itself works
    assert "Authorization Violation" in await raw_connect(nats_server, {"nkey": claimed, "sign_with": other})
    assert "Authorization Violation" in await raw_connect(nats_server, {"nkey": claimed})


async def test_a_service_with_its_key_logs_in_as_itself(nats_server):
    login = nats_server.login("monitor")
    assert set(login) == {"user", "nkey_seed"}
    bus = await Bus.connect(nats_server.url, name="auth-test-monitor-key", **login)
    try:
        await bus.round_trip()
    finally:
        await bus.close()


# --- the findings ---------------------------------------------------------------


async def test_rest_cannot_forge_a_job_placed_event(login, platform):
    rest = await login("rest")
    subject = event_subject(Kind.JOB_PLACED)
    assert await rest.try_publish(subject)
    assert not await stored_on(platform, subject)


async def test_the_launcher_cannot_make_a_token_admin(login, platform):
    launcher = await login("launcher")
    key = f"token.forged{RUN}"
    assert await launcher.try_publish(f"$KV.{Bucket.USERS.value}.{key}", b"admin")
    assert not await key_exists(platform, Bucket.USERS, key)


# --- each service: refused what it does not own, allowed what it needs -----------------


@pytest.mark.parametrize(
    ("user", "not_its_kind"),
    [
        ("rest", Kind.TASK_EXITED),
        ("scheduler", Kind.JOB_SUBMITTED),
        ("launcher", Kind.TASK_VERDICT),
        ("runtime", Kind.JOB_PLACED),
        ("monitor", Kind.JOB_STATE),
    ],
)
async def test_a_service_publishes_its_own_events_and_no_other(login, platform, user, not_its_kind):
    client = await login(user)
    own = {
        "rest": Kind.JOB_SUBMITTED,
        "scheduler": Kind.JOB_PLACED,
        "launcher": Kind.TASK_EXITED,
        "runtime": Kind.TASK_VERDICT,
        "monitor": Kind.ALERT_FIRING,
    }[user]
    ack = await client.bus.js.publish(event_subject(own, user), b"{}", timeout=5)
    assert ack.stream == STREAM
    forged = event_subject(not_its_kind, user)
    assert await client.try_publish(forged)
    assert not await stored_on(platform, forged)


@pytest.mark.parametrize(
    ("user", "own_bucket", "other_bucket"),
    [
        ("rest", Bucket.JOBS, Bucket.JOB_STATUS),
        ("scheduler", Bucket.SCHEDULE, Bucket.JOBS),
        ("launcher", Bucket.JOB_STATUS, Bucket.SCHEDULE),
        ("runtime", Bucket.RULES, Bucket.USERS),
        ("monitor", Bucket.NODES, Bucket.RULES),
    ],
)
async def test_a_service_writes_its_own_buckets_and_no_other(login, platform, user, own_bucket, other_bucket):
    client = await login(user)
    key = f"authtest{RUN}{user}"
    await (await client.bus.kv(own_bucket)).put(key, b"{}")
    assert await key_exists(platform, own_bucket, key)
    assert await client.try_publish(f"$KV.{other_bucket.value}.{key}")
    assert not await key_exists(platform, other_bucket, key)
    # The buckets are shared with the session's other tests, which read them whole.
    await (await platform.kv(own_bucket)).purge(key)


async def test_only_the_launcher_reads_job_secrets(login, platform):
    key = f"job{RUN}"
    await (await platform.kv(Bucket.SECRETS)).put(key, b"sealed")
    launcher = await login("launcher")
    assert (await (await launcher.bus.kv(Bucket.SECRETS)).get(key)).value == b"sealed"
    rest = await login("rest")  # writes them, never reads them back
    await (await rest.bus.kv(Bucket.SECRETS)).put(f"{key}b", b"sealed")
    for reader in ("rest", "scheduler", "runtime", "monitor"):
        client = rest if reader == "rest" else await login(reader)
        subject = f"$JS.API.DIRECT.GET.KV_{Bucket.SECRETS.value}.$KV.{Bucket.SECRETS.value}.{key}"
        assert await client.try_publish(subject), f"{reader} could read a job's secrets"


async def test_a_single_active_service_holds_its_own_lease_only(login, platform):
    scheduler = await login("scheduler")
    leases = await scheduler.bus.kv(Bucket.LEASES)
    await leases.put("scheduler", b"{}")
    assert await scheduler.try_publish(f"$KV.{Bucket.LEASES.value}.launcher")
    await (await platform.kv(Bucket.LEASES)).delete("scheduler")


async def test_a_service_consumes_with_its_own_durable_only(login, platform):
    runtime = await login("runtime")
    config = api.ConsumerConfig(durable_name="runtime", ack_policy=api.AckPolicy.EXPLICIT, filter_subject="pai.v1.task.exited.>")
    await runtime.bus.js.add_consumer(STREAM, config)
    # Another service's durable: neither created, changed nor acked.
    assert await runtime.try_publish(f"$JS.API.CONSUMER.CREATE.{STREAM}.scheduler")
    assert await runtime.try_publish(f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.launcher")
    assert await runtime.try_publish(f"$JS.ACK.{STREAM}.launcher.1.1.1.1.1.0")
    # Nor may it delete the stream or a bucket.
    assert await runtime.try_publish(f"$JS.API.STREAM.DELETE.{STREAM}")
    assert await runtime.try_publish(f"$JS.API.STREAM.DELETE.KV_{Bucket.RULES.value}")
    await platform.js.delete_consumer(STREAM, "runtime")


async def test_rest_follows_job_states_through_a_consumer_of_that_kind_only(login, platform):
    # rest's event streams (services/rest/events.py): a push consumer of its own naming,
    # filtered to job.state and delivering to its inbox; nothing wider.
    rest = await login("rest")
    config = api.ConsumerConfig(name=f"restwatch{RUN}", deliver_subject=rest.bus.nc.new_inbox(),
                                filter_subject=kind_filter(Kind.JOB_STATE), ack_policy=api.AckPolicy.NONE,
                                mem_storage=True, num_replicas=1, inactive_threshold=5.0)
    await rest.bus.js.add_consumer(STREAM, config)
    assert await rest.try_publish(f"$JS.API.CONSUMER.CREATE.{STREAM}.restwatch{RUN}.{kind_filter(Kind.TASK_EXITED)}")
    assert await rest.try_publish(f"$JS.API.CONSUMER.CREATE.{STREAM}")  # unnamed: any filter, any name
    assert await rest.try_subscribe(kind_filter(Kind.JOB_STATE))  # live events come through the consumer only
    await platform.js.delete_consumer(STREAM, f"restwatch{RUN}")


async def test_a_service_reads_no_one_elses_replies(login):
    rest = await login("rest")
    assert await rest.try_subscribe("_INBOX.launcher.>")
    assert await rest.try_subscribe(">")


async def test_rpc_subjects_are_served_and_asked_by_their_owners_only(login):
    launcher, rest, monitor = await login("launcher"), await login("rest"), await login("monitor")

    async def answer(msg):
        await msg.respond(b"log")

    await launcher.bus.nc.subscribe("pai.rpc.v1.logs", queue="launcher", cb=answer)
    await launcher.bus.round_trip()  # the server has the subscription before rest asks
    reply = await rest.bus.nc.request("pai.rpc.v1.logs", b"{}", timeout=5)
    assert reply.data == b"log"
    assert await monitor.try_publish("pai.rpc.v1.logs")  # only rest asks for logs
    assert await monitor.try_subscribe("pai.rpc.v1.rules")  # only the runtime serves rules


async def test_only_the_monitor_may_ask_rest_to_tag_a_job(login):
    """The tag-job alert action goes over the bus instead of HTTP with an admin token,
    so the bus's permissions are what keeps others from tagging any job this way."""
    monitor, rest = await login("monitor"), await login("rest")
    assert not await rest.try_subscribe("pai.rpc.v1.job_tag")  # rest answers
    assert not await monitor.try_publish("pai.rpc.v1.job_tag")  # the monitor asks
    for other in ("launcher", "runtime", "scheduler", "integrator"):
        assert await (await login(other)).try_publish("pai.rpc.v1.job_tag"), f"{other} may ask to tag a job"
    assert await monitor.try_subscribe("pai.rpc.v1.job_tag")  # nobody but rest answers


# --- integrators ------------------------------------------------------------------------


async def test_an_integrator_reads_events_and_cannot_publish_or_touch_kv(login, platform):
    integrator = await login("integrator")
    live = await integrator.bus.nc.subscribe(f"pai.v1.*.*.{VC}.>")
    await integrator.bus.round_trip()
    subject = event_subject(Kind.JOB_STATE)
    ack = await platform.js.publish(subject, b'{"live": true}')
    assert (await live.next_msg(timeout=5)).data == b'{"live": true}'
    # History by sequence, read-only.
    stored = await integrator.bus.js.get_msg(STREAM, seq=ack.seq)
    assert stored.subject == subject

    forged = event_subject(Kind.JOB_PLACED)
    assert await integrator.try_publish(forged)
    assert not await stored_on(platform, forged)
    key = f"token.integrator{RUN}"
    assert await integrator.try_publish(f"$KV.{Bucket.USERS.value}.{key}", b"admin")
    assert not await key_exists(platform, Bucket.USERS, key)
    assert await integrator.try_publish(f"$JS.API.DIRECT.GET.KV_{Bucket.USERS.value}")
    # No consumer of its own: nats-server would let one replace a service's durable.
    assert await integrator.try_publish(f"$JS.API.CONSUMER.CREATE.{STREAM}")
