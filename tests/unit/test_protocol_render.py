"""Rendering of command templates and deployments, and keeping secrets out of
what PAI shows back (config and error messages)."""

from __future__ import annotations

import json

import msgspec
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from libs.common.protocol import ParsedJob, ProtocolError, parse_job, protocol_error_body
from libs.common.protocol.render import has_secret_references, render_secrets
from tests.unit.test_protocol import DELETE, FIXTURES, job, rejection, submit

PARAMETERS = {
    "model": "resnet",
    "batch": 32,
    "lr": 0.5,
    "amp": True,
    "empty": None,
    "opt": {"name": "adam", "betas": [0.9, 0.99]},
    "with-dash": "ok",
}


def commands_of(parsed: ParsedJob, role: str = "worker") -> list[str]:
    return parsed.spec.role(role).commands


@pytest.mark.parametrize(
    ("template", "rendered"),
    [
        ("run <% $parameters.model %>", "run resnet"),
        ("run <%$parameters.model%>", "run resnet"),
        ("run <%   $parameters.model   %>", "run resnet"),
        ("--batch=<% $parameters.batch %> --lr=<% $parameters.lr %>", "--batch=32 --lr=0.5"),
        ("--amp=<% $parameters.amp %>", "--amp=true"),
        ("[<% $parameters.empty %>]", "[]"),
        ("--opt=<% $parameters.opt.name %>", "--opt=adam"),
        ("--beta2=<% $parameters.opt.betas[1] %>", "--beta2=0.99"),
        ("--betas=<% $parameters.opt.betas %>", "--betas=0.9,0.99"),
        ("<% $parameters.with-dash %>", "ok"),
        ("echo $PAI_WORK_DIR ${HOME} <% not a reference %>", "echo $PAI_WORK_DIR ${HOME} <% not a reference %>"),
    ],
    ids=["spaced", "openpai-no-spaces", "extra-spaces", "numbers", "boolean", "null", "nested-key", "list-index",
         "list-joined", "dash-in-name", "shell-variables-untouched"],
)
def test_parameters_are_rendered_into_commands(template, rendered):
    parsed = submit(job(parameters=PARAMETERS, **{"taskRoles.worker.commands": [template]}))
    assert commands_of(parsed) == [rendered]


def test_a_mapping_parameter_renders_as_json():
    parsed = submit(job(parameters=PARAMETERS, **{"taskRoles.worker.commands": ["cfg='<% $parameters.opt %>'"]}))
    assert json.loads(commands_of(parsed)[0][5:-1]) == PARAMETERS["opt"]


def test_prerequisite_fields_of_the_selected_data_script_and_output_are_rendered():
    parsed = submit(job(
        prerequisites=[
            *job()["prerequisites"],
            {"name": "mnist", "type": "data", "uri": ["http://d/0.tgz", "http://d/1.tgz"]},
            {"name": "code", "type": "script", "uri": "https://git/code.git", "version": "abc123"},
            {"name": "models", "type": "output", "uri": "s3://models"},
        ],
        **{
            "taskRoles.worker.data": "mnist",
            "taskRoles.worker.script": "code",
            "taskRoles.worker.output": "models",
            "taskRoles.worker.commands": [
                "wget <% $data.uri[1] %> -P data_<% $data.name %>",
                "git clone <% $script.uri %> && git checkout <% $script.version %>",
                "cp -r out <% $output.uri %>/<% $output.name %>",
            ],
        },
    ))
    assert commands_of(parsed) == [
        "wget http://d/1.tgz -P data_mnist",
        "git clone https://git/code.git && git checkout abc123",
        "cp -r out s3://models/models",
    ]


def test_active_deployment_wraps_commands_with_its_pre_and_post_commands():
    parsed = parse_job((FIXTURES / "distributed-training.yaml").read_bytes(), user="alice")
    spec = parsed.spec
    worker = [render_secrets(line, parsed.secrets) for line in spec.role("worker").commands]
    ps = spec.role("ps").commands
    assert spec.role("worker").commands[0] == "export STORAGE_KEY=<% $secrets.storage_key %>"
    assert worker[0] == "export STORAGE_KEY=s3cr3t-Storage-Key"
    assert worker[1] == "wget https://data.example.com/imagenet/train.tar -O data/train.tar"
    assert worker[3].startswith("python train.py --model=resnet50 --optimizer=sgd --lr=0.1 --epochs=90 --amp=true")
    assert worker[-1] == "upload --key s3cr3t-Storage-Key checkpoints/ s3://vision/checkpoints"
    assert ps == ["git clone https://git.example.com/vision/train.git code", "python ps.py --model resnet50"]


def test_another_deployment_is_chosen_through_defaults():
    document = yaml.safe_load((FIXTURES / "distributed-training.yaml").read_bytes())
    document["defaults"]["deployment"] = "onprem"
    spec = submit(document).spec
    assert spec.role("worker").commands[0] == "cp /mnt/imagenet/train.tar data/train.tar"
    assert spec.role("ps").commands == ["python ps.py --model resnet50"]  # onprem has nothing for ps


def test_without_an_active_deployment_only_the_commands_run():
    document = yaml.safe_load((FIXTURES / "distributed-training.yaml").read_bytes())
    del document["defaults"]["deployment"]
    assert len(submit(document).spec.role("worker").commands) == 1


def test_unknown_reference_in_the_active_deployment_names_that_line():
    err = rejection(job(
        deployments=[{"name": "d", "taskRoles": {"worker": {"postCommands": ["echo ok", "up <% $secrets.key %>"]}}}],
        **{"defaults.deployment": "d"},
    ))
    assert [(e.path, e.rule) for e in err.errors] == [
        ("deployments[0].taskRoles.worker.postCommands[1]", "unknown_reference")]


def test_unknown_reference_message_names_what_is_missing():
    err = rejection(job(parameters={"lr": 1}, **{"taskRoles.worker.commands": ["run <% $parameters.epochs %>"]}))
    assert "epochs" in err.errors[0].message and "parameters" in err.errors[0].message


# --- secrets -------------------------------------------------------------------------

SECRET = "hunter2-Very-Secret"


def test_secrets_stay_references_in_the_spec_and_reach_the_launcher_apart():
    parsed = submit(job(secrets={"token": SECRET, "nested": {"key": "k-" + SECRET}},
                        parameters={"user": "bob"},
                        **{"taskRoles.worker.commands": [
                            "login <%$secrets.token%> <% $secrets.nested.key %> <% $parameters.user %>"]}))
    # Parameters render at intake; secret references stay, canonically spelled.
    assert commands_of(parsed) == ["login <% $secrets.token %> <% $secrets.nested.key %> bob"]
    assert SECRET not in msgspec.json.encode(parsed.spec).decode()
    # The values travel apart, to be sealed; the launcher fills them in.
    assert parsed.secrets == {"token": SECRET, "nested": {"key": "k-" + SECRET}}
    assert [render_secrets(line, parsed.secrets) for line in commands_of(parsed)] == [f"login {SECRET} k-{SECRET} bob"]
    assert parsed.config["secrets"] == {"token": "******", "nested": {"key": "******"}}
    assert SECRET not in json.dumps(parsed.config)
    assert SECRET not in " ".join(parsed.warnings)


def test_a_job_that_uses_no_secret_carries_none():
    parsed = submit(job(secrets={"token": SECRET}, **{"taskRoles.worker.commands": ["echo hi"]}))
    assert parsed.secrets == {} and not has_secret_references(commands_of(parsed))
    assert submit(job(**{"taskRoles.worker.commands": ["echo $secrets <% $parameters.x %>"]},
                      parameters={"x": 1})).secrets == {}


@pytest.mark.parametrize(
    ("line", "secrets", "rendered"),
    [
        ("a <% $secrets.s %> b", {"s": "v"}, "a v b"),
        ("<% $secrets.list[1] %>", {"list": ["x", "y"]}, "y"),
        ("<% $secrets.missing %> kept", {"s": "v"}, "<% $secrets.missing %> kept"),
        ("<% $parameters.p %> not ours", {"s": "v"}, "<% $parameters.p %> not ours"),
        ("<% $secrets %>", {"s": True}, '{"s":true}'),
    ],
    ids=["plain", "index", "unknown-left", "other-root-left", "whole-mapping"],
)
def test_render_secrets_fills_in_only_secret_references(line, secrets, rendered):
    assert render_secrets(line, secrets) == rendered


def test_registry_password_is_masked_in_the_config():
    parsed = parse_job((FIXTURES / "distributed-training.yaml").read_bytes(), user="alice")
    assert parsed.config["prerequisites"][0]["auth"]["password"] == "******"
    dumped = json.dumps(parsed.config)
    assert "s3cr3t-Storage-Key" not in dumped and "reg-Pa55word" not in dumped


def test_config_keeps_everything_but_the_secret_values():
    document = yaml.safe_load((FIXTURES / "distributed-training.yaml").read_bytes())
    config = submit(document).config
    assert {k: v for k, v in config.items() if k not in ("secrets", "prerequisites")} == {
        k: v for k, v in document.items() if k not in ("secrets", "prerequisites")}
    assert config["prerequisites"][1:] == document["prerequisites"][1:]


def test_secret_values_never_appear_in_error_messages():
    # The job name holds the secret by mistake: the message about it must not repeat it.
    err = rejection(job(name=f"{SECRET} oops", secrets={"token": SECRET}))
    body = json.dumps(protocol_error_body(err))
    assert SECRET not in body and SECRET not in str(err)
    assert "******" in body


# --- invariants --------------------------------------------------------------------

SAFE_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40).filter(
    lambda s: "<%" not in s and "%>" not in s)
KEY = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,12}", fullmatch=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=KEY, value=SAFE_TEXT, prefix=SAFE_TEXT)
def test_any_string_parameter_renders_verbatim(name, value, prefix):
    command = f"{prefix}<% $parameters.{name} %>"
    parsed = submit(job(parameters={name: value}, **{"taskRoles.worker.commands": [command]}))
    assert commands_of(parsed) == [prefix + value]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=6, max_size=30).filter(
    lambda s: s.strip() == s and "<%" not in s))
def test_any_secret_is_masked_in_config_and_errors(secret):
    document = job(secrets={"s": secret}, **{"taskRoles.worker.commands": ["use <% $secrets.s %>"]})
    # A "secret" that is also ordinary text of the document (e.g. "memory")
    # cannot tell masking apart from that text.
    assume(secret not in yaml.safe_dump(job(secrets={"s": "******"}), allow_unicode=True))
    parsed = submit(document)
    assert commands_of(parsed) == ["use <% $secrets.s %>"]
    assert [render_secrets(line, parsed.secrets) for line in commands_of(parsed)] == [f"use {secret}"]
    assert secret not in yaml.safe_dump(parsed.config, allow_unicode=True)
    err = rejection({**document, "name": f"{secret} !"})  # never a valid name
    assert all(secret not in e.message for e in err.errors)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12,
)
SECTIONS = ["name", "prerequisites", "parameters", "secrets", "taskRoles", "taskRoles.worker",
            "taskRoles.worker.completion", "taskRoles.worker.resourcePerInstance", "taskRoles.worker.commands",
            "deployments", "defaults", "extras", "extras.hivedScheduler", "extras.jobStatusChangeNotification"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(section=st.sampled_from(SECTIONS), value=JSON_VALUES)
def test_any_shape_in_any_section_is_either_accepted_or_rejected_with_field_errors(section, value):
    document = job(**{section: value})
    try:
        parsed = submit(document)
    except ProtocolError as err:
        assert err.errors and all(e.path and e.rule and e.message for e in err.errors)
    else:
        assert parsed.spec.taskRoles


@settings(max_examples=200, deadline=None)
@given(body=st.text(max_size=200))
def test_arbitrary_text_never_crashes_the_parser(body):
    try:
        parse_job(body, user="alice")
    except ProtocolError as err:
        assert err.errors


def test_removing_a_required_role_field_is_reported_not_crashed():
    err = rejection(job(**{"taskRoles.worker.commands": DELETE, "taskRoles.worker.instances": "two"}))
    assert {(e.path, e.rule) for e in err.errors} == {
        ("taskRoles.worker.commands", "required"), ("taskRoles.worker.instances", "type")}
