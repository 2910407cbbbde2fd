"""Who may do what on the NATS bus: PAI's one permission table, and the credentials
and nats-server configuration made from it.

Every process on the bus logs in as a NATS user (docs/architecture.md, "Security"):

- each service as itself, allowed exactly what the ownership table of
  docs/architecture.md ("Services") gives it: publish the event kinds it owns,
  consume with its own durable, write its own KV buckets, read the buckets it
  reads, serve or ask its RPC subjects;
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
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

import msgspec

from libs.common.alerts_messages import ALERTS_SUBJECT
from libs.common.logs import LOG_SUBJECT
from libs.common.rules_messages import RULES_SUBJECT
from libs.common.subjects import (
    JOB_TAG_SUBJECT,
    PREFIX,
    STREAM,
    TERMINAL_INPUT_SUBJECTS,
    TERMINAL_OPEN_SUBJECT,
    TERMINAL_OUTPUT_SUBJECTS,
    Bucket,
    Durable,
    Kind,
    dead_letter_subject,
    kind_filter,
)
from libs.common.tensorboard_relay import TENSORBOARD_SUBJECT

if TYPE_CHECKING:
    from libs.common.config import Config

PLATFORM = "platform"
INTEGRATOR = "integrator"


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
    # Plain subjects outside the stream it publishes on and subscribes to (a terminal
    # session's bytes: libs/common/subjects.py, TERMINAL_*).
    sends: tuple[str, ...] = ()
    hears: tuple[str, ...] = ()
    reads_events: bool = False  # integrators: the event stream, read-only
    # The monitor: JetStream's account info and the info of PAI's stream and buckets,
    # for their fill (services/monitor/store_fill.py); read-only.
    reads_store_fill: bool = False
    # Event kinds it follows live (rest's GET /api/v2/events): an ephemeral push
    # consumer per kind, named by it and filtered to that kind, delivering to its
    # inbox, with flow control; and STREAM.MSG.GET by sequence, to resume.
    watches: tuple[Kind, ...] = ()
    admin: bool = False  # the platform's bootstrap: everything


ACCESS: dict[str, Access] = {
    "rest": Access(
        publishes=(Kind.JOB_SUBMITTED, Kind.JOB_STOP_REQUESTED, Kind.NODE_CORDON, Kind.JOB_DELETED,
                   Kind.JOB_ARCHIVED),  # job.archived: services/rest/history/expiry.py
        durable=Durable.REST,  # job.deleted: its own records of a deleted job (services/rest/deletion.py)
        more_durables=(Durable.HISTORY,),  # the job history database (services/rest/history)
        writes=(Bucket.JOBS, Bucket.USERS, Bucket.SECRETS, Bucket.MARKET),  # MARKET: services/rest/market
        # Not SECRETS: sealed for the launcher, rest only stores them.
        # NODES, NODE_HEALTH: the node list of `GET /api/v2/cluster/nodes`.
        # JOB_METRICS: a job's utilisation over time (GET /api/v2/jobs/{id}/metrics).
        reads=(Bucket.JOBS, Bucket.USERS, Bucket.JOB_STATUS, Bucket.SCHEDULE, Bucket.CLUSTER, Bucket.NODES, Bucket.NODE_HEALTH,
               Bucket.ALERTS, Bucket.JOB_METRICS, Bucket.MARKET),
        asks=(LOG_SUBJECT, RULES_SUBJECT, ALERTS_SUBJECT, TENSORBOARD_SUBJECT, TERMINAL_OPEN_SUBJECT),
        # A browser terminal's keys to the launcher, its output back (services/rest/terminal.py).
        sends=(TERMINAL_INPUT_SUBJECTS,),
        hears=(TERMINAL_OUTPUT_SUBJECTS,),
        serves=(JOB_TAG_SUBJECT,),  # the monitor's tag-job alert action (services/rest/tag_requests.py)
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
        publishes=(Kind.TASK_STARTED, Kind.TASK_EXITED, Kind.JOB_STATE, Kind.JOB_RELEASED,
                   Kind.TERMINAL_OPENED, Kind.TERMINAL_CLOSED),  # terminals: services/launcher/terminals.py
        durable=Durable.LAUNCHER,
        # TERMINALS: the terminal sessions it holds open (services/launcher/core/terminals.py).
        writes=(Bucket.JOB_STATUS, Bucket.TERMINALS),
        # NODE_HEALTH: at restore, tasks still live on a node the monitor holds
        # lost are ended (the NodeStatus that said so may have been acked just
        # before a crash).
        reads=(Bucket.JOB_STATUS, Bucket.SECRETS, Bucket.NODE_HEALTH, Bucket.TERMINALS),
        lease=True,
        serves=(LOG_SUBJECT, TENSORBOARD_SUBJECT, TERMINAL_OPEN_SUBJECT),
        sends=(TERMINAL_OUTPUT_SUBJECTS,),
        hears=(TERMINAL_INPUT_SUBJECTS,),
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
        # JOB_METRICS: each task's utilisation over time (services/monitor/usage.py).
        writes=(Bucket.NODES, Bucket.NODE_HEALTH, Bucket.ALERTS, Bucket.ALERT_RULES, Bucket.JOB_METRICS),
        # USERS: the mail address of a job's owner (alert and job-state mail);
        # SCHEDULE: why a waiting job waits, for a restarted monitor's PaiJobPending.
        reads=(Bucket.NODES, Bucket.NODE_HEALTH, Bucket.JOB_STATUS, Bucket.ALERTS, Bucket.ALERT_RULES, Bucket.USERS,
               Bucket.SCHEDULE, Bucket.JOB_METRICS),
        serves=(ALERTS_SUBJECT,),
        asks=(JOB_TAG_SUBJECT,),  # the tag-job alert action: rest tags the job (no API token)
        reads_store_fill=True,
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
    """Open, get (direct or not), list keys, read in pages and watch one bucket.

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
        # A restore's paged read (bus.read_pages): its ephemeral consumer's pulls.
        _api("CONSUMER.MSG.NEXT", stream, "*"),
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
    publish += access.sends
    subscribe += access.hears
    if access.watches:
        publish += [_api("STREAM.INFO", STREAM), _api("STREAM.MSG.GET", STREAM)]
        # CONSUMER.CREATE.<stream>.<name>.<filter>: nats-server holds the config's
        # filter to the one in the subject, so only consumers of these kinds.
        publish += [_api("CONSUMER.CREATE", STREAM, "*", kind_filter(kind)) for kind in access.watches]
        publish.append(f"$JS.FC.{STREAM}.>")  # answers to the consumers' flow control
    if access.reads_store_fill:
        publish += [_api("INFO"), _api("STREAM.INFO", STREAM), *(_api("STREAM.INFO", _kv_stream(b)) for b in Bucket)]
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
#
# Each user logs in with an NATS nkey: an ed25519 key pair. The server configuration
# lists each user's public key with its permissions; the process holds the seed
# (private key) and signs the nonce the server sends at every (re)connect. Checking
# that signature costs the server tens of microseconds, where the bcrypt passwords
# PAI used before cost it about 120 ms of CPU per connect: a thousand node agents
# reconnecting at once queued for minutes behind the hashing.

# What a user's seed looks like (nkeys: "S" for seed, "U" for user).
_USER_SEED_PREFIX = "SU"


class Login(TypedDict, total=False):
    """`Bus.connect`'s keyword arguments that log a process in."""

    user: str
    nkey_seed: str
    password: str
    client: Literal["fast", "plain"]  # the config's bus_client (libs/common/bus/link.py)
    tls_ca_file: str  # the CA a tls:// server's certificate is checked against (nats_tls_ca_file)


class UserKey(msgspec.Struct, frozen=True):
    seed: str  # the private key: only the process logging in as this user has it
    public: str  # the public key the server configuration holds ("U...")


class BusCredentials(msgspec.Struct, frozen=True):
    """Every NATS user's nkey; in `<data dir>/nats-credentials.json`, 0600."""

    users: dict[str, UserKey]

    def seed(self, user: str) -> str:
        return self.users[user].seed

    def login(self, user: str) -> Login:
        """`Bus.connect` keyword arguments that log in as `user`."""
        return {"user": user, "nkey_seed": self.seed(user)}

    def env_for(self, user: str) -> dict[str, str]:
        """The environment that makes a PAI process log in as `user`, and only it."""
        return {"PAI_NATS_USER": user, "PAI_NATS_NKEY_SEED": self.seed(user)}


def _key_of_seed(seed: bytes) -> UserKey:
    import nkeys

    pair = nkeys.from_seed(bytearray(seed))
    return UserKey(seed=seed.decode(), public=pair.public_key.decode())


def new_user_key() -> UserKey:
    import nkeys

    return _key_of_seed(nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER))


def user_seed(secret: str) -> str:
    """The nkey seed of a user given its secret: the seed itself ("SU..."), or any
    other secret string, from which the seed is derived (SHA-256 of it as the key).

    The Helm chart cannot make an ed25519 key in a template: its Secret holds a
    random string per user and each pod derives the same key from it, the NATS pod's
    init container included (`python -m libs.common.busauth nats-conf`)."""
    import hashlib

    import nkeys

    secret = secret.strip()
    if not secret:
        raise ValueError("empty NATS nkey secret")
    if secret.startswith(_USER_SEED_PREFIX):
        try:
            return _key_of_seed(secret.encode()).seed
        except Exception as exc:  # noqa: BLE001 - nkeys raises several kinds
            raise ValueError(f"invalid NATS nkey seed (starts with {_USER_SEED_PREFIX} but does not decode): {exc!r}") from exc
    raw = hashlib.sha256(b"pai-nats-nkey\0" + secret.encode()).digest()
    return nkeys.encode_seed(raw, nkeys.PREFIX_BYTE_USER).decode()


def public_key(secret: str) -> str:
    """The public nkey ("U...") of a user's secret (see `user_seed`)."""
    return _key_of_seed(user_seed(secret).encode()).public


def load_or_create_credentials(path: Path) -> BusCredentials:
    """The credentials in `path`; created at first start, completed when a user was
    added to `ACCESS` since, otherwise reused as they are (resume keeps them).

    A file of the password era (`{"users": {u: {"password", "bcrypt"}}}`) is
    replaced by one of nkeys, in one atomic rename: the passwords were known only to
    this file, the server configuration `pai up` writes next and the processes it
    starts, all of which it makes again from the new file."""
    found: dict[str, UserKey] = {}
    if path.exists():
        stored = msgspec.json.decode(path.read_bytes())
        for user, entry in (stored.get("users") or {}).items():
            if isinstance(entry, dict) and isinstance(entry.get("seed"), str):
                found[user] = _key_of_seed(entry["seed"].encode())  # checked: a damaged seed fails here
    users = {user: found.get(user) or new_user_key() for user in ACCESS}
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


def server_config(credentials: BusCredentials | None, *, host: str, port: int, store_dir: Path, tls: TlsFiles | None = None,
                  cluster: ClusterRoutes | None = None) -> dict:
    """nats-server's configuration (JSON is valid nats-server syntax): JetStream,
    one user per line of `ACCESS` with its public nkey, no anonymous access;
    with `cluster`, one node of a JetStream cluster (same users on every node).
    Without credentials: no authorization at all (development, some tests)."""
    config: dict = {
        "host": host,
        "port": port,
        "jetstream": {"store_dir": str(store_dir)},
    }
    if credentials is not None:
        config["authorization"] = {"users": users_block(credentials)}
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
    return nkey_users_block({user: credentials.users[user].public for user in ACCESS})


def nkey_users_block(public_keys: dict[str, str]) -> list[dict]:
    """The server's `users`: each user of `ACCESS` by its public nkey, with its
    permissions (the server knows users by key; the name is for people reading)."""
    missing = [user for user in ACCESS if user not in public_keys]
    if missing:
        raise ValueError(f"no NATS key for user(s) {', '.join(missing)}")
    return [{"nkey": public_keys[user], "permissions": permissions_block(user)} for user in ACCESS]


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


def login_of_config(config: Config) -> Login:
    """`Bus.connect` keyword arguments of a process's own login (`nats_user` with its
    `nats_nkey_seed`, or `nats_password` against a NATS of passwords)."""
    return {"user": config.nats_user, "nkey_seed": config.nats_nkey_seed, "password": config.nats_password,
            "client": config.bus_client, "tls_ca_file": config.nats_tls_ca_file}


def authorization_from_keys(keys_dir: Path) -> dict:
    """The server's `authorization` block from a folder of one secret per user (a
    file named after the user: the chart's mounted Secret "<release>-bus-credentials")."""
    keys_dir = Path(keys_dir)
    public: dict[str, str] = {}
    for user in ACCESS:
        file = keys_dir / user
        if not file.is_file():
            raise ValueError(f"no NATS key for user {user!r}: {file} is missing")
        try:
            public[user] = public_key(file.read_text())
        except ValueError as exc:
            raise ValueError(f"{file}: {exc}") from exc
    return {"users": nkey_users_block(public)}


ROUTE_PASSWORD_FILE = "route-password"  # the chart's credentials Secret: NATS servers' password to each other
ROUTE_PASSWORD_PLACEHOLDER = "__ROUTE_PASSWORD__"


def chart_server_config(base: Path, keys_dir: Path) -> str:
    """The bundled NATS's configuration: the chart's `nats-base.conf` (no secret in
    it) with the route password of the credentials Secret filled in and the users'
    public nkeys and permissions appended."""
    text = Path(base).read_text()
    if ROUTE_PASSWORD_PLACEHOLDER in text:
        file = Path(keys_dir) / ROUTE_PASSWORD_FILE
        password = file.read_text().strip() if file.is_file() else ""
        if not password or not password.isalnum():
            raise ValueError(f"{file}: the NATS route password is missing or not letters and digits alone")
        text = text.replace(ROUTE_PASSWORD_PLACEHOLDER, password)
    authorization = json.dumps(authorization_from_keys(keys_dir), indent=2)
    return text.rstrip("\n") + f"\nauthorization: {authorization}\n"


def write_chart_server_config(base: Path, keys_dir: Path, out: Path) -> None:
    """`chart_server_config` written to `out` (the chart's init container)."""
    text = chart_server_config(base, keys_dir)
    # Not _write_private: the folder is the pod's emptyDir, which this uid may not
    # chmod; the file alone is made 0600 (the NATS container runs as the same uid).
    out = Path(out)
    tmp = out.with_suffix(out.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.replace(tmp, out)


def reload_when_changed(base: Path, keys_dir: Path, out: Path, pid_file: Path, *,
                        sleep: Callable[[float], None] = time.sleep, period: float = 10.0,
                        rounds: int | None = None) -> None:
    """The NATS pod's config reloader: every `period` seconds, make the configuration
    again from the mounted ConfigMap and Secret (Kubernetes updates them in place) and,
    when it changed, write it and signal nats-server (SIGHUP, the pid in `pid_file`;
    the pod shares one process namespace) to reload it: a user's key rotated or a
    permission changed reaches the servers without a restart. A bad configuration is
    logged and not written: the server keeps the one it runs."""
    done = 0
    while rounds is None or done < rounds:
        sleep(period)
        done += 1
        try:
            text = chart_server_config(base, keys_dir)
        except (OSError, ValueError) as exc:
            print(f"busauth reloader: not reloading: {exc}", file=sys.stderr, flush=True)
            continue
        if out.is_file() and out.read_text() == text:
            continue
        write_chart_server_config(base, keys_dir, out)
        try:
            os.kill(int(pid_file.read_text().strip()), signal.SIGHUP)
            print("busauth reloader: configuration changed; nats-server reloads it", file=sys.stderr, flush=True)
        except (OSError, ValueError) as exc:
            print(f"busauth reloader: cannot signal nats-server: {exc}", file=sys.stderr, flush=True)


def bootstrap_from_env() -> None:  # pragma: no cover - the chart's bootstrap Job
    """Create the event stream and every bucket as the platform user (PAI_NATS_*)."""
    import asyncio

    from libs.common.bus import Bus
    from libs.common.config import load_config
    from libs.common.jetstream_limits import store_settings

    async def main() -> None:
        config = load_config()
        bus = await Bus.connect(config.nats_url, name="pai-bootstrap", **login_of_config(config))
        try:
            await bus.bootstrap(store_settings(config))  # replicas and limits from the config
        finally:
            await bus.close()

    asyncio.run(main())


USAGE = """usage: python -m libs.common.busauth COMMAND
  permissions                   every user's NATS permissions (the chart's files/nats-permissions.json)
  bootstrap                     create/update the store as the platform user (PAI_NATS_*)
  authorization KEYS_DIR        the server's authorization block (public nkeys) from one secret file per user
  nats-conf BASE KEYS_DIR OUT   BASE with that block appended, written to OUT (the chart's NATS init container)
  nats-reload BASE KEYS_DIR OUT PID_FILE
                                the same every 10 s; when it changed, written and nats-server signalled to reload"""


def main(argv: list[str]) -> None:  # pragma: no cover - command line
    try:
        match argv:
            case ["permissions"]:
                print(json.dumps(chart_permissions(), indent=2))
            case ["bootstrap"]:
                bootstrap_from_env()
            case ["authorization", keys_dir]:
                print(json.dumps({"authorization": authorization_from_keys(Path(keys_dir))}, indent=2))
            case ["nats-conf", base, keys_dir, out]:
                write_chart_server_config(Path(base), Path(keys_dir), Path(out))
            case ["nats-reload", base, keys_dir, out, pid_file]:
                reload_when_changed(Path(base), Path(keys_dir), Path(out), Path(pid_file))
            case _:
                sys.exit(USAGE)
    except ValueError as exc:
        sys.exit(f"busauth: {exc}")


if __name__ == "__main__":  # pragma: no cover - command line
    main(sys.argv[1:])
