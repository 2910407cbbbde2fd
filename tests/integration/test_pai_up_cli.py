"""`pai up` as a user runs it, in a terminal, from a config file: what a closed terminal does."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import msgspec
import pytest
import yaml

from tests.integration.conftest import platform_config

pytestmark = pytest.mark.integration

CONFIG_FIELDS = ("data_dir", "nats_url", "cluster_file", "grace_seconds", "container_engine",
                 "rest_port", "scheduler_port", "launcher_port", "runtime_port", "monitor_port")


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = (item.decode(errors="replace").partition("=") for item in f.read().split(b"\0") if item)
        return {name: value for name, _, value in pairs}


def _processes_of(data_dir: str) -> dict[int, str]:
    """Command lines of the live processes of the platform on `data_dir`, by pid:
    nats-server names it in its arguments, the services in their environment
    (PAI_DATA_DIR), the shims and tasks in their task key's paths."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().decode(errors="replace")
        except OSError:
            continue
        if (data_dir in cmdline or data_dir in environ) and int(pid) != os.getpid():
            found[int(pid)] = cmdline
    return found


async def test_a_closed_terminal_stops_pai_up_like_ctrl_c(tmp_path):
    config = platform_config(tmp_path / "pai")
    fields = msgspec.to_builtins(config)
    config_file = tmp_path / "up-config.yaml"
    # The server's GOMAXPROCS, which pai up otherwise chooses: set, so it can be seen passed on.
    config_file.write_text(yaml.safe_dump({name: fields[name] for name in CONFIG_FIELDS} | {"nats_embedded_max_procs": 3}))
    up = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli.main", "up", "--config", str(config_file),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env=os.environ | {"HOME": str(tmp_path), "COLUMNS": "200"},  # its saved context stays here
    )
    assert up.stdout is not None
    said: list[str] = []
    try:
        while not any("press Ctrl-C to stop" in line for line in said):
            line = await asyncio.wait_for(up.stdout.readline(), timeout=90)
            assert line, f"pai up ended before it was up: {''.join(said)}"
            said.append(line.decode())
        platform = _processes_of(str(config.data_path))
        assert len(platform) >= 6  # nats-server and the five services
        nats = [pid for pid, cmdline in platform.items() if "nats-server" in cmdline.split(" ", 1)[0]]
        assert len(nats) == 1 and _environ(nats[0]).get("GOMAXPROCS") == "3"
        up.send_signal(signal.SIGHUP)  # what the terminal's closing sends
        rest, _ = await asyncio.wait_for(up.communicate(), timeout=60)
    finally:
        if up.returncode is None:
            up.kill()
            await up.wait()
    said.append(rest.decode())
    left = _processes_of(str(config.data_path))
    for pid in left:  # a failure here must not leave them running for the next tests
        os.kill(pid, signal.SIGKILL)
    assert up.returncode == 0, "".join(said)
    assert "PAI stopped" in "".join(said)
    assert left == {}
