"""Failure rules changed at run time, end to end: over the API and `pai rules`,
applied to the next failing job with no restart of any service.

The platform is shared by every integration test: each test adds rules with
codes and log markers of its own, and removes them again.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from cli.client import ApiError, Client, Connection
from cli.main import main as pai
from tests.integration.conftest import job_yaml

pytestmark = pytest.mark.integration


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def marker_rule(code: int, phrase: str, marker: str, *, reaction: str = "NEVER_RETRY") -> dict:
    return {
        "code": code,
        "phrase": phrase,
        "type": "USER_FAILURE",
        "reaction": reaction,
        "reason": f"The job printed {marker}.",
        "solution": ["Remove the marker."],
        "pattern": {"runtimeContainerPatterns": [{"userLogRegex": marker}]},
    }


async def delete_if_present(client: Client, code: int) -> None:
    try:
        await client.request("DELETE", f"/api/v2/rules/{code}")
    except ApiError as error:
        if error.status != 404:
            raise


@pytest.fixture
async def admin(platform) -> AsyncIterator[Client]:
    """The admin's client; rules this test adds (codes 201-209) are gone afterwards."""
    yield platform.client
    for code in range(201, 210):
        await delete_if_present(platform.client, code)


async def user_client(platform, admin_client: Client) -> Client:
    created = await admin_client.request("POST", "/api/v2/users", json_body={"username": unique("researcher")})
    return Client(Connection(url=platform.conn.url, token=created["token"]))


async def wait_for_attempts(client: Client, job: str, count: int, timeout: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    attempts: list[dict] = []
    while time.monotonic() < deadline:
        attempts = await client.request("GET", f"/api/v2/jobs/{job}/job-attempts")
        if len(attempts) >= count:
            return attempts
        await asyncio.sleep(0.1)
    raise AssertionError(f"{job} had {len(attempts)} attempts after {timeout}s, wanted {count}")


# --- the next exit uses the new rules -------------------------------------------------


async def test_rule_added_over_the_api_explains_the_next_failure(platform, admin):
    marker = f"PAI-TEST-MARKER-{uuid.uuid4().hex[:8]}"
    added = await admin.request("POST", "/api/v2/rules", json_body=marker_rule(201, "PaiTestMarker", marker))
    assert added["rule"]["code"] == 201 and added["source"] == "admin"

    name = unique("marked")
    await platform.submit(job_yaml(name, [f"echo {marker}", "exit 1"], retry=2))
    detail = await platform.wait_state(f"admin~{name}", "FAILED")

    status = detail["jobStatus"]
    assert (status["appExitSpec"]["code"], status["appExitSpec"]["phrase"]) == (201, "PaiTestMarker")
    assert status["appExitSpec"]["reason"] == f"The job printed {marker}."
    assert (status["attempt"], status["retries"]) == (1, 0)  # NEVER_RETRY, whatever jobRetryCount says


async def test_deleted_rule_no_longer_explains_failures(platform, admin):
    marker = f"PAI-TEST-MARKER-{uuid.uuid4().hex[:8]}"
    await admin.request("POST", "/api/v2/rules", json_body=marker_rule(202, "PaiDeletedMarker", marker))
    await admin.request("DELETE", "/api/v2/rules/202")

    name = unique("unmarked")
    await platform.submit(job_yaml(name, [f"echo {marker}", "exit 1"]))
    detail = await platform.wait_state(f"admin~{name}", "FAILED")

    assert detail["jobStatus"]["appExitSpec"]["phrase"] == "PAIRuntimeUnknownFailed"


async def test_rules_are_listed_in_order_and_shown_one_by_one(platform, admin):
    listed = await admin.request("GET", "/api/v2/rules")
    codes = [rule["code"] for rule in listed["rules"]]
    shown = await admin.request("GET", "/api/v2/rules/137")

    assert codes.index(137) == shown["position"]
    assert shown["rule"]["phrase"] == "ContainerSigKillReceived"
    assert codes[-1] == 256  # the catch-all rules come last


# --- who may change what -------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/v2/rules", marker_rule(203, "NotAllowed", "x")),
        ("PUT", "/api/v2/rules/137", marker_rule(137, "ContainerSigKillReceived", "x")),
        ("DELETE", "/api/v2/rules/137", None),
        ("POST", "/api/v2/rules/reset", None),
    ],
    ids=["add", "change", "delete", "reset"],
)
async def test_non_admin_may_read_rules_but_not_change_them(platform, admin, method, path, body):
    researcher = await user_client(platform, admin)
    assert (await researcher.request("GET", "/api/v2/rules"))["rules"]

    with pytest.raises(ApiError) as refused:
        await researcher.request(method, path, json_body=body)

    assert refused.value.status == 403
    assert 137 in [rule["code"] for rule in (await admin.request("GET", "/api/v2/rules"))["rules"]]


@pytest.mark.parametrize(
    ("rule", "path"),
    [
        (marker_rule(204, "RunawayRegex", "(x+x+)+y"), "pattern.runtimeContainerPatterns[0].userLogRegex"),
        (marker_rule(204, "BrokenRegex", "unclosed[group"), "pattern.runtimeContainerPatterns[0].userLogRegex"),
        (marker_rule(137, "SecondSigKill", "x"), "code"),
    ],
    ids=["runaway-regex", "unparsable-regex", "code-in-use"],
)
async def test_invalid_rule_is_400_naming_the_field(admin, rule, path):
    with pytest.raises(ApiError) as refused:
        await admin.request("POST", "/api/v2/rules", json_body=rule)

    assert refused.value.status == 400
    assert path in [error["path"] for error in refused.value.body["details"]["errors"]]


# --- what retries -----------------------------------------------------------------------


async def test_sigkilled_job_is_retried(platform, admin):
    name = unique("sigkill")
    jid = f"admin~{name}"
    await platform.submit(job_yaml(name, ["kill -9 $$"], retry=1))
    try:
        attempts = await wait_for_attempts(admin, jid, 2)
    finally:
        # SIGKILL is ALWAYS_RETRY (OpenPAI's reaction): the job would go on forever.
        await platform.stop(jid)
    first = attempts[-1]  # newest first
    assert (first["exitCode"], first["exitSpec"]["phrase"]) == (137, "ContainerSigKillReceived")
    await platform.wait_state(jid, "STOPPED")


async def test_syntax_error_runs_once_even_when_an_admin_made_its_rule_retry(platform, admin):
    original = (await admin.request("GET", "/api/v2/rules/231"))["rule"]
    await admin.request("PUT", "/api/v2/rules/231", json_body={**original, "reaction": "RETRY_TO_MAX"})
    try:
        name = unique("syntax")
        jid = f"admin~{name}"
        await platform.submit(job_yaml(name, ["python3 -c 'print(\"unclosed'"], retry=3))
        detail = await platform.wait_state(jid, "FAILED")
    finally:
        await admin.request("PUT", "/api/v2/rules/231", json_body=original)

    assert detail["jobStatus"]["appExitSpec"]["reaction"] == "NEVER_RETRY"
    assert len(await admin.request("GET", f"/api/v2/jobs/{jid}/job-attempts")) == 1


# --- pai rules ------------------------------------------------------------------------------


def test_pai_rules_commands_change_the_rules(platform, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    connection = ["--url", platform.conn.url, "--token", platform.conn.token]
    marker = f"PAI-CLI-MARKER-{uuid.uuid4().hex[:8]}"
    rule_file = tmp_path / "rule.yaml"
    rule_file.write_text(yaml.safe_dump({"spec": [marker_rule(205, "PaiCliMarker", marker)]}))
    changed_file = tmp_path / "changed.json"
    changed_file.write_text(json.dumps(marker_rule(205, "PaiCliMarker", marker, reaction="RETRY_TO_MAX")))
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text(yaml.safe_dump(marker_rule(206, "PaiCliBad", "(a|aa)*(b+)+")))

    def run(*args: str) -> tuple[int, str, str]:
        code = pai([*connection, "rules", *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    try:
        code, out, _ = run("add", str(rule_file), "--before", "137")
        assert code == 0 and "added rule 205 PaiCliMarker" in out

        code, out, _ = run("list")
        assert code == 0
        rows = [line for line in out.splitlines() if "PaiCliMarker" in line or "ContainerSigKillReceived" in line]
        assert "PaiCliMarker" in rows[0] and "ContainerSigKillReceived" in rows[1]

        code, out, _ = run("change", "205", str(changed_file))
        assert code == 0 and "RETRY_TO_MAX" in out

        code, out, _ = run("show", "205")
        assert code == 0 and marker in out and "RETRY_TO_MAX" in out

        code, _, err = run("add", str(bad_file))
        assert code == 2 and "pattern.runtimeContainerPatterns[0].userLogRegex" in err

        code, out, _ = run("delete", "205")
        assert code == 0 and "deleted rule 205" in out

        code, _, err = run("show", "205")
        assert code == 2 and "no rule with code 205" in err

        code, out, _ = run("reset", "--yes")
        assert code == 0 and "shipped defaults" in out
    finally:
        asyncio.run(delete_if_present(Client(platform.conn), 205))
