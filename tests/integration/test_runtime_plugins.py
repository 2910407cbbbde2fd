"""OpenPAI's cmd runtime plugin through the whole platform: its commands run around the
task's in OpenPAI's order, a failing one ends the job with the RuntimePluginFailed exit
spec naming it; and the task sees OpenPAI's PAI_* variables."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.conftest import Api, job_yaml

pytestmark = pytest.mark.integration


def cmd_plugin(pre: list[str], post: list[str]) -> str:
    return ("extras:\n  com.microsoft.pai.runtimeplugin:\n    - plugin: cmd\n      parameters:\n"
            f"        preCommands: {pre!r}\n        postCommands: {post!r}\n")


async def test_pre_and_post_commands_run_around_the_task_which_sees_openpais_variables(platform: Api):
    name = f"plugins-{uuid.uuid4().hex[:6]}"
    answer = await platform.submit(job_yaml(name, [
        "echo main $PAI_TASK_INDEX $PAI_RESOURCE_main $PAI_JOB_TASK_COUNT $PAI_MIN_FAILED_TASK_COUNT_main",
    ], extra=cmd_plugin(["echo pre-step"], ["echo post-step"])))
    detail = await platform.wait_state(answer["job"], {"SUCCEEDED", "FAILED"})
    log = await platform.logs(answer["job"])
    assert detail["jobStatus"]["state"] == "SUCCEEDED", log
    lines = [line for line in log.splitlines() if line.split(" ")[0] in ("pre-step", "main", "post-step")]
    assert lines == ["pre-step", "main 0 0,1,256,0 1 1", "post-step"]


async def test_a_failing_pre_command_fails_the_job_with_an_exit_spec_naming_the_plugin(platform: Api):
    name = f"badplugin-{uuid.uuid4().hex[:6]}"
    answer = await platform.submit(job_yaml(name, ["echo never-here"], extra=cmd_plugin(["exit 3"], [])))
    detail = await platform.wait_state(answer["job"], {"SUCCEEDED", "FAILED"})
    status = detail["jobStatus"]
    assert status["state"] == "FAILED"
    assert (status["appExitSpec"]["code"], status["appExitSpec"]["phrase"]) == (199, "RuntimePluginFailed")
    assert "runtime plugin cmd (extras.com.microsoft.pai.runtimeplugin[0]) preCommands (exit code 3)" in (
        status["appExitDiagnostics"] or "")
    assert "never-here" not in await platform.logs(answer["job"])
