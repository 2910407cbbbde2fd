"""Sign-in through an OpenID Connect provider: rest (logged in to a real nats-server as
`rest`) against a provider process the test starts (tests/fixtures/oidc_provider.py:
PyPI's oidc-provider-mock with PKCE required), over real HTTP, the browser's part played
by an aiohttp client that keeps cookies and follows each redirect by hand."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import msgspec
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from libs.common.bus import Bus
from libs.common.config import load_config
from libs.common.schedule import CLUSTER_VCS_KEY, ClusterView
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket
from services.rest.app import create_app, startup
from tests.fixtures.settings import IN_PROCESS_ENV

RUN = uuid.uuid4().hex[:6]
ADMIN = f"oidcadmin{RUN}"
VISION_GROUP = f"vision{RUN}"
GROUP_CONFIG = f"""
group-manager:
  default-group:
    groupname: default
    externalName: sg-everyone-{RUN}
  admin-group:
    groupname: admin
    externalName: sg-pai-admins-{RUN}
  grouplist:
    - groupname: {VISION_GROUP}
      description: the vision team
      externalName: sg-vision-{RUN}
      extension:
        acls:
          virtualClusters: [vision]
"""
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.fixtures.oidc_provider", str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError("the OIDC provider process exited at start") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


class Site:
    """rest and the provider, and a browser's way through them."""

    def __init__(self, server: TestServer, provider: str, api: ClientSession, ctx: ServiceContext) -> None:
        self.server, self.provider, self.api, self.ctx = server, provider, api, ctx

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    async def call(self, token: str | None, method: str, path: str, body: Any = None,
                   content_type: str = "application/json") -> tuple[int, Any]:
        headers = {"Content-Type": content_type, **({"Authorization": f"Bearer {token}"} if token else {})}
        data = body if isinstance(body, (str, bytes)) or body is None else json.dumps(body)
        async with self.api.request(method, self.url(path), data=data, headers=headers) as resp:
            raw = await resp.read()
            try:
                return resp.status, json.loads(raw)
            except ValueError:
                return resp.status, raw.decode(errors="replace")

    async def directory_user(self, sub: str, email: str, groups: list[str]) -> None:
        async with self.api.put(f"{self.provider}/users/{sub}", json={"email": email, "groups": groups}) as resp:
            assert resp.status == 204

    async def misbehave(self, **overrides: Any) -> None:
        async with self.api.put(f"{self.provider}/test/id-token", json=overrides) as resp:
            assert resp.status == 204

    @staticmethod
    def browser() -> ClientSession:
        return ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))  # cookies for 127.0.0.1 too

    async def start(self, browser: ClientSession, query: str = "") -> str:
        """PAI's login: the provider's authorization URL it sends the browser to."""
        async with browser.get(self.url(f"/api/v2/authn/oidc/login{query}"), allow_redirects=False) as resp:
            assert resp.status == 302, await resp.text()
            return resp.headers["Location"]

    async def authorize(self, browser: ClientSession, authorization_url: str, sub: str) -> str:
        """The user signs in at the provider: where it sends the browser back to."""
        assert authorization_url.startswith(self.provider)
        async with browser.post(authorization_url, data={"sub": sub}, allow_redirects=False) as resp:
            assert resp.status == 302, await resp.text()
            return resp.headers["Location"]

    async def back(self, browser: ClientSession, return_url: str, *, accept: str = "*/*") -> aiohttp.ClientResponse:
        resp = await browser.get(return_url, allow_redirects=False, headers={"Accept": accept})
        await resp.read()
        return resp

    async def sign_in(self, sub: str) -> aiohttp.ClientResponse:
        async with self.browser() as browser:
            return await self.back(browser, await self.authorize(browser, await self.start(browser), sub))

    async def signed_in(self, sub: str) -> dict[str, str]:
        resp = await self.sign_in(sub)
        assert resp.status == 302, await resp.text()
        landing = urlsplit(resp.headers["Location"])
        assert f"{landing.scheme}://{landing.netloc}" == self.url("/").rstrip("/") and landing.path == "/"
        return {k: v[0] for k, v in parse_qs(landing.query).items()}


@pytest.fixture(scope="module")
async def site(nats_server, provider, tmp_path_factory) -> AsyncIterator[Site]:
    tmp = tmp_path_factory.mktemp("oidc")
    (tmp / "client-secret").write_text("s3cret-of-the-client\n")
    (tmp / "groups.yaml").write_text(GROUP_CONFIG)
    platform = await Bus.connect(nats_server.url, name="oidc-platform", **nats_server.login("platform"))
    await platform.bootstrap()
    view = ClusterView(virtualClusters=[{"name": "default"}, {"name": "vision"}, {"name": "secret"}])
    await (await platform.kv(Bucket.CLUSTER)).put(CLUSTER_VCS_KEY, msgspec.json.encode(view))
    bus = await Bus.connect(nats_server.url, name="oidc-rest", **nats_server.login("rest"))
    config = load_config(env=dict(IN_PROCESS_ENV), data_dir=str(tmp), admin_user=ADMIN,
                         oidc_issuer=provider, oidc_client_id="pai-test",
                         oidc_client_secret_file=str(tmp / "client-secret"),
                         oidc_group_config_file=str(tmp / "groups.yaml"), oidc_provider_name="Corp directory")
    ctx = ServiceContext(name="rest", config=config, bus=bus)
    await startup(ctx)
    server = TestServer(await create_app(ctx), host="127.0.0.1")
    await server.start_server()
    ctx.set_ready()
    async with ClientSession() as api:
        yield Site(server, provider, api, ctx)
    await server.close()
    await bus.close()
    await platform.close()


def admin_token(site: Site) -> str:
    return site.ctx.config.token_path.read_text().strip()


def job(name: str, vc: str) -> str:
    return (f"protocolVersion: 2\nname: {name}\ntype: job\ndefaults:\n  virtualCluster: {vc}\n"
            "taskRoles:\n  main:\n    instances: 1\n    commands:\n      - echo hi\n")


async def submit(site: Site, token: str, vc: str) -> tuple[int, Any]:
    return await site.call(token, "POST", "/api/v2/jobs", job(f"j{uuid.uuid4().hex[:8]}", vc), "text/yaml")


def unique(prefix: str) -> str:
    return f"{prefix}{RUN}{uuid.uuid4().hex[:4]}"


# --- signing in -----------------------------------------------------------------------------------


async def test_authn_info_says_oidc_is_configured(site):
    status, info = await site.call(None, "GET", "/api/v2/authn/info")
    assert status == 200
    assert info["authn_type"] == "OIDC" and info["loginURI"] == "/api/v2/authn/oidc/login"
    assert info["loginURIMethod"] == "get" and info["basicAuth"] is True
    assert info["oidc"]["provider"] == "Corp directory" and info["oidc"]["issuer"] == site.provider


async def test_login_sends_the_browser_to_the_provider_with_pkce_state_and_nonce(site):
    async with site.browser() as browser:
        url = await site.start(browser)
        query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
        assert url.startswith(f"{site.provider}/oauth2/authorize?")
        assert query["response_type"] == "code" and query["client_id"] == "pai-test"
        assert query["code_challenge_method"] == "S256" and len(query["code_challenge"]) == 43
        assert query["state"] and query["nonce"] and query["redirect_uri"] == site.url("/api/v2/authn/oidc/return")
        cookie = browser.cookie_jar.filter_cookies(site.server.make_url("/api/v2/authn/oidc/return"))["pai_oidc_flow"]
        # The verifier, nonce and state travel sealed: none of them readable in the cookie.
        assert query["state"] not in cookie.value and query["nonce"] not in cookie.value


async def test_first_sign_in_creates_the_user_in_the_vcs_their_directory_groups_grant(site):
    sub = unique("dana")
    await site.directory_user(sub, f"{sub}.lee@corp.example", [f"sg-vision-{RUN}", f"sg-everyone-{RUN}", "sg-unmapped"])
    landed = await site.signed_in(sub)
    name = f"{sub}_lee"  # OpenPAI's: the email before its '@' ('.' is no name character in PAI)
    assert landed["user"] == name and landed["admin"] == "false"

    status, me = await site.call(landed["token"], "GET", "/api/v2/users/me")
    assert status == 200 and me["username"] == name and me["email"] == f"{sub}.lee@corp.example"
    assert sorted(me["grouplist"]) == sorted(["default", VISION_GROUP]) and me["virtualCluster"] == ["default", "vision"]
    assert me["hasPassword"] is False
    status, body = await submit(site, landed["token"], "vision")
    assert status == 202, body
    status, body = await submit(site, landed["token"], "secret")
    assert (status, body["code"]) == (403, "ForbiddenUserError") and "secret" in body["message"]

    # A second sign-in is the same user, not a new one.
    again = await site.signed_in(sub)
    assert again["user"] == name and again["token"] != landed["token"]
    status, users = await site.call(admin_token(site), "GET", "/api/v2/users")
    assert [u["username"] for u in users].count(name) == 1


async def test_a_group_revoked_in_the_directory_drops_the_pai_group_and_its_vc_at_the_next_sign_in(site):
    sub = unique("erin")
    await site.directory_user(sub, f"{sub}@corp.example", [f"sg-vision-{RUN}", f"sg-everyone-{RUN}"])
    first = await site.signed_in(sub)
    assert (await submit(site, first["token"], "vision"))[0] == 202
    # A group PAI's admins gave by hand (no externalName) is PAI's own and stays.
    manual = unique("manual")
    status, _ = await site.call(admin_token(site), "POST", "/api/v2/groups", {"groupname": manual})
    assert status == 201
    status, _ = await site.call(admin_token(site), "PUT", f"/api/v2/users/{sub}",
                                {"grouplist": ["default", VISION_GROUP, manual]})
    assert status == 200

    await site.directory_user(sub, f"{sub}@corp.example", [f"sg-everyone-{RUN}"])  # taken out of sg-vision
    second = await site.signed_in(sub)
    status, me = await site.call(second["token"], "GET", "/api/v2/users/me")
    assert sorted(me["grouplist"]) == sorted(["default", manual]) and me["virtualCluster"] == ["default"]
    for token in (second["token"], first["token"]):  # the groups are the user's: the older token lost the VC too
        status, body = await submit(site, token, "vision")
        assert (status, body["code"]) == (403, "ForbiddenUserError") and "vision" in body["message"]
    assert (await submit(site, second["token"], "default"))[0] == 202


async def test_a_user_in_no_mapped_group_is_refused_and_loses_what_they_had(site):
    sub = unique("fred")
    await site.directory_user(sub, f"{sub}@corp.example", [f"sg-vision-{RUN}"])
    first = await site.signed_in(sub)
    await site.directory_user(sub, f"{sub}@corp.example", ["sg-unmapped"])
    resp = await site.sign_in(sub)
    body = json.loads(await resp.text())
    assert (resp.status, body["code"]) == (403, "ForbiddenUserError")
    assert "not in configured groups" in body["message"] and "sg-unmapped" in body["message"]
    status, body = await submit(site, first["token"], "vision")
    assert status == 403

    never = unique("gina")
    await site.directory_user(never, f"{never}@corp.example", [])
    resp = await site.sign_in(never)
    assert resp.status == 403
    status, body = await site.call(admin_token(site), "GET", f"/api/v2/users/{never}")
    assert (status, body["code"]) == (404, "NoUserError")  # nobody made for a refused first sign-in


async def test_the_admin_group_mapped_from_the_directory_makes_an_admin(site):
    sub = unique("hana")
    await site.directory_user(sub, f"{sub}@corp.example", [f"sg-pai-admins-{RUN}"])
    landed = await site.signed_in(sub)
    assert landed["admin"] == "true"
    status, users = await site.call(landed["token"], "GET", "/api/v2/users")
    assert status == 200


async def test_a_directory_account_cannot_take_over_a_pai_user_of_the_same_name(site):
    name = await _local_user(site)
    await site.directory_user(f"other-{name}", f"{name}@corp.example", [f"sg-everyone-{RUN}"])
    resp = await site.sign_in(f"other-{name}")
    body = json.loads(await resp.text())
    assert (resp.status, body["code"]) == (403, "ForbiddenUserError") and "already exists" in body["message"]


async def _local_user(site: Site) -> str:
    name = unique("local")
    status, body = await site.call(admin_token(site), "POST", "/api/v2/users",
                                   {"username": name, "password": "correct horse battery"})
    assert status == 201, body
    return name


# --- what is refused -------------------------------------------------------------------------------


async def test_an_answer_for_another_sign_in_is_refused_state_mismatch(site):
    sub = unique("ivan")
    await site.directory_user(sub, f"{sub}@corp.example", [f"sg-everyone-{RUN}"])
    async with site.browser() as browser:
        first = await site.start(browser)
        await site.start(browser)  # another sign-in since (another tab): the cookie is its now
        resp = await site.back(browser, await site.authorize(browser, first, sub))
        body = json.loads(await resp.text())
        assert (resp.status, body["code"]) == (401, "UnauthorizedUserError") and "state mismatch" in body["message"]
    # A code delivered to a browser that started no sign-in (login CSRF) is refused too.
    async with site.browser() as attacker, site.browser() as victim:
        back = await site.authorize(attacker, await site.start(attacker), sub)
        resp = await site.back(victim, back)
        body = json.loads(await resp.text())
        assert resp.status == 401 and "no sign-in under way in this browser" in body["message"]


@pytest.mark.parametrize(("overrides", "says"), [
    ({"nonce": "forged"}, "nonce"),
    ({"exp_in": -600}, "expired"),
    ({"foreign_key": True}, "signature"),
    ({"aud": "another-client"}, "aud"),
    ({"iss": "https://impostor.example"}, "iss"),
])
async def test_a_bad_id_token_is_refused_naming_the_check(site, overrides, says):
    sub = unique("judy")
    await site.directory_user(sub, f"{sub}@corp.example", [f"sg-everyone-{RUN}"])
    await site.misbehave(**overrides)
    try:
        resp = await site.sign_in(sub)
    finally:
        await site.misbehave()
    body = json.loads(await resp.text())
    assert (resp.status, body["code"]) == (401, "UnauthorizedUserError"), body
    assert body["message"].startswith("id_token") and says in body["message"]
    status, body = await site.call(admin_token(site), "GET", f"/api/v2/users/{sub}")
    assert status == 404  # nobody signed in, nobody made


async def test_a_browser_sees_a_refusal_on_the_portals_sign_in_page(site):
    sub = unique("kim")
    await site.directory_user(sub, f"{sub}@corp.example", [f"sg-everyone-{RUN}"])
    await site.misbehave(nonce="forged")
    try:
        async with site.browser() as browser:
            back = await site.authorize(browser, await site.start(browser), sub)
            resp = await site.back(browser, back, accept="text/html,application/xhtml+xml")
    finally:
        await site.misbehave()
    assert resp.status == 302
    landing = urlsplit(resp.headers["Location"])
    assert landing.path == "/" and landing.fragment.startswith("/login?")
    assert "nonce" in parse_qs(landing.fragment.partition("?")[2])["error"][0]


async def test_the_provider_refusing_the_sign_in_is_told(site):
    async with site.browser() as browser:
        url = await site.start(browser)
        async with browser.post(url, data={"action": "deny"}, allow_redirects=False) as resp:
            back = resp.headers["Location"]
        resp = await site.back(browser, back)
        body = json.loads(await resp.text())
        assert resp.status == 401 and "access_denied" in body["message"]


async def test_login_lands_only_on_pai_itself(site):
    async with site.browser() as browser:
        async with browser.get(site.url("/api/v2/authn/oidc/login?redirect_uri=https://evil.example/steal"),
                               allow_redirects=False) as resp:
            body = await resp.json()
        assert (resp.status, body["code"]) == (400, "InvalidParametersError") and "redirect_uri" in body["message"]
    sub = unique("lena")
    await site.directory_user(sub, f"{sub}@corp.example", [f"sg-everyone-{RUN}"])
    async with site.browser() as browser:
        url = await site.start(browser, "?redirect_uri=/%23/jobs&from=jobs")
        resp = await site.back(browser, await site.authorize(browser, url, sub))
        landing = urlsplit(resp.headers["Location"])
        assert landing.path == "/" and landing.fragment == "/jobs" and parse_qs(landing.query)["from"] == ["jobs"]


async def test_logout_goes_to_the_providers_end_session_and_back_to_the_portal(site):
    async with site.api.get(site.url("/api/v2/authn/oidc/logout"), allow_redirects=False) as resp:
        assert resp.status == 302
        where = urlsplit(resp.headers["Location"])
    assert f"{where.scheme}://{where.netloc}{where.path}" == f"{site.provider}/oauth2/end_session"
    assert parse_qs(where.query)["post_logout_redirect_uri"] == [site.url("/")]


# --- basic auth off --------------------------------------------------------------------------------


async def test_basic_auth_turned_off_refuses_passwords_and_says_so(site):
    name = await _local_user(site)
    before = site.ctx.config
    site.ctx.config = msgspec.structs.replace(before, basic_auth=False)
    try:
        status, body = await site.call(None, "POST", "/api/v2/authn/basic/login",
                                       {"username": name, "password": "correct horse battery"})
        assert (status, body["code"]) == (403, "ForbiddenUserError")
        assert "basic_auth: false" in body["message"] and "Corp directory" in body["message"]
        status, info = await site.call(None, "GET", "/api/v2/authn/info")
        assert info["basicAuth"] is False and info["authn_type"] == "OIDC"
        sub = unique("mia")
        await site.directory_user(sub, f"{sub}@corp.example", [f"sg-everyone-{RUN}"])
        assert (await site.signed_in(sub))["user"] == sub  # the provider still signs people in
    finally:
        site.ctx.config = before
    status, _ = await site.call(None, "POST", "/api/v2/authn/basic/login",
                                {"username": name, "password": "correct horse battery"})
    assert status == 200


def test_basic_auth_is_read_from_the_environment():
    assert load_config(env={"PAI_BASIC_AUTH": "false"}).basic_auth is False
    assert load_config(env={}).basic_auth is True


async def test_the_provider_down_is_a_503_that_says_so(site, monkeypatch):
    from services.rest.identity import oidc_routes

    provider = site.server.app[oidc_routes.OIDC]
    monkeypatch.setattr(provider, "_discovery", None)  # fetched again, from a port nothing listens on
    broken = msgspec.structs.replace(provider.settings, issuer=f"http://127.0.0.1:{free_port()}")
    monkeypatch.setattr(provider, "settings", broken)
    async with site.browser() as browser:
        async with browser.get(site.url("/api/v2/authn/oidc/login"), allow_redirects=False) as resp:
            body = await resp.json()
    assert (resp.status, body["code"]) == (503, "ServiceUnavailable") and "did not answer" in body["message"]
