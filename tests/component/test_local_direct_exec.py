"""A task whose command the shim execs without bash (local_direct) shows the
user what the same command run by bash shows: exit code, logs, environment,
and the runtime's verdict. Each case runs the command twice on real processes:
as written (exec'd directly where it can be) and with its first word quoted,
which only bash can read and which bash runs the same way."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from services.launcher.backends.local_direct import simple_argv
from services.launcher.backends.local_layout import OUTPUT_LOG, TaskFiles
from services.runtime.core import RuleEngine, default_rules
from tests.component.test_local_backend import Harness, launch, open_harness, task_file
from tests.unit.runtime.builders import task_exited

USERS = [pytest.param(None, id="as-the-platforms-user")]
if os.geteuid() == 0:
    USERS.append(pytest.param("", id="as-the-jobs-own-user"))


@pytest.fixture(scope="module")
def programs() -> Iterator[Path]:
    """Programs anyone may run (pytest's own temporary directories are root's
    alone), outside every task's working directory."""
    # Not under /tmp: a task that runs as a user of its own has a /tmp of its own.
    bin_dir = Path(tempfile.mkdtemp(prefix="pai-direct-", dir="/var/tmp"))
    bin_dir.chmod(0o755)
    files = {
        "talks": ("#!/bin/sh\necho to-stdout\necho to-stderr >&2\n", 0o755),
        "fails": (
            "#!/bin/sh\necho 'Traceback (most recent call last):'\necho 'ValueError: bad input' >&2\nexit 3\n",
            0o755,
        ),
        "no-x-bit": ("#!/bin/sh\necho never\n", 0o644),
        "no-shebang": ("echo run-by-bash-as-a-script\nexit 4\n", 0o755),
        "allocates": ("#!/usr/bin/python3\nbytearray(200 * 1024 * 1024)\n", 0o755),
        "where-am-i": ("#!/bin/sh\npwd\numask\n", 0o755),
    }
    for name, (text, mode) in files.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(mode)
    (bin_dir / "not-a-program").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00garbage")
    (bin_dir / "not-a-program").chmod(0o755)
    yield bin_dir
    shutil.rmtree(bin_dir)


@pytest_asyncio.fixture(params=USERS)
async def local(request: pytest.FixtureRequest, tmp_path: Path):
    tmp_path.chmod(0o711)
    options = {
        "limits": "none"
    }  # rlimit bounds are entered by a shell line: always bash
    if request.param is not None:
        options["task_user"] = request.param
    harness = await open_harness(tmp_path / "data", **options)
    yield harness
    await harness.close()


def seen_by_the_user(harness: Harness, finished, slug: str) -> dict[str, object]:
    """What a user sees of a finished task, its task key (in paths and in bash's
    `pai-task-<key>: line 1:` prefix) made neutral."""
    files = TaskFiles(str(harness.backend.tasks_dir / slug))

    def neutral(text: str) -> str:
        return text.replace(slug, "<task>")

    def log(name: str) -> str | None:
        path = Path(files.beside(name))
        return (
            neutral(path.read_text()) if path.exists() else None
        )  # made on the first write

    verdict = RuleEngine(default_rules()).classify(
        task_exited(
            finished.exitCode,
            finished.userLogTail,
            reason=finished.platformReason,
            signal=finished.signal,
            preamble=False,
        )
    )
    return {
        "exit": (
            finished.exitCode,
            finished.signal,
            finished.platformReason,
            finished.platformMessage,
        ),
        "log tail": neutral(finished.userLogTail),
        "output.log": log("output.log"),
        "stderr.log": log("stderr.log"),
        "verdict": (verdict.spec.code, verdict.spec.phrase, verdict.spec.reaction),
    }


@pytest.mark.parametrize(
    ("program", "arguments", "exit_code"),
    [
        ("talks", "", 0),
        ("fails", " --epochs=3", 3),
        ("missing-program-in-pai", "", 127),  # not found: bash runs it, and says so
        ("no-x-bit", "", 126),  # not executable: likewise
        ("no-shebang", "", 4),  # the exec fails; bash runs the file as a script
        ("not-a-program", "", 126),  # the exec fails; bash says it cannot run it
    ],
    ids=[
        "success",
        "non-zero-exit",
        "missing-command",
        "not-executable",
        "script-without-shebang",
        "not-a-program",
    ],
)
async def test_a_direct_run_shows_what_a_run_by_bash_shows(
    local: Harness,
    programs: Path,
    program: str,
    arguments: str,
    exit_code: int,
):
    path = programs / program
    direct_command = f"{path}{arguments}"
    bash_command = f"'{path}'{arguments}"
    assert simple_argv([direct_command]) is not None  # the shim tries to exec it itself
    assert simple_argv([bash_command]) is None

    tasks = [
        launch(f"{program}-{how}", command)
        for how, command in (("direct", direct_command), ("bash", bash_command))
    ]
    seen = []
    for task in tasks:
        finished = await local.run(task)
        seen.append(seen_by_the_user(local, finished, task.key.slug))

    assert seen[0] == seen[1]
    assert seen[0]["exit"][0] == exit_code


async def test_a_missing_command_is_reported_by_bash_with_its_message(local: Harness):
    finished = await local.run(launch("missing", "no-such-program-in-pai --flag"))
    assert finished.exitCode == 127
    assert re.search(
        r"line 1: no-such-program-in-pai: command not found", finished.userLogTail
    )


async def test_a_direct_run_gets_the_environment_directory_and_umask_bash_gives(
    local: Harness, programs: Path
):
    env = {
        "PAI_JOB_NAME": "probe",
        "CUDA_VISIBLE_DEVICES": "0",
        "PAI_HOST_IP_my-role_0": "10.0.0.1",
    }
    seen = []
    direct_env_tail: list[str] = []
    for how, commands in (
        ("direct", ["env", str(programs / "where-am-i")]),
        ("bash", ["'env'", f"'{programs}/where-am-i'"]),
    ):
        outputs = []
        for index, command in enumerate(commands):
            task = launch(f"probe-{how}", command, env=env, index=index)
            finished = await local.run(task)
            assert finished.exitCode == 0, finished.userLogTail
            text = task_file(local.backend, task.key, OUTPUT_LOG).read_text()
            lines = text.replace(task.key.slug, "<task>").splitlines()
            if how == "direct" and index == 0:
                direct_env_tail = lines[-2:]
            outputs.append(sorted(lines))
        seen.append(outputs)
    assert seen[0] == seen[1]
    environment, (directory, umask) = seen[0]
    # The one outward trace of who exec'd `env`: bash lists its environment in
    # an order of its own, the shim puts what it adds last.
    assert direct_env_tail == ["SHLVL=0", "_=/usr/bin/env"]
    assert (
        "PAI_HOST_IP_my-role_0=10.0.0.1" in environment
    )  # bash passes on names it cannot read
    assert "SHLVL=0" in environment and "_=/usr/bin/env" in environment
    assert directory.endswith("/<task>") and umask == "0022"


@pytest.mark.skipif(
    os.geteuid() != 0, reason="tasks change user only when the launcher runs as root"
)
async def test_a_direct_run_is_bounded_by_rlimit_as_a_run_by_bash_is(
    tmp_path: Path, programs: Path
):
    tmp_path.chmod(0o711)
    harness = await open_harness(tmp_path / "data", limits="rlimit", task_user="")
    try:
        seen = []
        for how, command in (
            ("direct", str(programs / "allocates")),
            ("bash", f"'{programs}/allocates'"),
        ):
            task = launch(f"allocates-{how}", command, memoryMB=64)
            finished = await harness.run(task)
            seen.append(seen_by_the_user(harness, finished, task.key.slug))
    finally:
        await harness.close()
    assert seen[0] == seen[1]
    assert seen[0]["exit"][0] == 1 and "MemoryError" in seen[0]["log tail"]


async def test_a_direct_run_is_stopped_as_a_run_by_bash_is(local: Harness):
    seen = []
    for how, command in (("direct", "sleep 30"), ("bash", "'sleep' 30")):
        task = launch(f"stopped-{how}", command)
        await local.backend.start(task)
        await local.events.running(task.key)
        await local.backend.kill(task.key, grace_seconds=5.0, reason="UserStopped")
        finished = await local.events.finished(task.key)
        seen.append(seen_by_the_user(local, finished, task.key.slug))
    assert seen[0] == seen[1]
    assert seen[0]["exit"] == (128 + 15, 15, "UserStopped", "stopped: SIGTERM")
