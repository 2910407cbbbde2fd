"""OpenPAI's cmd runtime plugin and cmd prerequisites' callbacks run in the task, in
OpenPAI's order, and a failing one ends the task with an exit spec naming it;
teamwise_storage names the job's storages. The task's commands are run by bash
here exactly as the backends run them (`bash -e` over the lines)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from libs.common.exitspecs import RUNTIME_PLUGIN_FAILED_EXIT_CODE
from libs.common.protocol import ProtocolError
from libs.common.protocol.parse import parse_job
from services.runtime.core import RuleEngine, default_rules
from tests.unit.runtime.builders import task_exited


def job(**extra: object) -> dict:
    doc: dict = {
        "protocolVersion": 2,
        "name": "plugins",
        "type": "job",
        "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "busybox"}],
        "taskRoles": {"worker": {"dockerImage": "img", "commands": ["echo main"]}},
    }
    doc.update(extra)
    return doc


def commands_of(doc: dict, role: str = "worker") -> list[str]:
    return parse_job(yaml.safe_dump(doc), user="alice").spec.role(role).commands


def run(commands: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "--noprofile", "--norc", "-e", "-c", "\n".join(commands) + "\n"],
                          capture_output=True, text=True, timeout=30)


def cmd_plugin(pre: list[str] | None = None, post: list[str] | None = None, **fields: object) -> dict:
    parameters: dict = {}
    if pre is not None:
        parameters["preCommands"] = pre
    if post is not None:
        parameters["postCommands"] = post
    return {"plugin": "cmd", "parameters": parameters, **fields}


def test_pre_and_post_commands_run_around_the_commands_in_openpais_order():
    # Prerequisites' plugins first (in the role's order), then extras'; post in reverse.
    doc = job(
        prerequisites=[
            {"name": "img", "type": "dockerimage", "uri": "busybox"},
            {"name": "cifar", "type": "data", "uri": ["https://example.com/cifar.tgz"]},
            {"name": "fetch", "type": "script", "plugin": "com.microsoft.pai.runtimeplugin.cmd",
             "callbacks": [{"event": "taskStarts", "commands": ["echo fetch <% $data.uri[0] %>"]},
                           {"event": "taskSucceeds", "commands": ["echo fetch-done"]}]},
        ],
        taskRoles={"worker": {"dockerImage": "img", "data": "cifar", "prerequisites": ["fetch"],
                              "commands": ["echo main"]}},
        extras={"com.microsoft.pai.runtimeplugin": [
            cmd_plugin(["echo first-pre"], ["echo first-post"]),
            cmd_plugin(["echo second-pre"], ["echo second-post"]),
        ]},
    )
    done = run(commands_of(doc))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:-1] == [
        "fetch https://example.com/cifar.tgz", "first-pre", "second-pre", "main",
        "second-post", "first-post", "fetch-done",
    ]


def test_callbacks_form_of_the_cmd_plugin_and_openpais_container_events():
    doc = job(extras={"com.microsoft.pai.runtimeplugin": [{"plugin": "cmd", "parameters": {"callbacks": [
        {"event": "containerStarts", "commands": ["echo before"]},
        {"event": "containerEnds", "commands": ["echo after"]},
    ]}}]})
    assert run(commands_of(doc)).stdout == "before\nmain\nafter\n"


def test_a_failing_pre_command_stops_the_task_before_its_commands_and_names_the_plugin():
    doc = job(extras={"com.microsoft.pai.runtimeplugin": [cmd_plugin(["echo setting up", "exit 3", "echo never"])]})
    done = run(commands_of(doc))
    assert done.returncode == RUNTIME_PLUGIN_FAILED_EXIT_CODE
    assert "main" not in done.stdout and "never" not in done.stdout
    line = done.stderr.strip().splitlines()[-1]
    assert line == ("[PAI] runtime plugin failed: runtime plugin cmd (extras.com.microsoft.pai.runtimeplugin[0]) "
                    "preCommands (exit code 3)")


def test_the_runtime_explains_a_plugin_failure_with_the_plugin_named():
    doc = job(prerequisites=[
        {"name": "img", "type": "dockerimage", "uri": "busybox"},
        {"name": "fetch", "type": "script", "plugin": "com.microsoft.pai.runtimeplugin.cmd",
         "callbacks": [{"event": "taskStarts", "commands": ["false"]}]},
    ], taskRoles={"worker": {"dockerImage": "img", "script": "fetch", "commands": ["echo main"]}})
    done = run(commands_of(doc))
    verdict = RuleEngine(default_rules()).classify(task_exited(done.returncode, done.stdout + done.stderr))
    assert (verdict.spec.code, verdict.spec.phrase) == (RUNTIME_PLUGIN_FAILED_EXIT_CODE, "RuntimePluginFailed")
    assert any("prerequisite fetch (script, cmd plugin) taskStarts" in line for line in verdict.diagnostics)


def test_post_commands_run_only_when_the_commands_succeeded():
    doc = job(taskRoles={"worker": {"dockerImage": "img", "commands": ["exit 5"]}},
              extras={"com.microsoft.pai.runtimeplugin": [cmd_plugin(["echo pre"], ["echo post"])]})
    done = run(commands_of(doc))
    assert (done.returncode, done.stdout) == (5, "pre\n")


def test_a_failing_post_command_fails_the_task_naming_it():
    doc = job(extras={"com.microsoft.pai.runtimeplugin": [cmd_plugin(post=["exit 4"])]})
    done = run(commands_of(doc))
    assert done.returncode == RUNTIME_PLUGIN_FAILED_EXIT_CODE
    assert "postCommands (exit code 4)" in done.stderr


def test_failure_policy_ignore_goes_on():
    doc = job(extras={"com.microsoft.pai.runtimeplugin": [cmd_plugin(["exit 2"], failurePolicy="ignore")]})
    done = run(commands_of(doc))
    assert (done.returncode, done.stdout) == (0, "main\n")
    assert "ignored (failurePolicy: ignore) (exit code 2)" in done.stderr


def test_a_plugin_for_other_task_roles_is_not_run_in_this_one():
    doc = job(taskRoles={"worker": {"dockerImage": "img", "commands": ["echo w"]},
                         "ps": {"dockerImage": "img", "commands": ["echo p"]}},
              extras={"com.microsoft.pai.runtimeplugin": [cmd_plugin(["echo only-ps"], taskroles=["ps"])]})
    assert run(commands_of(doc, "worker")).stdout == "w\n"
    assert run(commands_of(doc, "ps")).stdout == "only-ps\np\n"


def test_a_secret_in_a_plugin_command_stays_a_reference_in_the_spec():
    doc = job(secrets={"token": "s3cret"},
              extras={"com.microsoft.pai.runtimeplugin": [cmd_plugin(["echo <% $secrets.token %>"])]})
    parsed = parse_job(yaml.safe_dump(doc), user="alice")
    assert "s3cret" not in "".join(parsed.spec.role("worker").commands)
    assert parsed.secrets == {"token": "s3cret"}  # sealed for the launcher, which fills it in


@pytest.mark.parametrize(("plugins", "path", "rule"), [
    ({"plugin": "cmd"} and "not a list", "extras.com.microsoft.pai.runtimeplugin", "type"),
    ([{"parameters": {}}], "extras.com.microsoft.pai.runtimeplugin[0].plugin", "required"),
    ([{"plugin": "cmd", "parameters": {"preCommands": "echo"}}],
     "extras.com.microsoft.pai.runtimeplugin[0].parameters.preCommands", "type"),
    ([{"plugin": "cmd", "parameters": {"callbacks": [{"event": "whenever", "commands": []}]}}],
     "extras.com.microsoft.pai.runtimeplugin[0].parameters.callbacks[0].event", "enum"),
    ([{"plugin": "cmd", "parameters": {"preCommands": ["echo <% $parameters.missing %>"]}}],
     "extras.com.microsoft.pai.runtimeplugin[0].parameters.preCommands[0]", "unknown_reference"),
    ([{"plugin": "cmd", "failurePolicy": "sometimes"}],
     "extras.com.microsoft.pai.runtimeplugin[0].failurePolicy", "enum"),
    ([{"plugin": "cmd", "taskroles": ["nope"]}], "extras.com.microsoft.pai.runtimeplugin[0].taskroles[0]",
     "unknown_task_role"),
    ([{"plugin": "teamwise_storage", "parameters": {"storageConfigNames": "team"}}],
     "extras.com.microsoft.pai.runtimeplugin[0].parameters.storageConfigNames", "type"),
])
def test_malformed_plugins_are_refused_naming_the_field(plugins, path, rule):
    with pytest.raises(ProtocolError) as refused:
        parse_job(yaml.safe_dump(job(extras={"com.microsoft.pai.runtimeplugin": plugins})), user="alice")
    assert (path, rule) in [(e.path, e.rule) for e in refused.value.errors], refused.value.errors


@pytest.mark.parametrize(("plugins", "names"), [
    (None, None),
    ([{"plugin": "teamwise_storage"}], []),
    ([{"plugin": "teamwise_storage", "parameters": {"storageConfigNames": ["a", "b", "a"]}}], ["a", "b"]),
    ([{"plugin": "teamwise_storage", "parameters": {"storageConfigNames": ["a"]}},
      {"plugin": "teamwise_storage", "parameters": {"storageConfigNames": ["c"]}}], ["a", "c"]),
])
def test_teamwise_storage_names_the_storages(plugins, names):
    extras = {} if plugins is None else {"extras": {"com.microsoft.pai.runtimeplugin": plugins}}
    spec = parse_job(yaml.safe_dump(job(**extras)), user="alice").spec
    assert spec.storageConfigNames == names
    assert not [f for f in spec.ignoredFields if "runtimeplugin" in f]


def test_other_plugins_are_kept_and_reported_as_not_run():
    parsed = parse_job(yaml.safe_dump(job(extras={"com.microsoft.pai.runtimeplugin": [
        {"plugin": "git", "parameters": {"repo": "https://example.com/r.git"}}]})), user="alice")
    assert parsed.spec.ignoredFields == ["extras.com.microsoft.pai.runtimeplugin[0]"]
    assert parsed.spec.role("worker").commands == ["echo main"]


def test_openpais_extras_storages_are_read():
    spec = parse_job(yaml.safe_dump(job(extras={"storages": [
        {"name": "team", "mountPath": "/data/team", "readOnly": True, "share": False}, {"name": "share"}]})),
        user="alice").spec
    assert [(r.name, r.mountPath, r.readOnly, r.share) for r in spec.storageRequests] == [
        ("team", "/data/team", True, False), ("share", "", False, True)]
    assert spec.ignoredFields == []


@pytest.mark.parametrize(("storages", "path"), [
    ([{"mountPath": "/x"}], "extras.storages[0].name"),
    ([{"name": "a b"}], "extras.storages[0].name"),
    ([{"name": "a", "mountPath": "relative"}], "extras.storages[0].mountPath"),
    ([{"name": "a", "mountPath": "/proc/x"}], "extras.storages[0].mountPath"),
    ([{"name": "a", "share": "no"}], "extras.storages[0].share"),
    ({"name": "a"}, "extras.storages"),
])
def test_bad_extras_storages_are_refused_naming_the_field(storages, path):
    with pytest.raises(ProtocolError) as refused:
        parse_job(yaml.safe_dump(job(extras={"storages": storages})), user="alice")
    assert path in [e.path for e in refused.value.errors], refused.value.errors
