"""Sign-in through the organisation's identity provider (OpenID Connect), pure: the
settings, the browser's sign-in cookie, PKCE, the ID token's checks, who the token
names and which PAI groups the directory's groups grant. No I/O; the clock is passed in.
The HTTP side (discovery, JWKS, the code exchange, the routes) is oidc_routes.py.

The flow (OpenID Connect Core 1.0, 3.1; RFC 7636): `login` sends the browser to the
provider's authorization endpoint with a random `state`, `nonce` and a PKCE challenge,
and keeps the three (and where to land afterwards) in a cookie sealed with AES-GCM,
so any rest replica can finish the sign-in and nothing is stored for the sign-ins
that never come back. `return` checks the state against the cookie, exchanges the
code with the verifier, and accepts the ID token only when its signature verifies
against the provider's JWKS and its iss, aud, exp and nonce are the expected ones.

Groups (OpenPAI's groupConfig): a PAI group's `externalName` names the directory
group whose members it takes in. At every sign-in the groups that have an
externalName are set from the directory's (one revoked there is gone here, and with
it its virtual clusters); groups without one are PAI's own, given by admins, and stay.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from joserfc import jwt
from joserfc.errors import ExpiredTokenError, JoseError, MissingClaimError
from joserfc.jwk import KeySet

from libs.common.config import Config
from libs.common.errors import BadInput, Forbidden, Unauthorized
from libs.common.ids import NAME_PATTERN
from libs.common.protocol.limits import MAX_USERNAME_LENGTH
from services.rest.records import Group

LOGIN_PATH = "/api/v2/authn/oidc/login"
RETURN_PATH = "/api/v2/authn/oidc/return"
LOGOUT_PATH = "/api/v2/authn/oidc/logout"
BASIC_LOGIN_PATH = "/api/v2/authn/basic/login"
COOKIE = "pai_oidc_flow"
COOKIE_PATH = "/api/v2/authn/oidc"
# A sign-in at the provider (password, second factor) takes a minute or two; ten is generous.
FLOW_SECONDS = 600
# Clock skew between PAI and the provider that exp/iat tolerate.
LEEWAY_SECONDS = 60
# Asymmetric signatures only: "none" and HS* (keyed with the client secret) are refused.
SIGNING_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
MAX_DIRECTORY_GROUPS = 2000  # a groups claim longer than this is cut (Azure AD sends at most 200)
MAX_REDIRECT_LENGTH = 2048
GROUPS_SHOWN = 10


class OidcSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The config's oidc_* fields, checked once at start."""

    issuer: str
    client_id: str
    client_secret: str  # read from oidc_client_secret_file; never logged
    redirect_url: str  # empty: the request's own origin + RETURN_PATH
    scopes: str
    groups_claim: str
    username_claim: str
    provider_name: str
    portal_url: str


def settings_from(config: Config, client_secret: str) -> OidcSettings | None:
    """The OIDC settings, None when OIDC is off (no issuer); BadInput naming the field when wrong."""
    if not config.oidc_issuer:
        return None
    issuer = config.oidc_issuer.rstrip("/")
    parts = urlsplit(issuer)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise BadInput(f"oidc_issuer: {issuer!r} is not an http(s) URL")
    if parts.scheme == "http" and parts.hostname not in ("localhost", "127.0.0.1", "::1"):
        # The discovery document and the keys travel in it: a plain-HTTP issuer on the network is spoofable.
        raise BadInput(f"oidc_issuer: {issuer!r} must be https (plain http only for a provider on this host)")
    if not config.oidc_client_id:
        raise BadInput("oidc_client_id: required when oidc_issuer is set (the client id registered at the provider)")
    if "openid" not in config.oidc_scopes.split():
        raise BadInput(f"oidc_scopes: {config.oidc_scopes!r} must include 'openid'")
    if config.oidc_redirect_url and not config.oidc_redirect_url.rstrip("/").endswith(RETURN_PATH):
        raise BadInput(f"oidc_redirect_url: {config.oidc_redirect_url!r} must end with {RETURN_PATH}")
    return OidcSettings(
        issuer=issuer, client_id=config.oidc_client_id, client_secret=client_secret,
        redirect_url=config.oidc_redirect_url.rstrip("/"), scopes=config.oidc_scopes,
        groups_claim=config.oidc_groups_claim, username_claim=config.oidc_username_claim,
        provider_name=config.oidc_provider_name or parts.hostname, portal_url=config.portal_url.rstrip("/"))


def authn_info(config: Config, settings: OidcSettings | None) -> dict[str, Any]:
    """OpenPAI's GET /api/v2/authn/info, with PAI's fields beside it: which sign-ins this PAI offers."""
    if settings is None:
        return {"authn_type": "basic", "loginURI": BASIC_LOGIN_PATH, "loginURIMethod": "post",
                "basicAuth": config.basic_auth, "oidc": None}
    return {"authn_type": "OIDC", "loginURI": LOGIN_PATH, "loginURIMethod": "get",
            "basicAuth": config.basic_auth,
            "oidc": {"provider": settings.provider_name, "issuer": settings.issuer,
                     "loginURI": LOGIN_PATH, "logoutURI": LOGOUT_PATH}}


def basic_auth_off(settings: OidcSettings | None) -> Forbidden:
    other = (f"sign in through {settings.provider_name} at GET {LOGIN_PATH}" if settings is not None
             else "use an application token")
    return Forbidden(f"password sign-in is turned off on this PAI (basic_auth: false): {other}")


# --- the browser's sign-in cookie ---------------------------------------------------------------


class Flow(msgspec.Struct, frozen=True, kw_only=True):
    """One sign-in under way, in the browser's cookie (sealed: only PAI reads or makes it)."""

    state: str
    nonce: str
    verifier: str  # PKCE code_verifier: the provider gives the code's tokens only with it
    redirect: str  # where the portal is, to land on with the token
    origin: str = ""  # OpenPAI's `from`: the page the user was on
    expires: float


def flow_key(client_secret: str, fallback: bytes) -> bytes:
    """The cookie's AES key: from the client secret, so every replica has it; a public
    client (no secret) uses `fallback`, this process's own random key."""
    if not client_secret:
        return fallback
    return hmac.new(b"pai oidc sign-in cookie", client_secret.encode(), hashlib.sha256).digest()


def new_flow(redirect: str, origin: str, now: float) -> Flow:
    return Flow(state=secrets.token_urlsafe(24), nonce=secrets.token_urlsafe(24),
                verifier=secrets.token_urlsafe(48), redirect=redirect, origin=origin[:MAX_REDIRECT_LENGTH],
                expires=now + FLOW_SECONDS)


def seal(flow: Flow, key: bytes) -> str:
    iv = secrets.token_bytes(12)
    return _b64(iv + AESGCM(key).encrypt(iv, msgspec.json.encode(flow), COOKIE.encode()))


def open_flow(cookie: str | None, state: str, key: bytes, now: float) -> Flow:
    """The sign-in the browser started, checked against the provider's `state`; Unauthorized saying why not."""
    again = f"start again at {LOGIN_PATH}"
    if not cookie:
        raise Unauthorized(f"no sign-in under way in this browser (its sign-in cookie is missing: it lives "
                           f"{FLOW_SECONDS // 60} minutes and only in the browser that started it); {again}")
    try:
        raw = base64.urlsafe_b64decode(cookie + "=" * (-len(cookie) % 4))
        flow = msgspec.json.decode(AESGCM(key).decrypt(raw[:12], raw[12:], COOKIE.encode()), type=Flow)
    except (ValueError, InvalidTag, msgspec.DecodeError):
        raise Unauthorized(f"the sign-in cookie is not one this PAI made; {again}") from None
    if now > flow.expires:
        raise Unauthorized(f"the sign-in took longer than {FLOW_SECONDS // 60} minutes and expired; {again}")
    if not state or not hmac.compare_digest(state.encode(), flow.state.encode()):
        # Another tab started a sign-in since, or someone tries to sign this browser in as themselves.
        raise Unauthorized(f"state: the provider's answer does not belong to the sign-in this browser started "
                           f"(state mismatch); {again}")
    return flow


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def code_challenge(verifier: str) -> str:
    """PKCE S256 (RFC 7636, 4.2)."""
    return _b64(hashlib.sha256(verifier.encode()).digest())


def authorization_url(endpoint: str, settings: OidcSettings, redirect_uri: str, flow: Flow) -> str:
    query = {"response_type": "code", "client_id": settings.client_id, "redirect_uri": redirect_uri,
             "scope": settings.scopes, "state": flow.state, "nonce": flow.nonce,
             "code_challenge": code_challenge(flow.verifier), "code_challenge_method": "S256"}
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(query)}"


def landing_url(flow: Flow, user: str, token: str, admin: bool) -> str:
    """OpenPAI's return: the portal with the new token in its query (user, token, admin, from)."""
    query = {"user": user, "token": token, "admin": "true" if admin else "false"}
    if flow.origin:
        query["from"] = flow.origin
    base, hash_mark, fragment = flow.redirect.partition("#")  # the query goes before a portal's #/page
    return f"{base}{'&' if '?' in base else '?'}{urlencode(query)}{hash_mark}{fragment}"


def safe_redirect(wanted: str | None, own_origins: tuple[str, ...], default: str) -> str:
    """Where to land after signing in: a path on PAI or a URL on one of its own origins,
    never another site (the token travels in that URL)."""
    if not wanted:
        return default
    if len(wanted) > MAX_REDIRECT_LENGTH:
        raise BadInput(f"redirect_uri: at most {MAX_REDIRECT_LENGTH} characters")
    if wanted.startswith("/") and not wanted.startswith("//") and "\\" not in wanted:
        return wanted
    parts = urlsplit(wanted)
    if parts.scheme in ("http", "https") and f"{parts.scheme}://{parts.netloc}" in own_origins:
        return wanted
    raise BadInput(f"redirect_uri: {wanted[:80]!r} is not on this PAI ({', '.join(own_origins)}); "
                   "give a path such as /, or a URL of PAI's own portal")


# --- the ID token --------------------------------------------------------------------------------


def check_id_token(id_token: str, keys: Mapping[str, Any], settings: OidcSettings, nonce: str, now: float,
                   algorithms: tuple[str, ...] = SIGNING_ALGORITHMS) -> dict[str, Any]:
    """The ID token's claims once its signature (against the provider's JWKS) and its
    iss, aud, azp, exp, iat and nonce check (OpenID Connect Core 1.0, 3.1.3.7);
    Unauthorized naming the check that failed."""
    try:
        token = jwt.decode(id_token, KeySet.import_key_set(keys), algorithms=list(algorithms))  # type: ignore[arg-type]
    except JoseError as exc:
        raise Unauthorized(f"id_token: its signature does not verify against the provider's keys "
                           f"({exc.error}: {exc.description or type(exc).__name__}); sign in again") from None
    claims = token.claims
    registry = jwt.JWTClaimsRegistry(
        now=int(now), leeway=LEEWAY_SECONDS,
        iss={"essential": True, "value": settings.issuer},
        aud={"essential": True, "value": settings.client_id},
        exp={"essential": True}, iat={"essential": True}, sub={"essential": True})
    try:
        registry.validate(claims)
    except ExpiredTokenError:
        raise Unauthorized("id_token: expired (exp is in the past); sign in again") from None
    except MissingClaimError as exc:
        raise Unauthorized(f"id_token: lacks the claim {exc.description}; the provider is not a standard "
                           "OpenID provider") from None
    except JoseError as exc:
        raise Unauthorized(f"id_token: {exc.description or exc.error} (expected iss {settings.issuer}, "
                           f"aud {settings.client_id}); sign in again") from None
    audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if len(audiences) > 1 and claims.get("azp") != settings.client_id:
        raise Unauthorized(f"id_token: azp is not {settings.client_id} though the token has several audiences")
    if not isinstance(claims.get("nonce"), str) or not hmac.compare_digest(claims["nonce"].encode(), nonce.encode()):
        raise Unauthorized("id_token: its nonce is not the one this sign-in sent (a replayed or "
                           "injected token); start again at " + LOGIN_PATH)
    return dict(claims)


# --- who signed in, and their groups -------------------------------------------------------------


_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")


def username_from(claims: Mapping[str, Any], claim: str) -> str:
    """OpenPAI's: the part of the email (or another claim) before its last '@'; characters a
    PAI name may not hold become '_'."""
    value = claims.get(claim)
    if not isinstance(value, str) or not value.strip():
        raise Forbidden(f"the provider's token has no {claim!r} claim to name the PAI user by "
                        f"(oidc_username_claim); ask an admin to choose a claim the provider sends")
    local = value.strip().rpartition("@")[0] or value.strip()
    name = _NOT_NAME.sub("_", local)[:MAX_USERNAME_LENGTH]
    if not NAME_PATTERN.match(name) or name == "me":
        raise Forbidden(f"the {claim!r} claim {value[:64]!r} makes no PAI user name")
    return name


def directory_groups(claims: Mapping[str, Any], claim: str) -> list[str]:
    value = claims.get(claim, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    return [g for g in value if isinstance(g, str)][:MAX_DIRECTORY_GROUPS]


def grouplist_from_directory(current: list[str], directory: list[str], groups: Mapping[str, Group]) -> list[str]:
    """The user's groups after a sign-in: every group whose externalName is one of the
    directory's, and the groups without an externalName they already had (PAI's own)."""
    seen = set(directory)
    managed = {name for name, group in groups.items() if group.externalName}
    granted = sorted(name for name, group in groups.items() if group.externalName and group.externalName in seen)
    kept = [name for name in current if name not in managed]
    return list(dict.fromkeys([*kept, *granted]))


def no_groups(username: str, directory: list[str], claim: str) -> Forbidden:
    shown = ", ".join(directory[:GROUPS_SHOWN]) + (" ..." if len(directory) > GROUPS_SHOWN else "")
    return Forbidden(f"user {username} is not in configured groups: none of their directory groups "
                     f"({claim}: {shown or 'none'}) is the externalName of a PAI group; ask an admin to map one "
                     "(a group's externalName, or oidc_group_config_file)")


def name_taken(username: str) -> Forbidden:
    return Forbidden(f"a PAI user named {username} already exists and is not this directory account; "
                     "an admin can delete it (DELETE /api/v2/users/" + username + ") so the directory account "
                     "takes the name at its next sign-in")


# --- OpenPAI's groupConfig, from oidc_group_config_file ----------------------------------------


class ConfiguredGroup(msgspec.Struct, frozen=True, kw_only=True):
    groupname: str
    externalName: str = ""
    description: str = ""
    extension: dict[str, Any] = {}
    admin: bool = False  # the admin-group: its members are admins


def parse_group_config(raw: object, where: str) -> list[ConfiguredGroup]:
    """OpenPAI's group-manager section: `admin-group`, `default-group` (or adminGroup,
    defaultGroup) and `grouplist`, each group with groupname, externalName, description
    and extension.acls."""
    if not isinstance(raw, dict):
        raise BadInput(f"{where}: expected a mapping with admin-group, default-group and grouplist")
    section = raw.get("group-manager", raw.get("groupConfig", raw))
    if not isinstance(section, dict):
        raise BadInput(f"{where}: group-manager must be a mapping")
    out: list[ConfiguredGroup] = []
    entries: list[tuple[str, object, bool]] = []
    for keys, admin in ((("admin-group", "adminGroup"), True), (("default-group", "defaultGroup"), False)):
        for key in keys:
            if key in section:
                entries.append((key, section[key], admin))
    listed = section.get("grouplist", [])
    if not isinstance(listed, list):
        raise BadInput(f"{where}: grouplist must be a list of groups")
    entries += [(f"grouplist[{i}]", item, False) for i, item in enumerate(listed)]
    for path, item, admin in entries:
        if not isinstance(item, dict):
            raise BadInput(f"{where}: {path}: expected a group (groupname, externalName, extension)")
        fields = {k: v for k, v in item.items() if k in ("groupname", "externalName", "description", "extension")}
        try:
            group = msgspec.convert({**fields, "admin": admin}, ConfiguredGroup)
        except msgspec.ValidationError as exc:
            raise BadInput(f"{where}: {path}: {exc}") from None
        out.append(group)
    return out


def encode_claims_for_log(claims: Mapping[str, Any]) -> str:
    """The claims that say who signed in, for the log (never the tokens)."""
    return json.dumps({k: claims.get(k) for k in ("iss", "sub", "email") if k in claims})
