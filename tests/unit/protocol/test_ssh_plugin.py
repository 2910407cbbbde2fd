"""OpenPAI's ssh plugin: its parameters checked naming the field, and what rest folds
into the roles (a port, the server's step reading the sealed key, the keys trusted)."""

from __future__ import annotations

import pytest

from libs.common.protocol import ProtocolError, parse_job, ssh

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ3hJk6G0tQ6l2F2p2Yd8m6Gf8m3N2rQ5X3l8i0yq7Qe"


def job(parameters: str, roles: str = "") -> str:
    return ("protocolVersion: 2\nname: j\ntype: job\ntaskRoles:\n"
            "  a:\n    instances: 1\n    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}\n    commands: [train]\n"
            "  b:\n    instances: 2\n    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}\n    commands: [serve]\n"
            "extras:\n  com.microsoft.pai.runtimeplugin:\n    - plugin: ssh\n"
            f"      parameters: {parameters}\n{roles}")


@pytest.mark.parametrize(("parameters", "path", "rule"), [
    ("{jobssh: 'yes'}", "parameters.jobssh", "type"),
    ("{userssh: {type: custom, value: 'not a key'}}", "parameters.userssh.value", "format"),
    (f"{{userssh: {{type: custom, value: 'command=\"sh\" {KEY}'}}}}", "parameters.userssh.value", "format"),
    ("{userssh: {type: mine, value: x}}", "parameters.userssh.type", "enum"),
    ("{jobssh: true, port: 22}", "parameters.port", "unknown"),
], ids=["jobssh-not-bool", "not-a-key", "key-with-options", "userssh-type", "unknown-parameter"])
def test_malformed_parameters_are_refused_naming_the_field(parameters, path, rule):
    with pytest.raises(ProtocolError) as refused:
        parse_job(job(parameters), user="alice")
    assert any(e.path.endswith(path) and e.rule.startswith(rule) for e in refused.value.errors), refused.value.errors


def test_the_plugin_is_run_not_reported_as_ignored():
    parsed = parse_job(job(f"{{jobssh: true, userssh: {{type: custom, value: '{KEY} me@laptop'}}}}"), user="alice")
    assert parsed.warnings == [] and parsed.spec.ignoredFields == []
    request = ssh.ssh_request(parsed.config)
    assert request == ssh.SshRequest(jobssh=True, userKey=KEY)


def test_rest_folds_the_server_into_the_roles_it_selects():
    parsed = parse_job(job("{jobssh: true}", "      taskroles: [b]\n"), user="alice")
    request = ssh.ssh_request(parsed.config)
    assert request is not None
    _, public = ssh.generate_key_pair("pai-job-alice~j")
    spec = ssh.with_ssh(parsed.spec, request, public, [KEY, KEY])
    a, b = spec.role("a"), spec.role("b")
    assert a.commands == ["train"] and "ssh" not in a.resources.ports
    assert b.resources.ports == {"ssh": 1} and b.commands[-1] == "serve"
    step = b.commands[0]
    assert f"<% $secrets.{ssh.SECRET_NAME} %>" in step  # the private key only as the sealed secret's reference
    assert "PRIVATE KEY" not in step
    trusted = step.split('"$d/authorized_keys"')[0].rsplit("printf", 1)[1]
    assert public.rsplit(" ", 1)[0] in trusted and trusted.count(KEY) == 1  # the job's key, the profile's once
    assert "AllowUsers alice" in step and "PasswordAuthentication no" in step


def test_profile_keys_are_the_extensions_valid_keys():
    extension = {"sshKeys": [{"title": "laptop", "value": KEY}, "not a key", {"value": f"{KEY}\nssh-rsa AAAA"}, KEY]}
    assert ssh.profile_keys(extension) == [KEY]
    assert ssh.profile_keys({}) == []
