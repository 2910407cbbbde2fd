"""OpenPAI's OIDC sign-in routes, the shell around identity/oidc.py's pure checks:

    GET  /api/v2/authn/info           which sign-ins this PAI offers (OpenPAI's shape, PAI's fields beside it)
    GET  /api/v2/authn/oidc/login     to the provider (authorization code flow with PKCE)
    GET  /api/v2/authn/oidc/return    back from it (POST too: OpenPAI's form_post); signs the user in
                                      and lands on the portal with PAI's token, as OpenPAI does
    GET  /api/v2/authn/oidc/logout    to the provider's end-session endpoint, then the portal

The provider's discovery document and keys are fetched over HTTP and kept for a while;
the keys again at once when a token names one not seen yet (the provider rotated them).
Users, groups and tokens are made and changed through identity/store.py, as a password
sign-in does.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import secrets
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
import msgspec
import yaml
from aiohttp import web

from libs.common.errors import BadInput, ConflictGroup, ConflictUser, NotFound, PaiError, Transient, Unauthorized
from libs.common.service import ServiceContext
from services.rest import auth, quotas
from services.rest.identity import core, oidc, store
from services.rest.identity.oidc import OidcSettings
from services.rest.records import Group, GroupExtension, TokenKind, User
from services.rest.request import ctx_of

log = logging.getLogger("pai.rest.oidc")

DISCOVERY_SECONDS = 3600.0  # the discovery document and keys are fetched again after this
KEYS_REFETCH_SECONDS = 10.0  # at most this often on an unknown key (a flood of forged tokens costs the provider little)
PROVIDER_TIMEOUT_SECONDS = 10.0
MAX_PROVIDER_BYTES = 1024 * 1024


class ProviderUnavailable(Transient):
    code = "ServiceUnavailable"


class Provider:
    """This process's view of the identity provider: settings, discovery and keys, an HTTP client."""

    def __init__(self, settings: OidcSettings) -> None:
        self.settings = settings
        # A public client has no secret to derive the cookie's key from: this process's own
        # (a sign-in must then come back to the replica that started it).
        self.flow_key = oidc.flow_key(settings.client_secret, secrets.token_bytes(32))
        self.session: aiohttp.ClientSession | None = None
        self._discovery: tuple[float, dict[str, Any]] | None = None
        self._keys: tuple[float, dict[str, Any]] | None = None
        self._lock = asyncio.Lock()

    async def _get_json(self, url: str, what: str, *, headers: dict[str, str] | None = None) -> dict[str, Any]:
        assert self.session is not None
        try:
            async with self.session.get(url, headers=headers) as resp:
                body = await resp.content.read(MAX_PROVIDER_BYTES + 1)
                if resp.status != 200:
                    raise ProviderUnavailable(f"the identity provider's {what} ({url}) answered HTTP {resp.status}; "
                                              "try again later")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProviderUnavailable(f"the identity provider's {what} ({url}) did not answer "
                                      f"({type(exc).__name__}); try again later") from None
        try:
            doc = msgspec.json.decode(body[:MAX_PROVIDER_BYTES])
        except msgspec.DecodeError:
            raise ProviderUnavailable(f"the identity provider's {what} ({url}) is not JSON") from None
        if not isinstance(doc, dict):
            raise ProviderUnavailable(f"the identity provider's {what} ({url}) is not a JSON object")
        return doc

    async def discovery(self) -> dict[str, Any]:
        now = time.monotonic()
        if self._discovery is not None and now - self._discovery[0] < DISCOVERY_SECONDS:
            return self._discovery[1]
        async with self._lock:
            url = f"{self.settings.issuer}/.well-known/openid-configuration"
            doc = await self._get_json(url, "discovery document")
            if str(doc.get("issuer", "")).rstrip("/") != self.settings.issuer:
                # OpenID Connect Discovery 1.0, 4.3: the document must name the issuer it was fetched for.
                raise ProviderUnavailable(f"the discovery document at {url} names issuer {doc.get('issuer')!r}, "
                                          f"not {self.settings.issuer} (oidc_issuer)")
            for field in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                if not isinstance(doc.get(field), str):
                    raise ProviderUnavailable(f"the discovery document at {url} has no {field}")
            self._discovery = (now, doc)
            return doc

    async def keys(self, *, again: bool = False) -> dict[str, Any]:
        now = time.monotonic()
        if self._keys is not None and (now - self._keys[0] < (KEYS_REFETCH_SECONDS if again else DISCOVERY_SECONDS)):
            return self._keys[1]
        doc = await self.discovery()
        keys = await self._get_json(doc["jwks_uri"], "key set (jwks_uri)")
        self._keys = (now, keys)
        return keys

    async def exchange(self, code: str, verifier: str, redirect_uri: str) -> dict[str, Any]:
        """The code's tokens from the token endpoint (RFC 6749 4.1.3, with PKCE's code_verifier)."""
        assert self.session is not None
        doc = await self.discovery()
        s = self.settings
        data = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
                "code_verifier": verifier, "client_id": s.client_id}
        headers = {"Accept": "application/json"}
        methods = doc.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        if s.client_secret and "client_secret_basic" in methods:
            # RFC 6749 2.3.1: id and secret form-encoded, then joined for HTTP Basic.
            pair = f"{quote(s.client_id, safe='')}:{quote(s.client_secret, safe='')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        elif s.client_secret:
            data["client_secret"] = s.client_secret
        url = doc["token_endpoint"]
        try:
            async with self.session.post(url, data=data, headers=headers) as resp:
                raw = await resp.content.read(MAX_PROVIDER_BYTES)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ProviderUnavailable(f"the identity provider's token endpoint ({url}) did not answer "
                                      f"({type(exc).__name__}); try again") from None
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        if status != 200:
            if status in (400, 401) and "error" in body:
                raise Unauthorized(f"the identity provider refused the sign-in's code: {body.get('error')}"
                                   f"{': ' + str(body.get('error_description'))[:200] if body.get('error_description') else ''}"
                                   f"; start again at {oidc.LOGIN_PATH}")
            raise ProviderUnavailable(f"the identity provider's token endpoint ({url}) answered HTTP {status}")
        if not isinstance(body.get("id_token"), str):
            raise Unauthorized("the identity provider answered the code without an id_token (is 'openid' "
                               "among the client's scopes at the provider?)")
        return body

    async def id_claims(self, id_token: str, nonce: str) -> dict[str, Any]:
        doc = await self.discovery()
        offered = doc.get("id_token_signing_alg_values_supported") or ["RS256"]
        algorithms = tuple(a for a in oidc.SIGNING_ALGORITHMS if a in offered) or ("RS256",)
        try:
            return oidc.check_id_token(id_token, await self.keys(), self.settings, nonce, time.time(), algorithms)
        except Unauthorized as first:
            if "signature" not in first.message:
                raise
        # Signed with a key not in the set we hold: the provider may have rotated its keys.
        return oidc.check_id_token(id_token, await self.keys(again=True), self.settings, nonce, time.time(),
                                   algorithms)

    async def userinfo(self, access_token: str) -> dict[str, Any]:
        doc = await self.discovery()
        url = doc.get("userinfo_endpoint")
        if not isinstance(url, str) or not access_token:
            return {}
        return await self._get_json(url, "userinfo endpoint", headers={"Authorization": f"Bearer {access_token}"})


OIDC = web.AppKey("oidc_provider", Provider)


def _provider(request: web.Request) -> Provider:
    provider = request.app.get(OIDC)
    if provider is None:
        raise NotFound("sign-in through an identity provider (OIDC) is not configured on this PAI "
                       f"(oidc_issuer); sign in with POST {oidc.BASIC_LOGIN_PATH}")
    return provider


def _redirect(location: str) -> web.Response:
    # A plain 302 returned (not aiohttp's HTTPFound raised): the request middleware counts it like any answer.
    return web.Response(status=302, headers={"Location": location})


def _origin(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


def _redirect_uri(request: web.Request, settings: OidcSettings) -> str:
    return settings.redirect_url or _origin(request) + oidc.RETURN_PATH


def _own_origins(request: web.Request, settings: OidcSettings) -> tuple[str, ...]:
    found = [_origin(request)]
    for url in (settings.portal_url, settings.redirect_url):
        if url:
            parts = urlsplit(url)
            found.append(f"{parts.scheme}://{parts.netloc}")
    return tuple(dict.fromkeys(found))


def _portal(request: web.Request, settings: OidcSettings) -> str:
    return (settings.portal_url or _origin(request)) + "/"


async def authn_info(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    provider = request.app.get(OIDC)
    return web.json_response(oidc.authn_info(ctx.config, provider.settings if provider else None))


async def login(request: web.Request) -> web.Response:
    provider = _provider(request)
    s = provider.settings
    redirect = oidc.safe_redirect(request.query.get("redirect_uri"), _own_origins(request, s), _portal(request, s))
    flow = oidc.new_flow(redirect, request.query.get("from", ""), time.time())
    doc = await provider.discovery()
    response = _redirect(oidc.authorization_url(doc["authorization_endpoint"], s, _redirect_uri(request, s), flow))
    response.set_cookie(oidc.COOKIE, oidc.seal(flow, provider.flow_key), max_age=oidc.FLOW_SECONDS,
                        path=oidc.COOKIE_PATH, httponly=True, samesite="Lax", secure=request.secure)
    return response


async def oidc_return(request: web.Request) -> web.Response:
    """The provider's answer; a browser is sent to the portal's sign-in page with the
    reason when it fails, an API client gets the error as JSON."""
    try:
        return await _finish_sign_in(request)
    except PaiError as exc:
        if "text/html" not in request.headers.get("Accept", ""):
            raise
        log.info("OIDC sign-in refused: %s", exc.message)
        provider = request.app.get(OIDC)
        portal = _portal(request, provider.settings) if provider else "/"
        return _redirect(f"{portal}#/login?{urlencode({'error': exc.message})}")


async def _finish_sign_in(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    provider = _provider(request)
    s = provider.settings
    params = request.query if request.method == "GET" else await request.post()
    if "error" in params:
        described = str(params.get("error_description", ""))[:200]
        raise Unauthorized(f"the identity provider did not sign you in: {str(params['error'])[:64]}"
                           f"{': ' + described if described else ''}")
    code = params.get("code")
    if not isinstance(code, str) or not code:
        raise BadInput("code: the provider's answer has no authorization code "
                       f"(this is the provider's callback; start at {oidc.LOGIN_PATH})")
    state = params.get("state")
    flow = oidc.open_flow(request.cookies.get(oidc.COOKIE), state if isinstance(state, str) else "",
                          provider.flow_key, time.time())
    tokens = await provider.exchange(code, flow.verifier, _redirect_uri(request, s))
    claims = await provider.id_claims(tokens["id_token"], flow.nonce)
    if s.groups_claim not in claims:  # some providers send groups only from userinfo
        info = await provider.userinfo(str(tokens.get("access_token", "")))
        if info.get("sub") == claims["sub"] and s.groups_claim in info:  # Core 1.0, 5.3.2: the same subject
            claims[s.groups_claim] = info[s.groups_claim]
    user = await _signed_in_user(ctx, s, claims)
    request.app[auth.PRINCIPALS].clear()  # their groups may have changed: this replica's cache forgets at once
    expires = core.token_expiry(TokenKind.LOGIN, time.time(), _policy(ctx))
    held = await store.room_for_one_more_token(ctx.bus, user.username, ctx.config.rest_user_max_tokens, time.time(),
                                               end_sign_ins=True)
    quotas.check_tokens(ctx.config, user.username, held)
    token = await store.issue_token(ctx.bus, user.username, TokenKind.LOGIN, expires_at=expires,
                                    description=f"sign-in through {s.provider_name}")
    admin = core.resolve(user, await store.groups_named(ctx.bus, user.grouplist)).admin
    log.info("OIDC sign-in of %s (%s), groups %s", user.username, oidc.encode_claims_for_log(claims), user.grouplist)
    response = _redirect(oidc.landing_url(flow, user.username, token, admin))
    response.del_cookie(oidc.COOKIE, path=oidc.COOKIE_PATH)
    return response


def _policy(ctx: ServiceContext) -> core.TokenPolicy:
    c = ctx.config
    return core.TokenPolicy(login_seconds=c.rest_login_token_seconds,
                            application_seconds=c.rest_application_token_seconds, max_seconds=c.rest_token_max_seconds)


async def _signed_in_user(ctx: ServiceContext, s: OidcSettings, claims: dict[str, Any]) -> User:
    """The PAI user of the directory account: made at its first sign-in, its groups set
    from the directory's at every one."""
    username = oidc.username_from(claims, s.username_claim)
    subject = str(claims["sub"])
    directory = oidc.directory_groups(claims, s.groups_claim)
    email = claims.get("email") if isinstance(claims.get("email"), str) else ""
    groups = {**core.BUILTIN_GROUPS, **{g.groupname: g for g in await store.all_groups(ctx.bus)}}
    for _ in range(2):
        got = await store.find_user(ctx.bus, username)
        if got is None:
            grouplist = oidc.grouplist_from_directory([], directory, groups)
            if not grouplist:
                raise oidc.no_groups(username, directory, s.groups_claim)
            user = User(username=username, email=str(email)[:254], grouplist=grouplist, createdAt=time.time(),
                        directorySubject=subject)
            try:
                await store.create_user(ctx.bus, user)
            except ConflictUser:
                continue  # made by a sign-in on another replica meanwhile: sign in to it
            log.info("created user %s at their first sign-in through %s", username, s.provider_name)
            return user
        existing = got[0]
        if existing.directorySubject != subject:
            raise oidc.name_taken(existing.username)

        def apply(u: User) -> User:
            return msgspec.structs.replace(u, grouplist=oidc.grouplist_from_directory(u.grouplist, directory, groups),
                                           email=str(email)[:254] or u.email)

        user = await store.change_user(ctx.bus, existing.username, apply)
        if not user.grouplist:  # every group revoked: stored (their tokens lose the VCs too), then refused
            raise oidc.no_groups(user.username, directory, s.groups_claim)
        return user
    raise ConflictUser(f"user {username} is being created by another sign-in; try again")


async def logout(request: web.Request) -> web.Response:
    """OpenPAI's: to the provider's end-session endpoint (RP-initiated logout), which sends
    the browser back to the portal; the portal revokes PAI's token first."""
    provider = _provider(request)
    s = provider.settings
    back = oidc.safe_redirect(request.query.get("redirect_uri"), _own_origins(request, s), _portal(request, s))
    if back.startswith("/"):
        back = (s.portal_url or _origin(request)) + back
    end = (await provider.discovery()).get("end_session_endpoint")
    if not isinstance(end, str):
        return _redirect(back)
    query = urlencode({"client_id": s.client_id, "post_logout_redirect_uri": back})
    return _redirect(f"{end}{'&' if '?' in end else '?'}{query}")


# --- wiring ----------------------------------------------------------------------------------------


def _client_secret(ctx: ServiceContext) -> str:
    path = ctx.config.oidc_client_secret_file
    if not path:
        return ""
    try:
        return Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise BadInput(f"oidc_client_secret_file: cannot read {path}: {exc.strerror}") from None


def setup(app: web.Application, ctx: ServiceContext) -> None:
    """The routes, and with oidc_issuer set the provider's client (its HTTP session opened
    and closed with the app). Wrong OIDC settings stop rest at start, naming the field."""
    settings = oidc.settings_from(ctx.config, _client_secret(ctx) if ctx.config.oidc_issuer else "")
    app.add_routes([
        web.get("/api/v2/authn/info", authn_info),
        web.get(oidc.LOGIN_PATH, login),
        web.get(oidc.RETURN_PATH, oidc_return),
        web.post(oidc.RETURN_PATH, oidc_return),
        web.get(oidc.LOGOUT_PATH, logout),
    ])
    if settings is None:
        return
    provider = Provider(settings)
    app[OIDC] = provider

    async def client(app: web.Application):
        provider.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=PROVIDER_TIMEOUT_SECONDS),
            headers={"User-Agent": "PAI rest (OIDC relying party)"})
        yield
        await provider.session.close()

    app.cleanup_ctx.append(client)
    log.info("sign-in through %s (%s) on; password sign-in %s", settings.provider_name, settings.issuer,
             "on" if ctx.config.basic_auth else "off")


async def seed_groups(ctx: ServiceContext) -> None:
    """OpenPAI's groupConfig from oidc_group_config_file: each group made if absent (an
    admin's later changes to its acls stay), its externalName set from the file."""
    path = ctx.config.oidc_group_config_file
    if not path:
        return
    try:
        raw = yaml.safe_load(Path(path).expanduser().read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BadInput(f"oidc_group_config_file {path}: {exc}") from None
    for wanted in oidc.parse_group_config(raw, f"oidc_group_config_file {path}"):
        core.check_groupname(wanted.groupname, f"oidc_group_config_file: {wanted.groupname}")
        try:
            extension = msgspec.convert(wanted.extension, GroupExtension)
        except msgspec.ValidationError as exc:
            raise BadInput(f"oidc_group_config_file {path}: {wanted.groupname}.extension: {exc}") from None
        if wanted.admin:
            extension = GroupExtension(acls=msgspec.structs.replace(extension.acls, admin=True))
        core.check_group_acls(extension.acls, f"{wanted.groupname}.extension.acls")
        group = Group(groupname=wanted.groupname, description=wanted.description,
                      externalName=wanted.externalName, extension=extension)
        try:
            await store.create_group(ctx.bus, group)
            log.info("created group %s (directory group %r) from %s", group.groupname, group.externalName, path)
        except ConflictGroup:
            await store.change_group(ctx.bus, group.groupname, functools.partial(_named, wanted.externalName))


def _named(external_name: str, group: Group) -> Group:
    return msgspec.structs.replace(group, externalName=external_name)
