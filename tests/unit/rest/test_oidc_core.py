"""The pure parts of OIDC sign-in (services/rest/identity/oidc.py): settings, the sealed
sign-in cookie, who a token names, which groups the directory grants, OpenPAI's groupConfig."""

from __future__ import annotations

import pytest

from libs.common.config import load_config
from libs.common.errors import BadInput, Forbidden, Unauthorized
from services.rest.identity import oidc
from services.rest.records import Group

KEY = oidc.flow_key("client secret", b"")


def test_settings_refuse_what_would_be_unsafe_or_unusable_naming_the_field():
    assert oidc.settings_from(load_config(env={}), "") is None  # no issuer: off
    cases = {
        "oidc_issuer": dict(oidc_issuer="http://idp.example.com", oidc_client_id="c"),  # plain http off this host
        "oidc_client_id": dict(oidc_issuer="https://idp.example.com"),
        "oidc_scopes": dict(oidc_issuer="https://idp.example.com", oidc_client_id="c", oidc_scopes="email"),
        "oidc_redirect_url": dict(oidc_issuer="https://idp.example.com", oidc_client_id="c",
                                  oidc_redirect_url="https://pai.example.com/elsewhere"),
    }
    for field, overrides in cases.items():
        with pytest.raises(BadInput, match=field):
            oidc.settings_from(load_config(env={}, **overrides), "")
    ok = oidc.settings_from(load_config(env={}, oidc_issuer="http://127.0.0.1:9/", oidc_client_id="c"), "s")
    assert ok is not None and ok.issuer == "http://127.0.0.1:9" and ok.provider_name == "127.0.0.1"


def test_the_cookie_opens_only_for_its_own_state_unaltered_and_in_time():
    flow = oidc.new_flow("/", "", now=1000.0)
    sealed = oidc.seal(flow, KEY)
    assert flow.verifier not in sealed and flow.nonce not in sealed
    assert oidc.open_flow(sealed, flow.state, KEY, now=1001.0) == flow
    with pytest.raises(Unauthorized, match="state mismatch"):
        oidc.open_flow(sealed, "another state", KEY, now=1001.0)
    with pytest.raises(Unauthorized, match="expired"):
        oidc.open_flow(sealed, flow.state, KEY, now=1000.0 + oidc.FLOW_SECONDS + 1)
    tampered = sealed[:-2] + ("A" if sealed[-2] != "A" else "B") + sealed[-1]
    with pytest.raises(Unauthorized, match="not one this PAI made"):
        oidc.open_flow(tampered, flow.state, KEY, now=1001.0)
    with pytest.raises(Unauthorized, match="not one this PAI made"):  # sealed under another client secret
        oidc.open_flow(sealed, flow.state, oidc.flow_key("other secret", b""), now=1001.0)
    with pytest.raises(Unauthorized, match="missing"):
        oidc.open_flow(None, flow.state, KEY, now=1001.0)


def test_pkce_challenge_is_rfc7636s_example():
    # RFC 7636, appendix B.
    assert oidc.code_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk") == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


def test_the_user_is_named_by_the_email_before_its_at_as_openpai():
    assert oidc.username_from({"email": "dana.lee@corp.example"}, "email") == "dana_lee"
    assert oidc.username_from({"upn": "Bob@corp"}, "upn") == "Bob"
    assert oidc.username_from({"preferred_username": "carol"}, "preferred_username") == "carol"
    with pytest.raises(Forbidden, match="'email' claim"):
        oidc.username_from({"sub": "x"}, "email")


def test_directory_groups_set_the_mapped_groups_and_keep_pai_s_own():
    groups = {
        "default": Group(groupname="default", externalName="sg-all"),
        "vision": Group(groupname="vision", externalName="sg-vision"),
        "speech": Group(groupname="speech", externalName="sg-speech"),
        "manual": Group(groupname="manual"),  # no externalName: given by PAI's admins
    }
    assert oidc.grouplist_from_directory([], ["sg-all", "sg-vision", "unknown"], groups) == ["default", "vision"]
    # sg-vision revoked, sg-speech granted; the admin-given group stays.
    assert oidc.grouplist_from_directory(["default", "vision", "manual"], ["sg-all", "sg-speech"], groups) == \
        ["manual", "default", "speech"]
    assert oidc.grouplist_from_directory(["vision"], [], groups) == []
    assert oidc.directory_groups({"groups": "sg-one"}, "groups") == ["sg-one"]
    assert oidc.directory_groups({"groups": [1, "sg-two"]}, "groups") == ["sg-two"]
    assert oidc.directory_groups({}, "groups") == []


def test_landing_only_on_pai_itself():
    own = ("https://pai.example.com",)
    assert oidc.safe_redirect(None, own, "https://pai.example.com/") == "https://pai.example.com/"
    assert oidc.safe_redirect("/#/jobs", own, "/") == "/#/jobs"
    assert oidc.safe_redirect("https://pai.example.com/x", own, "/") == "https://pai.example.com/x"
    for bad in ("https://evil.example/", "//evil.example/", "/\\evil.example", "javascript:alert(1)"):
        with pytest.raises(BadInput, match="redirect_uri"):
            oidc.safe_redirect(bad, own, "/")
    flow = oidc.new_flow("/#/jobs", "jobs", now=0.0)
    assert oidc.landing_url(flow, "nora", "tok", admin=False) == "/?user=nora&token=tok&admin=false&from=jobs#/jobs"


def test_openpais_group_config_is_read_with_its_names():
    groups = oidc.parse_group_config({"group-manager": {
        "admin-group": {"groupname": "admin", "externalName": "sg-admins"},
        "defaultGroup": {"groupname": "default", "externalName": "sg-all"},
        "grouplist": [{"groupname": "vision", "externalName": "sg-vision",
                       "extension": {"acls": {"virtualClusters": ["vision"]}}}]}}, "groups.yaml")
    assert [(g.groupname, g.externalName, g.admin) for g in groups] == [
        ("admin", "sg-admins", True), ("default", "sg-all", False), ("vision", "sg-vision", False)]
    with pytest.raises(BadInput, match=r"groups.yaml: grouplist\[0\]"):
        oidc.parse_group_config({"grouplist": [{"externalName": "no name"}]}, "groups.yaml")
    with pytest.raises(BadInput, match="grouplist must be a list"):
        oidc.parse_group_config({"grouplist": "vision"}, "groups.yaml")
