"""The portal in headless Chromium (Debian's `chromium`, driven by Playwright; no
browser download): one whole platform for the tier, supervised as `pai up` does.

`make test` installs chromium (apt) and playwright (the test extra). Screenshots of
every page go to artifacts/screenshots/ (or $PAI_ARTIFACTS/screenshots) and are
listed at the end of the run.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cli.up import Platform
from libs.common.messages import JobState
from tests.integration.conftest import platform_config, supervised

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(os.environ.get("PAI_ARTIFACTS", ROOT / "artifacts")) / "screenshots"
PASSWORD = "portal-test-password"
# What the tier's platform said (the services its supervisor started again among it),
# for failure messages: a test that waited in vain says whether a service had died.
SUPERVISION: list[str] = []
SAVED: list[Path] = []
_STARTED = time.time()

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the test extra installs it
    sync_playwright = None


def _why_not() -> str | None:
    if sync_playwright is None:
        return "playwright is not installed: `make test` installs the test extra (pip install -e '.[test]')"
    if not CHROMIUM.exists():
        return ("/usr/bin/chromium is absent and could not be installed (`make test` runs "
                "tests/system-deps.sh browser: apt-get install chromium, as root or with sudo)")
    return None


@pytest.fixture(scope="module")
def browser(platform):
    # After the platform: Playwright's sync API keeps an event loop running in this
    # thread, and the platform starts and stops with asyncio.run.
    with sync_playwright() as pw:
        # --no-sandbox: the tier runs as root in CI containers, where Chromium's sandbox cannot start.
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                      args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield chromium
        chromium.close()


class Rest:
    """The platform's API, for setting the scene (users, jobs) around the browser."""

    def __init__(self, url: str, token: str):
        self.url = url
        self.token = token

    def call(self, method: str, path: str, body: Any = None, *, token: str | None = None,
             content_type: str = "application/json") -> Any:
        data = None
        headers = {"Authorization": f"Bearer {token or self.token}"}
        if body is not None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as res:
                raw = res.read()
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from None
        return json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()

    def status(self, path: str, *, token: str | None = None) -> int:
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {token or self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as res:
                return res.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def refusal(self, path: str, body: str, *, content_type: str = "text/yaml") -> dict:
        """The JSON body of a call that must be refused."""
        req = urllib.request.Request(self.url + path, data=body.encode(), method="POST",
                                     headers={"Authorization": f"Bearer {self.token}", "Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=30) as res:
                raise AssertionError(f"POST {path} was accepted: HTTP {res.status}")
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())

    def submit(self, yaml_text: str, *, token: str | None = None) -> str:
        return self.call("POST", "/api/v2/jobs", yaml_text, token=token, content_type="text/yaml")["job"]

    def state(self, job: str) -> str:
        return self.call("GET", f"/api/v2/jobs/{job}")["jobStatus"]["state"]

    def wait_state(self, job: str, states: set[str], timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            state = self.state(job)
            if state in states:
                return state
            time.sleep(0.2)
        raise AssertionError(f"{job} did not reach {states} in {timeout:.0f}s; it is {state}")


# One platform serves every module of the tier that does not start its own (the OIDC
# module does): a start costs about 10 s on two cores. Modules run one after another
# (the local-task group), each leaving no live job behind (stop_live_jobs) and making
# its own users where it changes them.
@pytest.fixture(scope="session")
def platform():
    why = _why_not()
    if why:
        pytest.skip(why)
    data = Path(tempfile.mkdtemp(prefix="pai-browser-"))
    plat = Platform(platform_config(data), print_fn=SUPERVISION.append)
    try:
        conn = plat.start()
        with supervised(plat):
            yield plat, Rest(conn.url, conn.token)
    finally:
        try:
            from tests.chaos.harness import _stop_quickly  # services idle in NATS drain are killed, not awaited
            _stop_quickly(plat)
        finally:  # whatever failed above (a start cut short, a stop that raised), nothing outlives the module
            for proc in plat.procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            if plat.nats is not None:
                plat.nats.stop(kill=True)
            shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def rest(platform) -> Rest:
    rest = platform[1]
    yield rest
    stop_live_jobs(rest)


FINAL_STATES = {state.value for state in JobState if state.is_final}


def stop_live_jobs(rest: Rest, timeout: float = 60.0) -> None:
    """Stop every job a module left waiting or running, and wait for them to end, so
    the next module's jobs find the cluster free."""
    live = [f"{job['username']}~{job['name']}" for job in rest.call("GET", "/api/v2/jobs?limit=1000")
            if job["state"] not in FINAL_STATES]
    for job in live:
        rest.call("PUT", f"/api/v2/jobs/{job}/executionType", {"value": "STOP"})
    for job in live:
        rest.wait_state(job, FINAL_STATES, timeout)


@pytest.fixture(scope="session")
def users(platform) -> dict[str, str]:
    """Two researchers with passwords (alice, bob); the admin signs in with the platform token."""
    rest = platform[1]
    for name in ("alice", "bob"):
        rest.call("POST", "/api/v2/users", {"username": name, "password": PASSWORD})
    return {name: rest.call("POST", "/api/v2/authn/basic/login", {"username": name, "password": PASSWORD})["token"]
            for name in ("alice", "bob")}


def shot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    SAVED.append(path)
    return path


def pytest_terminal_summary(terminalreporter):
    # Those of this run, found on disk: with workers (pytest-xdist, as `make test` runs),
    # the screenshots were taken in a worker, and SAVED of this process is empty.
    saved = SAVED or sorted(p for p in SCREENSHOTS.glob("*.png") if p.stat().st_mtime >= _STARTED)
    if saved:
        terminalreporter.write_line(f"portal screenshots ({len(saved)}) in {SCREENSHOTS}:")
        for path in saved:
            terminalreporter.write_line(f"  {path}")
