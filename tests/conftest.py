"""Fixtures shared by every test tier."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from libs.common.busauth import load_or_create_credentials
from libs.common.natsserver import NatsServer
from tests.fixtures.settings import TEST_ENV

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


# Run as root, the local backend puts tasks' working directories outside pytest's
# temporary directories, which its users cannot pass (local_layout's
# choose_work_root): in <temp dir>/pai-work-<id>. Each test session gets a temp dir
# of its own (anyone may pass through it, as /tmp), set before anything asks for one
# and inherited by the services the tests start, so the work roots of this session,
# and only those, go with it: two sessions on one machine no longer remove each
# other's working directories. It is under /var/tmp, not /tmp: a task run as a
# user of its own gets a /tmp of its own (local_namespaces), so files a test shares
# with its tasks (start logs, markers) must lie elsewhere, as a user's would.
_SESSION_TEMP = Path(tempfile.mkdtemp(prefix="pai-tests-", dir="/var/tmp" if Path("/var/tmp").is_dir() else None))
_SESSION_TEMP.chmod(0o755)
os.environ["TMPDIR"] = str(_SESSION_TEMP)
tempfile.tempdir = str(_SESSION_TEMP)
# The `pai` command keeps its contexts in the user's config directory (cli/contexts.py):
# no test, nor a service or CLI it starts, reads or writes the real one.
os.environ["XDG_CONFIG_HOME"] = str(_SESSION_TEMP / "config")

# A pytest-xdist worker (make test) starts with COLUMNS=80 and LINES=24 set: the CLI's
# rich consoles, made when their modules are imported, would keep that size whatever a
# test sets later (test_rules sets COLUMNS for a wide table), unlike a run without workers.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)

# The settings every PAI the tests start runs with (tests/fixtures/settings.py): the
# services started as processes read them from here, in-process ones are given them.
for _name, _value in TEST_ENV.items():
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session", autouse=True)
def _session_temp_removed_at_the_end():
    yield
    shutil.rmtree(_SESSION_TEMP, ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    # Also in a run with workers (pytest-xdist), whose controller runs no test and so no
    # session fixture: its temp dir holds the workers' tmp_path roots.
    shutil.rmtree(_SESSION_TEMP, ignore_errors=True)


# `make test` runs the tests in worker processes (pytest-xdist, --dist loadgroup), each
# test module as a whole on one worker (its module fixtures made once), except the
# modules that run tasks on the local backend: those run one after another on one
# worker, as in a run without workers. Two launchers of different data dirs hand out
# the same uids (each registry starts at local_uids.JOB_UID_BASE) and mark tasks by job
# name, so tasks of tests running side by side would share uids (a task sees and
# holds up the other's processes: the isolation and uid-release tests would fail) and
# be found by each other's process scans.
ONE_AT_A_TIME = "local-tasks"
_LOCAL_TASK_DIRS = ("tests/browser/", "tests/chaos/", "tests/integration/")
# What a module that starts a launcher with the local backend, a whole platform, or
# a task the way the shim does, names (read from its source, so that a new such
# module joins the group without a list to keep).
_RUNS_LOCAL_TASKS = re.compile(
    r"LocalBackend|open_harness|test_local_backend|Platform\(|platform_config|start_platform"
    r"|local_shim|local_forkserver|spawn_as|backends\.local|backends import local|local_procs|local_limits"
)


def xdist_group(path: str, cache: dict[str, str]) -> str:
    """The group of the test module at `path` (relative to the repository)."""
    if path not in cache:
        runs_tasks = path.startswith(_LOCAL_TASK_DIRS)
        if not runs_tasks:
            try:
                runs_tasks = bool(_RUNS_LOCAL_TASKS.search((REPO / path).read_text(errors="replace")))
            except OSError:
                runs_tasks = True  # unknown: the safe side
        cache[path] = ONE_AT_A_TIME if runs_tasks else path
    return cache[path]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """--dist loadgroup, the groups being xdist_group() of each test's module. Not
    xdist's own loadgroup with xdist_group marks: it names a test's group by appending
    it to the test's id, which pytest 9 no longer lets a plugin change, and then puts
    every test on its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndLocalTaskGroup(LoadScopeScheduling):
        _groups: dict[str, str] = {}

        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid.split("::", 1)[0], self._groups)

    return ModulesAndLocalTaskGroup(config, log)


# Where a run with workers spends its time, printed at its end: each worker's busy
# seconds and the local-task group's, so that whoever keeps the suite under its time
# budget sees which worker the run waited on (the local-task group runs on one).
_BUSY_BY_WORKER: dict[str, float] = {}
_BUSY_BY_GROUP: dict[str, float] = {}
_BUSY_BY_MODULE: dict[str, float] = {}
_MODULES_SHOWN = 25


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # set on reports a worker sent to the controller
    if node is None:
        return
    worker = node.gateway.id
    _BUSY_BY_WORKER[worker] = _BUSY_BY_WORKER.get(worker, 0.0) + report.duration
    group = xdist_group(report.nodeid.split("::", 1)[0], _GROUP_OF_PATH)
    group = group if group == ONE_AT_A_TIME else "others"
    _BUSY_BY_GROUP[group] = _BUSY_BY_GROUP.get(group, 0.0) + report.duration
    module = report.nodeid.split("::", 1)[0]
    _BUSY_BY_MODULE[module] = _BUSY_BY_MODULE.get(module, 0.0) + report.duration


_GROUP_OF_PATH: dict[str, str] = {}


def pytest_terminal_summary(terminalreporter) -> None:
    if not _BUSY_BY_WORKER:
        return
    workers = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in sorted(_BUSY_BY_WORKER.items()))
    groups = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in sorted(_BUSY_BY_GROUP.items()))
    terminalreporter.write_line(f"busy time by worker: {workers}; by group: {groups}")
    busiest = sorted(_BUSY_BY_MODULE.items(), key=lambda item: -item[1])[:_MODULES_SHOWN]
    terminalreporter.write_line(f"the {len(busiest)} busiest modules (setup, call and teardown together):")
    for module, seconds in busiest:
        group = "local-tasks" if xdist_group(module, _GROUP_OF_PATH) == ONE_AT_A_TIME else "others"
        terminalreporter.write_line(f"  {seconds:6.1f} s  {group:11}  {module}")


def shared_path(*parts: str) -> Path:
    """A file of the team's reference material; the test skips when it is absent
    (a fresh clone has no ../shared)."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference files not present: {path}")
    return path


@contextlib.contextmanager
def authenticated_nats_server(root: Path):
    with NatsServer(root / "store", auth=load_or_create_credentials(root / "nats-credentials.json")) as srv:
        srv.bootstrap()
        yield srv


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory):
    """A real nats-server with JetStream, one per test session, on a free port, with
    PAI's users and permissions (as `pai up` runs it) and its store bootstrapped.
    Tests connect with `Bus.connect(..., **nats_server.login(user))`.

    A test module that reads whole buckets or replays the whole stream (as a
    service restoring its state does) overrides it with `own_nats_server`, so
    what other modules left on the shared server cannot reach it."""
    with authenticated_nats_server(tmp_path_factory.mktemp("nats")) as srv:
        yield srv


@pytest.fixture(scope="module")
def own_nats_server(tmp_path_factory: pytest.TempPathFactory):
    """A server for one test module alone, for modules whose services restore from
    whole buckets and the whole stream, which other modules' leftovers must not reach."""
    with authenticated_nats_server(tmp_path_factory.mktemp("nats-own")) as srv:
        yield srv


@pytest.fixture(params=["fast", "plain"])
def bus_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The bus tier runs each test on both of the bus's clients (config `bus_client`,
    libs/common/bus/link.py): every `Bus.connect` in the test runs the one named
    (`PAI_BUS_CLIENT`). A module takes it with `pytest.mark.usefixtures("bus_client")`."""
    monkeypatch.setenv("PAI_BUS_CLIENT", request.param)
    return str(request.param)


@contextlib.asynccontextmanager
async def platform_bus(server, *, purge: tuple[str, ...] = (), durables=()):
    """A connection as the platform user to `server`, its store bootstrapped; the
    streams named in `purge` emptied and the durables in `durables` deleted, so a
    test's consumers start from nothing."""
    import nats.js.errors

    from libs.common.bus import Bus
    from libs.common.subjects import STREAM

    bus = await Bus.connect(server.url, name="test-admin", **server.login("platform"))
    await bus.bootstrap()
    for stream in purge:
        await bus.js.purge_stream(stream)
    for durable in durables:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await bus.js.delete_consumer(STREAM, durable.value)
    try:
        yield bus
    finally:
        await bus.close()


def publish_half_then_fail_once(bus):
    """Make `bus.publish_many` store the first half of its first batch of more than one
    event and then time out, as a stream answering too late would; later calls go through.
    Returns the sizes of the batches it failed (one, once it has)."""
    real_publish_many = bus.publish_many
    failed: list[int] = []

    async def publish_many(events) -> None:
        if len(events) > 1 and not failed:
            failed.append(len(events))
            await real_publish_many(events[: len(events) // 2])
            raise TimeoutError("the stream answered too late")
        await real_publish_many(events)

    bus.publish_many = publish_many
    return failed
