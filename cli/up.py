"""`pai up`: the whole platform on this machine.

Starts an embedded nats-server with JetStream in `<data dir>/nats`, then the five
services as separate processes, waits until each answers /readyz, prints the API
URL and the admin token, and supervises: nats-server or a service that dies is
started again (the state is in JetStream's store, so each picks up where it
was). Ctrl-C (or SIGTERM) stops the services, then every task process the local
backend still runs, then NATS, leaving no process behind. A second `pai up` on the same data dir resumes
with every job as it was; one started while the first still runs is refused, naming it
(take_data_dir), before it touches anything.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import msgspec

from cli.client import Connection, connection_file
from libs.common import sealing
from libs.common.busauth import BusCredentials, load_or_create_credentials
from libs.common.config import Config
from libs.common.jetstream_limits import store_settings
from libs.common.natsserver import NatsServer, embedded_max_procs

SERVICES = ("rest", "scheduler", "launcher", "runtime", "monitor")
READY_TIMEOUT_SECONDS = 60.0
RESTART_BACKOFF_SECONDS = 1.0
SUPERVISE_SECONDS = 0.5
# How long `stop` gives the services to end after SIGTERM before it kills them.
SERVICE_STOP_SECONDS = 15.0
# Held (flock) by the `pai up` that runs the data dir, with its pid inside; the kernel
# drops it when that process ends, however it ends.
DATA_DIR_LOCK = "up.lock"


class Platform:
    def __init__(self, config: Config, *, print_fn=print):
        self.config = config
        self.data = config.data_path.resolve()
        self.logs = self.data / "logs"
        self.procs: dict[str, subprocess.Popen] = {}
        self.nats: NatsServer | None = None
        self.nats_credentials: BusCredentials | None = None
        self.print = print_fn
        self._stopping = False
        # What kill_service/kill_nats took down on purpose: supervision leaves it down
        # until it is started again (start_service, start_nats, or a benchmark's own
        # _spawn): a test that kills a service starts it itself.
        self._held: set[str] = set()
        self._lock_fd: int | None = None  # DATA_DIR_LOCK, once take_data_dir got it

    @property
    def api_url(self) -> str:
        return f"http://{self.config.host}:{self.config.rest_port}"

    def take_data_dir(self) -> None:
        """Make the data dir this platform's alone, or raise RuntimeError naming the
        `pai up` that runs it. Two platforms on one data dir would share its store, its
        ports and its task processes: the second's services would fail on the first's
        ports and be started again forever, and its stop would end the first's tasks."""
        if self._lock_fd is not None:
            return
        self.data.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.data / DATA_DIR_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RuntimeError(
                f"{self.data} is in use by another `pai up` (pid {holder}): stop it first (Ctrl-C where "
                f"it runs, or kill -INT {holder}) and let it finish stopping, or give this one "
                "a data dir of its own (--data-dir)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _release_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the last descriptor drops the flock
            self._lock_fd = None

    def start(self) -> Connection:
        self.take_data_dir()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.data.chmod(0o700)  # the bus credentials, the admin token and the store are the platform's alone
        port = int(self.config.nats_url.rsplit(":", 1)[-1])
        # Made at first start, reused on resume: NATS users and permissions (busauth).
        self.nats_credentials = load_or_create_credentials(self.data / "nats-credentials.json")
        # After the credentials (which make the data dir 0700): the data dir
        # ends traverse-only, everything in it private (see secure_data_dir).
        self.config = secure_data_dir(self.config, self.data, print_fn=self.print)
        self.start_store(port)
        self.data.chmod(0o711)  # writing the server config made it 0700: tasks pass through to their work dirs
        for name in SERVICES:
            self._spawn(name)
        for name in SERVICES:
            self._wait_ready(name)
        token = self.config.token_path.read_text().strip()
        conn = Connection(url=self.api_url, token=token)
        path = connection_file(self.data)
        path.write_bytes(msgspec.json.encode(conn))
        path.chmod(0o600)
        return conn

    def start_store(self, port: int) -> None:
        """nats-server, then the stream and buckets (which no service may create) with
        the configuration's store settings (`nats_*`: sizes, age, replicas), so a
        changed `nats_bucket_max_bytes` reaches a new or an existing store."""
        self.nats = NatsServer(
            self.data / "nats",
            port=port,
            host=self.config.host,
            log_file=self.logs / "nats.log",
            auth=self.nats_credentials,
            config_file=self.data / "nats-server.conf",
            max_procs=embedded_max_procs(self.config.nats_embedded_max_procs),
        ).start()
        self.nats.bootstrap(store_settings(self.config))

    def _env(self, name: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.config.to_env())
        assert self.nats_credentials is not None
        env.update(self.nats_credentials.env_for(name))  # its own NATS user, no other's
        env["PAI_DATA_DIR"] = str(self.data)
        env.pop("PAI_CONFIG", None)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _spawn(self, name: str) -> None:
        self.procs[name] = self._start_process(name)
        self._held.discard(name)  # started, whoever started it: supervised again

    def _start_process(self, name: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")
        return subprocess.Popen(
            [sys.executable, "-m", f"services.{name}"],
            env=self._env(name),
            stdout=log,
            stderr=log,
            cwd=Path(__file__).resolve().parents[1],
            start_new_session=True,  # Ctrl-C reaches us; we stop them in order
        )

    def _wait_ready(self, name: str) -> None:
        url = f"http://{self.config.host}:{self.config.port_of(name)}/readyz"
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}; {self._log_tail(name)}")
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{name} was not ready after {READY_TIMEOUT_SECONDS:.0f}s; {self._log_tail(name)}")

    def _log_tail(self, name: str, lines: int = 20) -> str:
        """Where a service's log is and how it ends: the reason it did not come up
        is on screen, also where the data dir is gone by the time anyone looks."""
        path = self.logs / f"{name}.log"
        try:
            tail = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError as exc:
            return f"its log {path} could not be read ({exc.strerror})"
        return f"its log {path} ends:\n" + "\n".join(f"  {line}" for line in tail)

    def kill_service(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to one service (chaos tests); `start_service` brings it back."""
        proc = self.procs[name]
        self._held.add(name)
        proc.send_signal(sig)
        proc.wait()

    def start_service(self, name: str) -> None:
        self._spawn(name)
        self._wait_ready(name)

    def kill_nats(self) -> None:
        assert self.nats is not None
        self._held.add("nats")
        self.nats.stop(kill=True)

    def start_nats(self) -> None:
        assert self.nats is not None
        self.nats.start()
        self._held.discard("nats")

    def supervise(self) -> None:
        """Block until asked to stop, starting again NATS or any service that died."""
        while not self._stopping:
            self.restart_what_died()
            time.sleep(SUPERVISE_SECONDS)

    def restart_what_died(self) -> list[str]:
        """One round of supervision: NATS first (every service needs it), then the
        services; returns what was started again."""
        restarted = []
        nats = self.nats
        if nats is not None and nats.proc is not None and nats.proc.poll() is not None and self._restarts("nats"):
            self.print(f"[yellow]nats-server exited with code {nats.proc.returncode}; starting it again[/]")
            nats.start()  # same store and port: JetStream recovers its streams
            self.data.chmod(0o711)  # as at start: writing the server config made it 0700
            restarted.append("nats")
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None and self._restarts(name):
                self.print(f"[yellow]{name} exited with code {proc.returncode}; starting it again[/]")
                time.sleep(RESTART_BACKOFF_SECONDS)
                # Still wanted after the backoff, and not started meanwhile by start_service.
                if self._restarts(name) and self.procs.get(name) is proc:
                    self._spawn(name)
                    restarted.append(name)
        return restarted

    def _restarts(self, name: str) -> bool:
        return not self._stopping and name not in self._held

    def request_stop(self, *_: object) -> None:
        self._stopping = True

    def stop_services(self, grace_seconds: float) -> None:
        """SIGTERM to every service, and SIGKILL to those still running `grace_seconds`
        later (all of them together)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop(self) -> None:
        self._stopping = True
        if self._lock_fd is None:
            return  # never took the data dir (another `pai up` runs it): nothing here is ours
        try:
            self.stop_services(SERVICE_STOP_SECONDS)
            if self.config.backend == "local":
                asyncio.run(
                    stop_local_tasks(self.data / "launcher", grace_seconds=min(self.config.grace_seconds, 5.0))
                )
            if self.nats is not None:
                self.nats.stop()
        finally:
            self._release_data_dir()


# -- tasks isolated, secrets sealed ---------------------------------------------

TASK_USER = "pai-task"
# Under the data dir: only these are reachable by tasks, and only by traversal
# (no listing): the way to each task's working directory (its own, 0700).
_TRAVERSE_ONLY = ("", "launcher", "launcher/work")
_PRIVATE_DIRS = ("nats", "logs", "launcher/tasks")


def secure_data_dir(config: Config, data: Path, *, print_fn=print) -> Config:
    """Make the data dir the platform's: the key pair that seals job secrets
    (made at first start), the user tasks run as, private modes.

    Everything the platform keeps is 0600 (files) or 0700 (directories); the
    data dir, `launcher/` and `launcher/work/` are 0711 so that a task, which
    runs as another user, can reach its working directory by its absolute path
    (PAI_WORK_DIR, HOME) but list or read nothing on the way. Returns the
    config the services get (key files and task user filled in)."""
    private_key = Path(config.secrets_private_key_file or data / "secrets.key")
    public_key = Path(config.secrets_public_key_file or data / "secrets.pub")
    if sealing.write_key_pair(private_key, public_key):
        print_fn(f"created the key pair that seals job secrets: {private_key} (private), {public_key}")
    task_user = config.task_user or (choose_task_user(print_fn=print_fn) if os.geteuid() == 0 else "")
    for name in _PRIVATE_DIRS:  # made private before anything is written in them
        (data / name).mkdir(mode=0o700, parents=True, exist_ok=True)
    for child in data.iterdir():
        if child.is_symlink():
            continue
        if child.is_dir():
            child.chmod(0o700)
        elif child.is_file():
            child.chmod(0o600)
    for name in _TRAVERSE_ONLY:
        path = data / name
        path.mkdir(exist_ok=True)
        path.chmod(0o711)
    return msgspec.structs.replace(
        config,
        secrets_private_key_file=str(private_key),
        secrets_public_key_file=str(public_key),
        task_user=task_user,
    )


def choose_task_user(*, print_fn=print) -> str:
    """`pai-task` (a system user made for the purpose when missing), else `nobody`."""
    try:
        pwd.getpwnam(TASK_USER)
        return TASK_USER
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    if useradd is not None:
        made = subprocess.run(
            [useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", TASK_USER],
            capture_output=True,
            text=True,
        )
        if made.returncode in (0, 9):  # 9: it exists (made meanwhile)
            print_fn(f"created the system user {TASK_USER}; local tasks run under its group, each job with a uid of its own")
            return TASK_USER
        print_fn(f"[yellow]useradd {TASK_USER} failed ({made.stderr.strip()}); tasks use the group of nobody[/]")
    return "nobody"


# platformReason of tasks ended because the platform itself was stopped; the
# runtime's rules retry them without counting it against the job's budget.
PLATFORM_STOPPED = "PlatformStopped"


async def stop_local_tasks(launcher_dir: Path, *, grace_seconds: float) -> int:
    """End every task process the local backend still runs (after the launcher stopped).

    Uses the backend's own stop (SIGTERM to the whole task, SIGKILL after the
    grace period), so each exit is recorded and the next launcher learns of it.
    """
    from services.launcher.backends.local import LocalBackend

    if not launcher_dir.exists():
        return 0
    backend = LocalBackend(launcher_dir, grace_seconds=grace_seconds, announce=False)
    try:
        keys = await backend.recover()
        await asyncio.gather(*(backend.kill(k, grace_seconds=grace_seconds, reason=PLATFORM_STOPPED) for k in keys))
        return len(keys)
    finally:
        await backend.close()
