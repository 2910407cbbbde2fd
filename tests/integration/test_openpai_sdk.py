"""OpenPAI's own clients against a running PAI.

- OpenPAI's JavaScript SDK (@microsoft/openpai-js-sdk from npm, pinned in
  tests/openpai_sdk/package-lock.json; `make test` installs it with `npm ci`) driven by
  tests/openpai_sdk/drive.js through users, groups, tokens, VCs, a job's whole life, its
  attempts (numbered from 0, as OpenPAI), task logs, tags, events and the Kubernetes views.
- schemathesis against OpenPAI's own OpenAPI document (the swagger.yaml the SDK ships):
  bounded generated calls to every operation find no server error, and the operations
  whose answers PAI shapes as OpenPAI's conform to its schemas.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[2]
SDK_DIR = ROOT / "tests" / "openpai_sdk"
SWAGGER = SDK_DIR / "node_modules" / "@microsoft" / "openpai-js-sdk" / "lib" / "src" / "api" / "v2" / "swagger.yaml"
RUN = uuid.uuid4().hex[:6]


def _sdk_installed() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: OpenPAI's JavaScript SDK cannot run")
    if not (SDK_DIR / "node_modules" / "@microsoft" / "openpai-js-sdk").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--prefer-offline"], cwd=SDK_DIR, check=True,
                       capture_output=True, timeout=300)


async def test_openpai_javascript_sdk_through_its_whole_surface(platform, tmp_path):
    _sdk_installed()
    # A team storage the SDK's group is granted (drive.js: extension.acls.storageConfigs).
    storage = f"sdkdata{RUN}"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {platform.conn.token}"}) as http:
        async with http.put(f"{platform.conn.url}/api/v2/storages/{storage}",
                            json={"type": "hostPath", "data": {"path": str(tmp_path / storage)}}) as resp:
            assert resp.status in (200, 201), await resp.text()
    env = {**os.environ, "PAI_URL": platform.conn.url, "PAI_TOKEN": platform.conn.token, "RUN": RUN,
           "STORAGE": storage}
    proc = await asyncio.create_subprocess_exec("node", str(SDK_DIR / "drive.js"), cwd=SDK_DIR, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=240)
    seen = json.loads(out or b"{}")
    assert proc.returncode == 0, (seen, err.decode()[-2000:])
    user, group = f"sdk{RUN}", f"sdkg{RUN}"

    assert seen["info"]["name"] == "PAI RESTful API"
    assert seen["user"]["username"] == user and seen["userCount"] >= 2
    assert seen["group"]["description"] == "changed by the SDK" and seen["group"]["externalName"] == f"cn={group}"
    assert {"username": user, "clusterAdmin": False} in seen["members"]  # OpenPAI's shape
    assert group not in seen["afterRemoval"]
    after = seen["userAfter"]
    assert group in after["grouplist"] and after["email"] == f"changed{RUN}@example.com"
    assert after["extension"] == {"editor": "vscode"}
    assert seen["applicationToken"] == {"application": True, "works": True} and seen["revokedRefused"] is True
    assert seen["tokenCount"] >= 1

    assert "default" in seen["vcs"] and "capacity" in seen["vc"] and seen["vcSkus"]

    assert seen["job"]["jobStatus"]["state"] == "SUCCEEDED", seen["job"]
    assert f"hello{RUN}" in seen["listed"]
    assert seen["config"]["name"] == f"hello{RUN}"
    assert seen["tags"] == ["sdk"] and seen["tagsAfter"] == []
    assert seen["events"][0] == "Submitted" and "Succeeded" in seen["events"]
    assert seen["healthz"] == "ok"
    assert seen["attempts"] == [0]  # OpenPAI numbers attempts from 0
    assert seen["attempt0"] == {"attemptIndex": 0, "state": "SUCCEEDED", "roles": ["main"]}
    assert seen["jobAt0"] == "SUCCEEDED"
    assert seen["task"] == {"state": "SUCCEEDED", "attempts": [0]}
    assert seen["logNames"] == ["all"] and f"hello-from-the-sdk-{RUN}" in seen["log"]

    assert seen["nodes"]["kind"] == "NodeList" and {"node-a", "node-b", "node-c"} <= set(seen["nodes"]["names"])
    assert seen["pods"]["kind"] == "PodList" and f"sleeper{RUN}" in seen["pods"]["jobs"]
    assert seen["nodesRefused"] is True
    assert seen["stopped"] == "STOPPED"
    assert storage in [s["name"] for s in seen["storages"]["storages"]], seen["storages"]
    assert seen["storage"]["name"] == storage


def _schemathesis() -> str | None:
    exe = Path(sys.executable).with_name("schemathesis")
    return str(exe) if exe.exists() else shutil.which("schemathesis")


# Bounded: a few examples per operation, the whole run under a minute on two busy cores.
MAX_EXAMPLES = 2
MAX_SECONDS = 12
# Not driven: OIDC sign-in (its own tests, against a provider) and the sign-out, which
# would end the token the run uses.
NOT_DRIVEN = ("/api/v2/authn/oidc/", "/api/v2/authn/basic/logout")
# Operations whose answers PAI shapes exactly as OpenPAI's schema says; the others differ
# deliberately in ways docs/api.md's compatibility table names (e.g. `launcherType: local`,
# token ids instead of token values, PAI's 200 where OpenPAI documents 201).
CONFORMING = (
    "/api/v2/jobs/{user}~{job}/job-attempts",
    "/api/v2/jobs/{user}~{job}/job-attempts/{attemptIndex}",
    "/api/v2/jobs/{user}~{job}/attempts/{jobAttemptId}/taskRoles/{taskRoleName}/taskIndex/{taskIndex}/attempts",
    "/api/v2/tokens/application",
    "/api/v2/virtual-clusters/{vc}",
    "/api/v2/groups",
    "/api/v2/groups/{group}/userlist",
)


def _offline_swagger(tmp_path: Path) -> Path:
    """OpenPAI's document as shipped, but for its one reference outside itself (OpenPAI's job
    protocol schema on GitHub, unreachable offline), read as any text: the job body is YAML."""
    text = SWAGGER.read_text()
    external = re.compile(r"\$ref: ['\"]?https?://[^'\"\s]+['\"]?")
    local = tmp_path / "openpai-swagger.yaml"
    local.write_text(external.sub("type: string", text))
    return local


async def _schemathesis_run(platform, tmp_path, token: str, checks: str, include: list[str]) -> str:
    command = _schemathesis()
    if command is None:
        pytest.skip("schemathesis is not installed (pip install -e .[test])")
    args = [command, "run", str(_offline_swagger(tmp_path)), "--url", platform.conn.url, "--checks", checks,
            "--header", f"Authorization: Bearer {token}", "--max-examples", str(MAX_EXAMPLES),
            "--phases", "examples,fuzzing", "--workers", "1", "--max-time", str(MAX_SECONDS),
            "--request-timeout", "20", "--seed", "1", "--no-color", *include]
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                env={**os.environ, "NO_COLOR": "1"}, cwd=tmp_path)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=MAX_SECONDS * 2 + 60)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-6000:]
    return text


async def test_schemathesis_against_openpai_own_openapi_document(platform, tmp_path):
    _sdk_installed()
    # A token of its own: the generated calls may revoke what they are given.
    made = await platform.client.request("POST", "/api/v2/tokens", json_body={"description": "schemathesis"})
    excluded = [arg for prefix in NOT_DRIVEN for arg in ("--exclude-path-regex", "^" + prefix.replace("/", "\\/"))]
    await _schemathesis_run(platform, tmp_path, made["token"], "not_a_server_error", excluded)
    conforming = [arg for path in CONFORMING for arg in ("--include-path", path)]
    await _schemathesis_run(platform, tmp_path, made["token"],
                            "not_a_server_error,response_schema_conformance", conforming)
