"""The job protocol layer: what is accepted, how it is normalised, and what is
rejected with which path, rule and line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import msgspec
import pytest
import yaml

from libs.common.errors import TooLarge
from libs.common.protocol import (
    MAX_BODY_BYTES,
    ParsedJob,
    ProtocolError,
    parse_job,
    protocol_error_body,
)
from libs.common.protocol.model import PRIORITY_CLASSES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "jobs"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
REFERENCE = Path(__file__).resolve().parents[2] / ".." / "shared" / "reference" / "openpai"
REFERENCE_EXAMPLES = [
    "example-hello-world-job.yaml",
    "example-pytorch-mnist.yaml",
    "example-tensorflow-cifar10.yaml",
    "example-CPU_500Task_MNIST.yaml",
]

BASE_JOB: dict = {
    "protocolVersion": 2,
    "name": "demo",
    "type": "job",
    "prerequisites": [{"name": "image", "type": "dockerimage", "uri": "python:3.11-slim"}],
    "taskRoles": {
        "worker": {
            "instances": 2,
            "dockerImage": "image",
            "resourcePerInstance": {"cpu": 1, "memoryMB": 256, "gpu": 0},
            "commands": ["echo hello"],
        }
    },
}

DELETE = object()


def job(**changes: object) -> dict:
    """BASE_JOB with dotted-path changes, e.g. job(**{"taskRoles.worker.instances": 0});
    DELETE as a value removes the key."""
    document = copy.deepcopy(BASE_JOB)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        target = document
        for key in parents:
            target = target.setdefault(key, {})
        if value is DELETE:
            target.pop(last, None)
        else:
            target[last] = value
    return document


def submit(document: dict, *, user: str = "alice") -> ParsedJob:
    return parse_job(yaml.safe_dump(document, sort_keys=False), user=user)


def rejection(document: dict | str | bytes, **kwargs) -> ProtocolError:
    body = document if isinstance(document, (str, bytes)) else yaml.safe_dump(document, sort_keys=False)
    with pytest.raises(ProtocolError) as caught:
        parse_job(body, user="alice", **kwargs)
    return caught.value


def rules_by_path(err: ProtocolError) -> set[tuple[str, str]]:
    return {(e.path, e.rule) for e in err.errors}


def reference_file(name: str) -> Path:
    path = REFERENCE / name
    if not path.exists():
        pytest.skip(f"reference files not present: {path}")
    return path


# --- accepted documents -----------------------------------------------------------


@pytest.mark.parametrize("name", REFERENCE_EXAMPLES, ids=lambda n: n.removesuffix(".yaml"))
def test_real_openpai_job_files_are_accepted_unchanged(name):
    body = reference_file(name).read_bytes()
    parsed = parse_job(body, user="alice")
    original = yaml.safe_load(body)
    assert parsed.spec.name == original["name"]
    assert [r.name for r in parsed.spec.taskRoles] == list(original["taskRoles"])
    assert parsed.config == original  # nothing dropped or rewritten (these files hold no secrets)


def test_real_tensorflow_example_renders_its_deployment_and_prerequisites():
    parsed = parse_job(reference_file("example-tensorflow-cifar10.yaml").read_bytes(), user="alice")
    worker = parsed.spec.role("worker")
    assert worker.commands[0] == "rm /usr/local/cuda/lib64/stubs/libcuda.so.1"
    assert "wget -qO- https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in worker.commands[1]
    assert "--model=resnet20" in worker.commands[-1] and "<%" not in " ".join(worker.commands)
    assert parsed.spec.role("psserver").commands[-1].startswith('echo "Uploading data ..."')
    assert worker.dockerImageUri == "openpai/pai.example.tensorflow"


def test_real_cpu_example_takes_the_ssh_plugin_and_asks_for_its_storage():
    parsed = parse_job(reference_file("example-CPU_500Task_MNIST.yaml").read_bytes(), user="alice")
    assert parsed.spec.gangAllocation is False
    assert parsed.spec.role("taskrole").instances == 500
    assert parsed.spec.ignoredFields == [] and parsed.warnings == []  # ssh is run (rest folds it in)
    assert parsed.spec.storageConfigNames == ["confignfs"]


@pytest.mark.parametrize("name", ["hello.yaml", "two-roles.yaml", "fail-syntax.yaml"], ids=str)
def test_example_jobs_for_users_are_valid_and_fit_a_laptop(name):
    parsed = parse_job((EXAMPLES / name).read_bytes(), user="alice")
    assert parsed.warnings == []
    for role in parsed.spec.taskRoles:
        assert role.resources.gpu == 0
        assert role.resources.memoryMB <= 512


def test_example_two_roles_has_several_instances_and_fail_syntax_asks_for_retries():
    two = parse_job((EXAMPLES / "two-roles.yaml").read_bytes(), user="alice").spec
    failing = parse_job((EXAMPLES / "fail-syntax.yaml").read_bytes(), user="alice").spec
    assert [(r.name, r.instances) for r in two.taskRoles] == [("server", 1), ("worker", 3)]
    assert failing.jobRetryCount == 3


def test_minimal_job_gets_every_default():
    spec = parse_job((FIXTURES / "minimal.yaml").read_bytes(), user="bob").spec
    role = spec.role("main")
    assert (spec.user, spec.virtualCluster, spec.jobRetryCount) == ("bob", "default", 0)
    assert (spec.priorityClass, spec.priority) == ("test", PRIORITY_CLASSES["test"])
    assert spec.gangAllocation is True and spec.lazyPreemptionEnable is False
    assert (role.instances, role.taskRetryCount) == (1, 0)
    assert (role.completion.minFailedInstances, role.completion.minSucceededInstances) == (1, -1)
    assert (role.resources.cpu, role.resources.memoryMB, role.resources.gpu) == (1, 1024, 0)
    assert role.dockerImage is None and role.dockerImageUri is None
    assert spec.notifyOnStateChange is False and spec.ignoredFields == []


def test_full_fixture_is_normalised_into_the_job_spec():
    parsed = parse_job((FIXTURES / "distributed-training.yaml").read_bytes(), user="carol")
    spec = parsed.spec
    assert [r.name for r in spec.taskRoles] == ["ps", "worker"]  # document order
    assert (spec.virtualCluster, spec.jobRetryCount) == ("vision", 2)
    assert (spec.priorityClass, spec.priority, spec.skuType) == ("prod", 100, "V100")
    assert spec.lazyPreemptionEnable is True
    worker = spec.role("worker")
    assert (worker.skuType, worker.affinityGroupName) == ("V100", "workers")
    assert spec.role("ps").skuType is None
    assert worker.resources.ports == {"grpc": 1, "tensorboard": 1}
    assert worker.dockerImageUri == "registry.example.com/vision/trainer:1.4"
    assert (worker.completion.minSucceededInstances, spec.role("ps").taskRetryCount) == (2, 1)
    assert spec.notifyOnStateChange is True
    assert spec.notifyEmails == ["vision-team@example.com"]
    # The image's auth is used (the pull's credentials), so it is not among them.
    assert spec.ignoredFields == ["prerequisites[1]", "prerequisites[2]", "prerequisites[3]", "extras.submitFrom"]
    assert len(parsed.warnings) == len(spec.ignoredFields)


def test_json_body_is_accepted():
    parsed = parse_job((FIXTURES / "cpu-only.json").read_bytes(), content_type="application/json; charset=utf-8",
                       user="alice")
    assert parsed.spec.role("main").instances == 2
    assert (parsed.spec.priorityClass, parsed.spec.priority) == ("oppo", -1)


@pytest.mark.parametrize("content_type", ["text/yaml", "application/yaml", "application/x-yaml", "", "text/plain"],
                         ids=lambda t: t or "none")
def test_yaml_is_read_under_each_yaml_content_type(content_type):
    parsed = parse_job(yaml.safe_dump(BASE_JOB), content_type=content_type, user="alice")
    assert parsed.spec.name == "demo"


def test_json_text_and_yaml_text_give_the_same_spec():
    from_yaml = parse_job(yaml.safe_dump(BASE_JOB), user="alice").spec
    from_json = parse_job(json.dumps(BASE_JOB).encode(), content_type="application/json", user="alice").spec
    assert from_json == from_yaml


@pytest.mark.parametrize(("priority_class", "priority"), list(PRIORITY_CLASSES.items()), ids=list(PRIORITY_CLASSES))
def test_priority_classes_map_to_hived_priorities(priority_class, priority):
    spec = submit(job(**{"extras.hivedScheduler.jobPriorityClass": priority_class})).spec
    assert (spec.priorityClass, spec.priority) == (priority_class, priority)


@pytest.mark.parametrize(
    ("setting", "notify"),
    [(True, True), (False, False), ({"running": True, "failed": True}, True), ({"failed": False}, False)],
    ids=["true", "false", "some-states", "all-states-off"],
)
def test_status_change_notification_accepts_a_flag_or_a_state_mapping(setting, notify):
    spec = submit(job(**{"extras.jobStatusChangeNotification": setting})).spec
    assert spec.notifyOnStateChange is notify


def test_a_single_notify_email_may_be_written_as_a_string():
    assert submit(job(**{"extras.notifyEmails": "a@example.com"})).spec.notifyEmails == ["a@example.com"]


@pytest.mark.parametrize("version", [2, "2"], ids=["number", "string"])
def test_protocol_version_may_be_a_number_or_a_string(version):
    assert submit(job(protocolVersion=version)).spec.name == "demo"


def test_unknown_extras_are_kept_and_reported():
    parsed = submit(job(**{"extras.myTeam": {"cost_center": 42}, "extras.hivedScheduler.skuNum": 2}))
    assert parsed.spec.ignoredFields == ["extras.myTeam", "extras.hivedScheduler.skuNum"]
    assert parsed.config["extras"]["myTeam"] == {"cost_center": 42}


def test_yaml_anchors_and_merge_keys_are_understood():
    body = """
protocolVersion: 2
name: anchors
taskRoles:
  a: &role
    instances: 2
    resourcePerInstance: {cpu: 2, memoryMB: 128, gpu: 0}
    commands: [echo a]
  b:
    <<: *role
    commands: [echo b]
"""
    spec = parse_job(body, user="alice").spec
    assert [(r.name, r.instances, r.resources.cpu, r.commands) for r in spec.taskRoles] == [
        ("a", 2, 2, ["echo a"]), ("b", 2, 2, ["echo b"])]


def test_spec_survives_the_bus_encoding():
    spec = parse_job((FIXTURES / "distributed-training.yaml").read_bytes(), user="carol").spec
    assert msgspec.json.decode(msgspec.json.encode(spec), type=type(spec)) == spec


# --- rejected documents ------------------------------------------------------------

REJECTIONS = [
    ("unknown-top-level-key", job(priority="high"), "priority", "unknown_key"),
    ("missing-task-roles", job(taskRoles=DELETE), "taskRoles", "required"),
    ("empty-task-roles", job(taskRoles={}), "taskRoles", "minProperties"),
    ("missing-name", job(name=DELETE), "name", "required"),
    ("missing-protocol-version", job(protocolVersion=DELETE), "protocolVersion", "required"),
    ("protocol-version-1", job(protocolVersion=1), "protocolVersion", "enum"),
    ("bad-job-name", job(name="my job!"), "name", "pattern"),
    ("job-name-with-dot", job(name="a.b"), "name", "pattern"),
    ("job-name-too-long", job(name="x" * 256), "name", "maxLength"),
    ("type-not-job", job(type="service"), "type", "enum"),
    ("negative-job-retries", job(jobRetryCount=-3), "jobRetryCount", "minimum"),  # -1 and -2 are OpenPAI's unlimited
    ("job-retries-not-int", job(jobRetryCount="3"), "jobRetryCount", "type"),
    ("parameters-not-mapping", job(parameters=["a"]), "parameters", "type"),
    ("instances-0", job(**{"taskRoles.worker.instances": 0}), "taskRoles.worker.instances", "minimum"),
    ("instances-boolean", job(**{"taskRoles.worker.instances": True}), "taskRoles.worker.instances", "type"),
    ("instances-float", job(**{"taskRoles.worker.instances": 1.5}), "taskRoles.worker.instances", "type"),
    ("negative-gpu", job(**{"taskRoles.worker.resourcePerInstance.gpu": -1}),
     "taskRoles.worker.resourcePerInstance.gpu", "minimum"),
    ("negative-cpu", job(**{"taskRoles.worker.resourcePerInstance.cpu": -2}),
     "taskRoles.worker.resourcePerInstance.cpu", "minimum"),
    ("negative-memory", job(**{"taskRoles.worker.resourcePerInstance.memoryMB": -512}),
     "taskRoles.worker.resourcePerInstance.memoryMB", "minimum"),
    # 0 would read as "no memory limit": refused, naming the field.
    ("zero-memory", job(**{"taskRoles.worker.resourcePerInstance.memoryMB": 0}),
     "taskRoles.worker.resourcePerInstance.memoryMB", "minimum"),
    ("misspelt-resource", job(**{"taskRoles.worker.resourcePerInstance.gpus": 1}),
     "taskRoles.worker.resourcePerInstance.gpus", "unknown_key"),
    ("negative-port-count", job(**{"taskRoles.worker.resourcePerInstance.ports": {"http": -1}}),
     "taskRoles.worker.resourcePerInstance.ports.http", "minimum"),
    ("bad-port-label", job(**{"taskRoles.worker.resourcePerInstance.ports": {"my-port": 1}}),
     "taskRoles.worker.resourcePerInstance.ports.my-port", "pattern"),
    ("docker-image-not-a-prerequisite", job(**{"taskRoles.worker.dockerImage": "missing"}),
     "taskRoles.worker.dockerImage", "unknown_prerequisite"),
    ("data-names-a-docker-image", job(**{"taskRoles.worker.data": "image"}),
     "taskRoles.worker.data", "unknown_prerequisite"),
    ("unknown-key-in-task-role", job(**{"taskRoles.worker.gpu": 1}), "taskRoles.worker.gpu", "unknown_key"),
    ("bad-task-role-name", job(taskRoles={"my-role": BASE_JOB["taskRoles"]["worker"]}), "taskRoles.my-role", "pattern"),
    ("task-role-not-mapping", job(taskRoles={"worker": ["echo"]}), "taskRoles.worker", "type"),
    ("missing-commands", job(**{"taskRoles.worker.commands": DELETE}), "taskRoles.worker.commands", "required"),
    ("empty-commands", job(**{"taskRoles.worker.commands": []}), "taskRoles.worker.commands", "minItems"),
    ("commands-as-one-string", job(**{"taskRoles.worker.commands": "echo hi"}), "taskRoles.worker.commands", "type"),
    ("command-read-as-mapping", job(**{"taskRoles.worker.commands": [{"echo a": "b"}]}),
     "taskRoles.worker.commands[0]", "type"),
    ("negative-task-retries", job(**{"taskRoles.worker.taskRetryCount": -1}), "taskRoles.worker.taskRetryCount",
     "minimum"),
    ("min-failed-below-minus-one", job(**{"taskRoles.worker.completion": {"minFailedInstances": -2}}),
     "taskRoles.worker.completion.minFailedInstances", "minimum"),
    ("min-failed-zero", job(**{"taskRoles.worker.completion": {"minFailedInstances": 0}}),
     "taskRoles.worker.completion.minFailedInstances", "minimum"),
    ("min-succeeded-above-instances", job(**{"taskRoles.worker.completion": {"minSucceededInstances": 3}}),
     "taskRoles.worker.completion.minSucceededInstances", "maximum"),
    ("unknown-completion-key", job(**{"taskRoles.worker.completion": {"maxFailed": 1}}),
     "taskRoles.worker.completion.maxFailed", "unknown_key"),
    ("prerequisite-unknown-type", job(prerequisites=[{"name": "x", "type": "model", "uri": "u"}]),
     "prerequisites[0].type", "enum"),
    ("docker-image-without-uri", job(prerequisites=[{"name": "image", "type": "dockerimage"}]),
     "prerequisites[0].uri", "required"),
    ("unknown-key-in-docker-image", job(prerequisites=[{"name": "image", "type": "dockerimage", "uri": "u",
                                                        "tag": "v1"}]), "prerequisites[0].tag", "unknown_key"),
    ("duplicate-prerequisite-names", job(prerequisites=[BASE_JOB["prerequisites"][0]] * 2),
     "prerequisites[1].name", "duplicate"),
    ("data-uri-not-a-list", job(prerequisites=[*BASE_JOB["prerequisites"], {"name": "d", "type": "data", "uri": "u"}]),
     "prerequisites[1].uri", "type"),
    ("unknown-priority-class", job(**{"extras.hivedScheduler.jobPriorityClass": "urgent"}),
     "extras.hivedScheduler.jobPriorityClass", "enum"),
    ("hived-role-not-in-job", job(**{"extras.hivedScheduler.taskRoles": {"ps": {"skuType": "K80"}}}),
     "extras.hivedScheduler.taskRoles.ps", "unknown_task_role"),
    ("gang-allocation-not-boolean", job(**{"extras.gangAllocation": "yes please"}), "extras.gangAllocation", "type"),
    ("notification-unknown-state", job(**{"extras.jobStatusChangeNotification": {"exploded": True}}),
     "extras.jobStatusChangeNotification.exploded", "enum"),
    ("notify-email-malformed", job(**{"extras.notifyEmails": ["not-an-address"]}), "extras.notifyEmails[0]", "format"),
    ("default-deployment-missing", job(**{"defaults.deployment": "prod"}), "defaults.deployment",
     "unknown_deployment"),
    ("unknown-key-in-defaults", job(**{"defaults.cluster": "a"}), "defaults.cluster", "unknown_key"),
    ("bad-virtual-cluster-name", job(**{"defaults.virtualCluster": "a.b"}), "defaults.virtualCluster", "pattern"),
    ("deployment-for-unknown-role", job(deployments=[{"name": "d", "taskRoles": {"ps": {"preCommands": ["x"]}}}]),
     "deployments[0].taskRoles.ps", "unknown_task_role"),
    ("deployment-without-name", job(deployments=[{"taskRoles": {}}]), "deployments[0].name", "required"),
    ("deployment-empty-pre-commands", job(deployments=[{"name": "d", "taskRoles": {"worker": {"preCommands": []}}}]),
     "deployments[0].taskRoles.worker.preCommands", "minItems"),
    ("unknown-parameter", job(**{"taskRoles.worker.commands": ["echo ok", "echo <% $parameters.nope %>"]}),
     "taskRoles.worker.commands[1]", "unknown_reference"),
    ("unknown-secret", job(**{"taskRoles.worker.commands": ["echo <% $secrets.token %>"]}),
     "taskRoles.worker.commands[0]", "unknown_reference"),
    ("data-not-selected", job(**{"taskRoles.worker.commands": ["wget <% $data.uri[0] %>"]}),
     "taskRoles.worker.commands[0]", "unknown_reference"),
    ("unknown-template-root", job(**{"taskRoles.worker.commands": ["echo <% $env.HOME %>"]}),
     "taskRoles.worker.commands[0]", "unknown_reference"),
]


@pytest.mark.parametrize(("document", "path", "rule"), [r[1:] for r in REJECTIONS], ids=[r[0] for r in REJECTIONS])
def test_invalid_job_is_rejected_naming_the_field_and_the_rule(document, path, rule):
    err = rejection(document)
    assert (path, rule) in rules_by_path(err)
    assert all(e.message for e in err.errors)


@pytest.mark.parametrize(
    ("body", "line"),
    [
        ("protocolVersion: 2\nname: x\ntaskRoles:\n  worker:\n    commands: [echo\n", 6),
        ("protocolVersion: 2\nname: [unclosed\n", 3),
        ("protocolVersion: 2\n\tname: x\n", 2),
    ],
    ids=["unclosed-flow-list", "unclosed-name", "tab-indent"],
)
def test_yaml_syntax_error_names_its_line(body, line):
    err = rejection(body)
    assert [(e.path, e.rule, e.line) for e in err.errors] == [("$", "yaml_syntax", line)]
    assert f"line {line}" in err.errors[0].message


@pytest.mark.parametrize(
    ("body", "content_type", "rule"),
    [
        ("", "text/yaml", "required"),
        ("- just\n- a list\n", "text/yaml", "type"),
        ("just text", "text/yaml", "type"),
        ('{"name": ', "application/json", "json_syntax"),
        (b"name: \xff\xfe", "text/yaml", "encoding"),
        ("name: x", "application/xml", "content_type"),
        ("a: 1\n---\nb: 2\n", "text/yaml", "yaml_syntax"),
    ],
    ids=["empty", "list-document", "scalar-document", "json-syntax", "not-utf8", "unsupported-type", "two-documents"],
)
def test_body_that_is_not_one_job_document_is_rejected_as_a_whole(body, content_type, rule):
    err = rejection(body, content_type=content_type)
    assert [(e.path, e.rule) for e in err.errors] == [("$", rule)]


def test_json_syntax_error_names_its_line():
    err = rejection('{\n  "name": "x",\n  "taskRoles": ,\n}', content_type="application/json")
    assert err.errors[0].line == 3


def test_duplicate_yaml_keys_are_rejected_rather_than_silently_overwritten():
    err = rejection("protocolVersion: 2\nname: a\nname: b\ntaskRoles: {w: {commands: [x]}}\n")
    assert [(e.path, e.rule, e.line) for e in err.errors] == [("name", "duplicate_key", 3)]


def test_alias_bombs_are_refused():
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    err = rejection("\n".join(lines) + "\n")
    assert err.errors[0].rule == "too_complex"


def test_several_problems_are_reported_together_in_document_order_with_lines():
    err = rejection((FIXTURES / "many-errors.yaml").read_bytes())
    assert [(e.path, e.rule, e.line) for e in err.errors] == [
        ("name", "pattern", 3),
        ("priority", "unknown_key", 4),
        ("taskRoles.worker.instances", "minimum", 11),
        ("taskRoles.worker.dockerImage", "unknown_prerequisite", 12),
        ("taskRoles.worker.resourcePerInstance.gpu", "minimum", 14),
        ("taskRoles.worker.commands[0]", "unknown_reference", 16),
    ]


def test_missing_field_points_at_the_line_of_its_parent():
    err = rejection("protocolVersion: 2\nname: x\ntaskRoles:\n  worker:\n    instances: 1\n")
    assert [(e.path, e.rule, e.line) for e in err.errors] == [("taskRoles.worker.commands", "required", 4)]


def test_error_body_is_machine_readable():
    err = rejection((FIXTURES / "many-errors.yaml").read_bytes())
    body = protocol_error_body(err)
    assert body["code"] == "InvalidJobConfigError"
    assert body["message"].startswith("The job config is invalid: name: ")
    assert body["errors"][2] == {"path": "taskRoles.worker.instances", "rule": "minimum",
                                 "message": "must be at least 1, got 0", "line": 11}
    assert json.loads(json.dumps(body)) == body


@pytest.mark.parametrize("as_text", [False, True], ids=["bytes", "str"])
def test_body_over_the_limit_is_too_large(as_text):
    padding = "#" * MAX_BODY_BYTES
    body = yaml.safe_dump(BASE_JOB) + padding
    with pytest.raises(TooLarge) as caught:
        parse_job(body if as_text else body.encode(), user="alice")
    assert caught.value.status == 413


def test_body_just_under_the_limit_is_read():
    body = yaml.safe_dump(BASE_JOB).encode()
    body += b"#" * (MAX_BODY_BYTES - len(body))
    assert len(body) == MAX_BODY_BYTES
    assert parse_job(body, user="alice").spec.name == "demo"
