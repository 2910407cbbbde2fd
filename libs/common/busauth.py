"""Who may do what on the NATS bus: PAI's one permission table, and the credentials
and nats-server configuration made from it.

Every process on the bus logs in as a NATS user (DESIGN.md, Security):

- each service as itself, allowed exactly what the ownership table of DESIGN.md gives
  it: publish the event kinds it owns, consume with its own durable, write its own
  KV buckets, read the buckets it reads, serve or ask its RPC subjects;
- `integrator`: the event stream, read-only (live subscriptions and reads by
  sequence); no publish, no consumers, no KV;
- `platform`: everything. Only the bootstrap uses it (`pai up`, the chart's
  bootstrap Job): it creates the event stream and every bucket, which no service
  may do, so no service can change the store's configuration or delete it.
- no one else: the server has no anonymous user, and tasks get no credentials.

A service therefore never creates the stream or a bucket; it waits until the
bootstrap made them (`Bus.bootstrap`). A new bucket, event kind or RPC subject needs
a line in `ACCESS` below, and nowhere else: the server configuration of `pai up`,
the chart's `files/nats-permissions.json` (`python -m libs.common.busauth
permissions`) and the tests all come from it.

Reply subjects: each user receives replies (JetStream API answers, publish acks,
RPC answers, push-consumer deliveries) only under its own inbox prefix
`_INBOX.<user>`, so no user can read another's replies (which carry KV values).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path

import msgspec

from libs.common.alerts_messages import ALERTS_SUBJECT
from libs.common.logs import LOG_SUBJECT
from libs.common.rules_rpc import RULES_SUBJECT
from libs.common.subjects import PREFIX, STREAM, Bucket, Durable, Kind, dead_letter_subject, kind_filter

PLATFORM = "platform"
INTEGRATOR = "integrator"
# bcrypt cost of the hashes in the server configuration: nats-server checks the
# password at every (re)connect, so this is paid by each service reconnecting.
BCRYPT_ROUNDS = 11


class Access(msgspec.Struct, frozen=True, kw_only=True):
    """What one NATS user may do, in PAI's terms."""

    publishes: tuple[Kind, ...] = ()  # event kinds it owns
    durable: Durable | None = None  # its durable consumer on the event stream
    more_durables: tuple[Durable, ...] = ()  # further durables of its own (rest: history)
    writes: tuple[Bucket, ...] = ()  # KV buckets it owns
    reads: tuple[Bucket, ...] = ()  # KV buckets it reads (get, keys, watch)
    lease: bool = False  # single-active: writes its own key of the lease bucket
    serves: tuple[str, ...] = ()  # request/reply subjects it answers
    asks: tuple[str, ...] = ()  # request/reply subjects it sends requests on
    reads_events: bool = False  # integrators: the event stream, read-only
    # Event kinds it reads live and by sequence, without a consumer (rest's
    # GET /api/v2/events): a subscription per kind and STREAM.MSG.GET.
    watches: tuple[Kind, ...] = ()
    admin: bool = False  # the platform's bootstrap: everything


ACCESS: dict[str, Access] = {
    "rest": Access(
        publishes=(Kind.JOB_SUBMITTED, Kind.JOB_STOP_REQUESTED, Kind.NODE_CORDON, Kind.JOB_DELETED),
        durable=Durable.REST,  # job.deleted: its own records of a deleted job (services/rest/deletion.py)
        more_durables=(Durable.HISTORY,),  # the job history database (services/rest/history)
        writes=(Bucket.JOBS, Bucket.USERS, Bucket.SECRETS),
        # Not SECRETS: sealed for the launcher, rest only stores them.
        # NODES, NODE_HEALTH: the node list of `GET /api/v2/cluster/nodes`.
        reads=(Bucket.JOBS, Bucket.USERS, Bucket.JOB_STATUS, Bucket.SCHEDULE, Bucket.CLUSTER, Bucket.NODES, Bucket.NODE_HEALTH,
               Bucket.ALERTS),
        asks=(LOG_SUBJECT, RULES_SUBJECT, ALERTS_SUBJECT),
        watches=(Kind.JOB_STATE,),  # job state changes streamed to their owners (services/rest/events.py)
    ),
    "scheduler": Access(
        publishes=(Kind.JOB_PLACED, Kind.JOB_PREEMPT, Kind.JOB_WAITING),
        durable=Durable.SCHEDULER,
        writes=(Bucket.SCHEDULE, Bucket.CLUSTER),
        # JOB_STATUS: its restore is checked against the launcher's truth (core/truth.py).
        reads=(Bucket.SCHEDULE, Bucket.CLUSTER, Bucket.JOB_STATUS),
        lease=True,
    ),
    "launcher": Access(
        publishes=(Kind.TASK_STARTED, Kind.TASK_EXITED, Kind.JOB_STATE, Kind.JOB_RELEASED),
        durable=Durable.LAUNCHER,
        writes=(Bucket.JOB_STATUS,),
        # NODE_HEALTH: at restore, tasks still live on a node the monitor holds
        # lost are ended (the NodeStatus that said so may have been acked just
        # before a crash).
        reads=(Bucket.JOB_STATUS, Bucket.SECRETS, Bucket.NODE_HEALTH),
        lease=True,
        serves=(LOG_SUBJECT,),
    ),
    "runtime": Access(
        publishes=(Kind.TASK_VERDICT,),
        durable=Durable.RUNTIME,
        writes=(Bucket.RULES,),
        reads=(Bucket.RULES,),
        serves=(RULES_SUBJECT,),
    ),
    "monitor": Access(
        # JOB_STOP_REQUESTED, NODE_CORDON: the stop-job and cordon-node alert actions,
        # the same requests the API publishes.
        publishes=(Kind.NODE_STATUS, Kind.ALERT_FIRING, Kind.ALERT_RESOLVED, Kind.JOB_STOP_REQUESTED, Kind.NODE_CORDON),
        durable=Durable.MONITOR,
        writes=(Bucket.NODES, Bucket.NODE_HEALTH, Bucket.ALERTS, Bucket.ALERT_RULES),
        # USERS: the mail address of a job's owner (alert and job-state mail);
        # SCHEDULE: why a waiting job waits, for a restarted monitor's PaiJobPending.
        reads=(Bucket.NODES, Bucket.NODE_HEALTH, Bucket.JOB_STATUS, Bucket.ALERTS, Bucket.ALERT_RULES, Bucket.USERS,
               Bucket.SCHEDULE),
        serves=(ALERTS_SUBJECT,),
    ),
    INTEGRATOR: Access(reads_events=True),
    PLATFORM: Access(admin=True),
}

SERVICES = ("rest", "scheduler", "launcher", "runtime", "monitor")


# --- the NATS subjects each user may use ------------------------------------------------


class Permissions(msgspec.Struct, frozen=True, kw_only=True):
    """One user's `permissions` block of the nats-server configuration."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False


def inbox_prefix(user: str) -> str:
    """Where `user` receives replies; `Bus.connect` makes nats-py use it."""
    return f"_INBOX.{user}"


def _api(*tokens: str) -> str:
    return ".".join(("$JS.API", *tokens))


def _kv_stream(bucket: Bucket) -> str:
    return f"KV_{bucket.value}"


def _reading_bucket(bucket: Bucket) -> list[str]:
    """Open, get (direct or not), list keys and watch one bucket.

    Keys and watch run an ordered push consumer (nats-py creates it unnamed and
    answers its flow-control requests on `$JS.FC.<stream>...`).
    """
    stream = _kv_stream(bucket)
    return [
        _api("STREAM.INFO", stream),
        _api("DIRECT.GET", stream),
        _api("DIRECT.GET", stream, ">"),
        _api("STREAM.MSG.GET", stream),
        _api("CONSUMER.CREATE", stream),
        _api("CONSUMER.CREATE", stream, ">"),
        _api("CONSUMER.INFO", stream, "*"),
        _api("CONSUMER.DELETE", stream, "*"),
        f"$JS.FC.{stream}.>",
    ]


def _writing_bucket(bucket: Bucket, key: str = ">") -> list[str]:
    # A put, create, update, delete or purge of a key is a publish on its subject.
    return [_api("STREAM.INFO", _kv_stream(bucket)), f"$KV.{bucket.value}.{key}"]


def _consuming(durable: Durable) -> list[str]:
    """Create (or update), bind to, pull from and ack its own durable, no other."""
    return [
        _api("STREAM.INFO", STREAM),
        _api("CONSUMER.CREATE", STREAM, durable.value),
        _api("CONSUMER.CREATE", STREAM, durable.value, ">"),
        _api("CONSUMER.DURABLE.CREATE", STREAM, durable.value),
        _api("CONSUMER.INFO", STREAM, durable.value),
        _api("CONSUMER.MSG.NEXT", STREAM, durable.value),
        f"$JS.ACK.{STREAM}.{durable.value}.>",
        # A poison message is announced under the consumer's own name.
        dead_letter_subject(Kind.EVENT_DEAD_LETTERED, durable.value),
    ]


def _reading_events() -> tuple[list[str], list[str]]:
    """Integrators: publish (API requests) and subscribe subjects to read events.

    Live: a plain subscription on `pai.v1.>`. History: `STREAM.MSG.GET` by sequence
    or by next sequence on a subject filter. No consumer of their own: nats-server
    lets an unnamed consumer create carry any name (replacing a service's durable
    of that name) and sends a push consumer's messages to any deliver subject,
    whatever its creator may publish to, so creating consumers is not read-only.
    """
    publish = [_api("STREAM.INFO", STREAM), _api("STREAM.MSG.GET", STREAM)]
    return publish, [f"{PREFIX}.>"]


def permissions(user: str) -> Permissions:
    """The NATS permissions of `user`, made from its line of `ACCESS`."""
    access = ACCESS[user]
    if access.admin:
        return Permissions(publish=(">",), subscribe=(">",))
    publish: list[str] = [kind_filter(kind) for kind in access.publishes]
    if access.publishes:
        publish.append(_api("STREAM.INFO", STREAM))  # waits for the stream at start
    subscribe: list[str] = [f"{inbox_prefix(user)}.>"]
    if access.durable is not None:
        publish += _consuming(access.durable)
    for durable in access.more_durables:
        publish += _consuming(durable)
    for bucket in access.writes:
        publish += _writing_bucket(bucket)
    for bucket in access.reads:
        publish += _reading_bucket(bucket)
    if access.lease:
        publish += _writing_bucket(Bucket.LEASES, key=user) + _reading_bucket(Bucket.LEASES)
    publish += access.asks
    subscribe += access.serves
    if access.watches:
        publish += [_api("STREAM.INFO", STREAM), _api("STREAM.MSG.GET", STREAM)]
        subscribe += [kind_filter(kind) for kind in access.watches]
    if access.reads_events:
        events_publish, events_subscribe = _reading_events()
        publish += events_publish
        subscribe += events_subscribe
    return Permissions(
        publish=tuple(dict.fromkeys(publish)),  # in order, once each
        subscribe=tuple(dict.fromkeys(subscribe)),
        allow_responses=bool(access.serves),
    )


def buckets_of(user: str) -> tuple[Bucket, ...]:
    """The buckets `user` opens (a service waits for these at start)."""
    access = ACCESS[user]
    if access.admin:
        return tuple(Bucket)
    found = [*access.writes, *access.reads] + ([Bucket.LEASES] if access.lease else [])
    return tuple(dict.fromkeys(found))


def may_create_store(user: str) -> bool:
    """Whether a connection as `user` creates the stream and buckets (no user: a
    development server without authentication)."""
    return not user or ACCESS[user].admin


# --- credentials and the server configuration ----------------------------------------


class UserSecret(msgspec.Struct, frozen=True):
    password: str
    bcrypt: str  # the hash the server configuration holds


class BusCredentials(msgspec.Struct, frozen=True):
    """Every NATS user's password; in `<data dir>/nats-credentials.json`, 0600."""

    users: dict[str, UserSecret]

    def password(self, user: str) -> str:
        return self.users[user].password

    def env_for(self, user: str) -> dict[str, str]:
        """The environment that makes a PAI process log in as `user`, and only it."""
        return {"PAI_NATS_USER": user, "PAI_NATS_PASSWORD": self.password(user)}


def _hash(password: str) -> str:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(BCRYPT_ROUNDS)).decode()


def _new_secret() -> UserSecret:
    password = secrets.token_urlsafe(32)
    return UserSecret(password=password, bcrypt=_hash(password))


def load_or_create_credentials(path: Path) -> BusCredentials:
    """The credentials in `path`; created at first start, completed when a user was
    added to `ACCESS` since, otherwise reused as they are (resume keeps them)."""
    found: dict[str, UserSecret] = {}
    if path.exists():
        found = msgspec.json.decode(path.read_bytes(), type=BusCredentials).users
    users = {user: found.get(user) or _new_secret() for user in ACCESS}
    credentials = BusCredentials(users=users)
    if users != found:
        _write_private(path, msgspec.json.format(msgspec.json.encode(credentials)))
    return credentials


class TlsFiles(msgspec.Struct, frozen=True, kw_only=True):
    """Optional TLS of the client port (paths as the server sees them)."""

    cert_file: str
    key_file: str
    ca_file: str = ""


class ClusterRoutes(msgspec.Struct, frozen=True, kw_only=True):
    """One node's place in a NATS cluster (libs/common/natsserver.NatsCluster):
    its name, where it listens for the other nodes, and their route URLs."""

    server_name: str
    name: str = "pai"
    host: str
    port: int
    routes: tuple[str, ...]  # every node's nats-route://host:port, this one's included
    # Nodes log in to each other with this; routes without it are refused.
    user: str = "route"
    password: str


def server_config(credentials: BusCredentials, *, host: str, port: int, store_dir: Path, tls: TlsFiles | None = None,
                  cluster: ClusterRoutes | None = None) -> dict:
    """nats-server's configuration (JSON is valid nats-server syntax): JetStream,
    one user per line of `ACCESS` with its bcrypt hash, no anonymous access;
    with `cluster`, one node of a JetStream cluster (same users on every node)."""
    config: dict = {
        "host": host,
        "port": port,
        "jetstream": {"store_dir": str(store_dir)},
        "authorization": {"users": users_block(credentials)},
    }
    if tls is not None:
        config["tls"] = {k: v for k, v in msgspec.structs.asdict(tls).items() if v}
    if cluster is not None:
        config["server_name"] = cluster.server_name
        config["cluster"] = {
            "name": cluster.name,
            "host": cluster.host,
            "port": cluster.port,
            "authorization": {"user": cluster.user, "password": cluster.password},
            "routes": [route.replace("://", f"://{cluster.user}:{cluster.password}@", 1) for route in cluster.routes],
        }
    return config


def users_block(credentials: BusCredentials) -> list[dict]:
    return [
        {"user": user, "password": credentials.users[user].bcrypt, "permissions": permissions_block(user)}
        for user in ACCESS
    ]


def permissions_block(user: str) -> dict:
    perms = permissions(user)
    block: dict = {"publish": {"allow": list(perms.publish)}, "subscribe": {"allow": list(perms.subscribe)}}
    if perms.allow_responses:
        block["allow_responses"] = True
    return block


def write_server_config(path: Path, config: dict) -> Path:
    _write_private(path, json.dumps(config, indent=2).encode())
    return path


def _write_private(path: Path, data: bytes) -> None:
    """Write `data` readable by this user alone, in a directory only it can enter."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def chart_permissions() -> dict[str, dict]:
    """Every user's permissions, as the Helm chart reads them
    (`deploy/helm/pai/files/nats-permissions.json`)."""
    return {user: permissions_block(user) for user in ACCESS}


def bootstrap_from_env() -> None:  # pragma: no cover - the chart's bootstrap Job
    """Create the event stream and every bucket as the platform user (PAI_NATS_*)."""
    import asyncio

    from libs.common.bus import Bus
    from libs.common.config import load_config
    from libs.common.jetstream_limits import store_settings

    async def main() -> None:
        config = load_config()
        bus = await Bus.connect(config.nats_url, name="pai-bootstrap", user=config.nats_user, password=config.nats_password)
        try:
            await bus.bootstrap(store_settings(config))  # replicas and limits from the config
        finally:
            await bus.close()

    asyncio.run(main())


if __name__ == "__main__":  # pragma: no cover - command line
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "permissions":
        print(json.dumps(chart_permissions(), indent=2))
    elif command == "bootstrap":
        bootstrap_from_env()
    else:
        sys.exit("usage: python -m libs.common.busauth permissions|bootstrap")
