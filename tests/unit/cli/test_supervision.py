"""`pai up`'s supervisor (cli/up.py, Platform.restart_what_died): a service that ends
by itself is started again; one taken down on purpose (Platform.kill_service, as a
test or an operator's drill does) stays down until it is started again by hand, and
is then not started twice. The services are stand-in processes here: what is under
test is the supervisor's choice, not a service's start."""

from __future__ import annotations

import subprocess

import pytest

from cli import up
from cli.up import Platform
from libs.common.config import load_config


@pytest.fixture
def platform(tmp_path, monkeypatch):
    plat = Platform(load_config(env={}, data_dir=str(tmp_path)), print_fn=lambda *_: None)
    started: list[str] = []

    def start_process(name: str) -> subprocess.Popen:
        started.append(name)
        return subprocess.Popen(["sleep", "60"])

    monkeypatch.setattr(plat, "_start_process", start_process)
    monkeypatch.setattr(plat, "_wait_ready", lambda name: None)
    monkeypatch.setattr(up, "RESTART_BACKOFF_SECONDS", 0.0)
    for name in ("scheduler", "launcher"):
        plat._spawn(name)
    started.clear()
    yield plat, started
    for proc in plat.procs.values():
        proc.kill()
        proc.wait()


def test_a_service_that_ends_is_started_again(platform):
    plat, started = platform
    plat.procs["scheduler"].kill()  # as a lease lost ends its holder
    plat.procs["scheduler"].wait()
    assert plat.restart_what_died() == ["scheduler"]
    assert started == ["scheduler"] and plat.procs["scheduler"].poll() is None
    assert plat.restart_what_died() == []


def test_a_service_killed_on_purpose_stays_down_until_started_and_runs_once(platform):
    plat, started = platform
    plat.kill_service("launcher")
    assert plat.restart_what_died() == [] and plat.restart_what_died() == []
    assert plat.procs["launcher"].poll() is not None  # still down
    plat.start_service("launcher")
    assert plat.restart_what_died() == []
    assert started == ["launcher"]  # by start_service alone
    plat.procs["launcher"].kill()  # started again, it is supervised again
    plat.procs["launcher"].wait()
    assert plat.restart_what_died() == ["launcher"]


def test_nothing_is_started_once_the_platform_is_stopping(platform):
    plat, started = platform
    plat.procs["scheduler"].kill()
    plat.procs["scheduler"].wait()
    plat.request_stop()
    assert plat.restart_what_died() == [] and started == []
