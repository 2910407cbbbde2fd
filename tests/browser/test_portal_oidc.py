"""Signing in to the portal through the organisation's identity provider, in headless
Chromium: a platform started with OIDC configured (`pai up`'s Platform) against the
provider process of tests/fixtures/oidc_provider.py; the user clicks "Sign in with
Corp directory", signs in at the provider, lands back on the portal signed in, in the
VC their directory group grants."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.conftest import Rest, _why_not, shot
from tests.integration.conftest import free_port, platform_config

expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: `make test` installs the "
                             "test extra (pip install -e '.[test]')").expect

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]
GROUPS = """
grouplist:
  - groupname: researchers
    externalName: sg-research
    extension:
      acls:
        virtualClusters: [research]
"""


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    why = _why_not()
    if why:
        pytest.skip(why)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.fixtures.oidc_provider", str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/.well-known/openid-configuration", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the OIDC provider process did not start") from None
                time.sleep(0.1)
        request = urllib.request.Request(f"{url}/users/nora", method="PUT", headers={"Content-Type": "application/json"},
                                         data=json.dumps({"email": "nora@corp.example",
                                                          "groups": ["sg-research"]}).encode())
        urllib.request.urlopen(request, timeout=5).close()
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def platform(provider):
    """This module's platform (it overrides conftest's): OIDC on, passwords off."""
    from cli.up import Platform

    data = Path(tempfile.mkdtemp(prefix="pai-browser-oidc-"))
    (data / "groups.yaml").write_text(GROUPS)
    (data / "client-secret").write_text("browser-test-secret\n")
    plat = Platform(platform_config(data, oidc_issuer=provider, oidc_client_id="pai-portal",
                                    oidc_client_secret_file=str(data / "client-secret"),
                                    oidc_group_config_file=str(data / "groups.yaml"),
                                    oidc_provider_name="Corp directory", basic_auth=False),
                    print_fn=lambda *_: None)
    try:
        conn = plat.start()
        yield plat, Rest(conn.url, conn.token)
    finally:
        try:
            from tests.chaos.harness import _stop_quickly
            _stop_quickly(plat)
        finally:
            for proc in plat.procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            if plat.nats is not None:
                plat.nats.stop(kill=True)
            shutil.rmtree(data, ignore_errors=True)


def test_a_user_signs_in_to_the_portal_through_the_provider_and_lands_in_their_vc(browser, platform):
    rest: Rest = platform[1]
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(20_000)
    tab = context.new_page()
    try:
        tab.goto(rest.url + "/")
        expect(tab.get_by_label("Password", exact=True)).to_have_count(0)  # basic_auth: false
        shot(tab, "oidc-01-login")
        tab.get_by_role("link", name="Sign in with Corp directory").click()
        tab.wait_for_url(f"{platform[0].config.oidc_issuer}/oauth2/authorize?*")  # at the provider
        tab.get_by_placeholder("sub").fill("nora")
        tab.get_by_role("button", name="Authorize").click()
        tab.wait_for_selector("#page-title:has-text('Cluster at a glance')")
        expect(tab.locator("#who-name")).to_have_text("nora")
        expect(tab.locator("#who-vcs")).to_have_text("VCs: research")
        assert "token=" not in tab.url  # taken out of the address bar
        shot(tab, "oidc-02-signed-in")
        me = tab.evaluate("""async () => {
            const token = sessionStorage.getItem('pai.token');
            const r = await fetch('/api/v2/users/me', {headers: {Authorization: `Bearer ${token}`}});
            return r.json(); }""")
        assert me["username"] == "nora" and me["grouplist"] == ["researchers"] and me["virtualCluster"] == ["research"]
    finally:
        context.close()
