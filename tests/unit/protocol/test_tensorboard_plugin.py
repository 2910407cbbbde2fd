"""OpenPAI's tensorboard plugin: its parameters checked naming the field, what rest folds
into the job (a port and the step in the first role's first task), and the step run by a
shell: TensorBoard started in the background with the job's directories, or the task
failed naming what is missing."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from libs.common.exitspecs import RUNTIME_PLUGIN_FAILED_EXIT_CODE
from libs.common.protocol import ProtocolError, parse_job, tensorboard


def job(parameters: str, extra: str = "") -> str:
    return ("protocolVersion: 2\nname: j\ntype: job\ntaskRoles:\n"
            "  a:\n    instances: 2\n    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}\n    commands: [train]\n"
            "  b:\n    instances: 1\n    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}\n    commands: [serve]\n"
            "extras:\n  com.microsoft.pai.runtimeplugin:\n    - plugin: tensorboard\n"
            f"      parameters: {parameters}\n{extra}")


@pytest.mark.parametrize(("parameters", "path", "rule"), [
    ("{logdir: 3}", "parameters.logdir", "type"),
    ("{logdir: {}}", "parameters.logdir", "minItems"),
    ("{logdir: {'a:b': /x}}", "parameters.logdir.a:b", "pattern"),
    ("{logdir: '/x,/y'}", "parameters.logdir", "format"),
    ("{logdir: /x, host: 0.0.0.0}", "parameters.host", "unknown"),
], ids=["not-a-mapping", "empty", "bad-run-name", "comma-in-dir", "unknown-parameter"])
def test_malformed_parameters_are_refused_naming_the_field(parameters, path, rule):
    with pytest.raises(ProtocolError) as refused:
        parse_job(job(parameters), user="alice")
    assert any(e.path.endswith(path) and e.rule.startswith(rule) for e in refused.value.errors), refused.value.errors


@pytest.mark.parametrize(("parameters", "logdirs"), [
    ("{logdir: {path: /mnt/tensorboard}, port: 10053}", {"path": "/mnt/tensorboard"}),  # OpenPAI's portal
    ("{logdir: [/mnt/a, /mnt/b]}", {"run0": "/mnt/a", "run1": "/mnt/b"}),
    ("{logdir: tb}", {"logs": "tb"}),
    ("{}", tensorboard.DEFAULT_LOGDIR),
], ids=["openpai-mapping", "list", "string", "default"])
def test_the_plugin_is_run_its_fixed_port_noted(parameters, logdirs):
    parsed = parse_job(job(parameters), user="alice")
    assert not [f for f in parsed.spec.ignoredFields if f.endswith("runtimeplugin[0]")]
    assert parsed.spec.ignoredFields == (["extras.com.microsoft.pai.runtimeplugin[0].parameters.port"]
                                         if "port" in parameters else [])
    request = tensorboard.tensorboard_request(parsed.config)
    assert request is not None and request.logdirs == logdirs


def test_rest_folds_it_into_the_first_selected_role_with_a_port():
    parsed = parse_job(job("{logdir: tb}", "      taskroles: [b]\n"), user="alice")
    request = tensorboard.tensorboard_request(parsed.config)
    assert request is not None
    spec = tensorboard.with_tensorboard(parsed.spec, request)
    a, b = spec.role("a"), spec.role("b")
    assert a.commands == ["train"] and a.resources.ports == {}
    assert b.resources.ports == {"tensorboard": 1} and b.commands[-1] == "serve" and len(b.commands) == 2
    assert tensorboard.serving_task(spec) == "b"
    assert tensorboard.serving_task(parsed.spec) is None
    default = tensorboard.with_tensorboard(parsed.spec, tensorboard.TensorBoardRequest(logdirs={"x": "tb"}))
    assert tensorboard.serving_task(default) == "a"  # OpenPAI's: the first role


def step_of(parameters: str) -> str:
    parsed = parse_job(job(parameters), user="alice")
    request = tensorboard.tensorboard_request(parsed.config)
    assert request is not None
    return tensorboard.with_tensorboard(parsed.spec, request).role("a").commands[0]


def run(step: str, tmp_path: Path, path: str, index: str = "0", **env: str) -> subprocess.CompletedProcess[str]:
    environment = {"PATH": path, "PAI_WORK_DIR": str(tmp_path), "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": index,
                   "PAI_CONTAINER_HOST_IP": "127.0.0.1", "PAI_CONTAINER_HOST_tensorboard_PORT_LIST": "16006", **env}
    return subprocess.run(["sh", "-e", "-c", f"{step}\necho main ran\nwait"], capture_output=True, text=True,
                          timeout=30, cwd=tmp_path, env=environment)


def stand_in(where: Path) -> Path:
    """A `tensorboard` that records its arguments (the step's contract, not TensorBoard's)."""
    where.mkdir(parents=True, exist_ok=True)
    tool = where / "tensorboard"
    tool.write_text('#!/bin/sh\necho "$@" > "$PAI_WORK_DIR/args"\n')
    tool.chmod(0o755)
    return tool


def args_of(work: Path) -> list[str]:
    """What the stand-in was started with: it runs in the background, so it may come a moment later."""
    for _ in range(200):
        if (work / "args").exists() and (work / "args").read_text().endswith("\n"):
            return (work / "args").read_text().split()
        time.sleep(0.02)
    raise AssertionError("the stand-in TensorBoard was not started")


def test_the_step_starts_tensorboard_over_the_directories_on_the_tasks_port(tmp_path: Path):
    stand_in(tmp_path / "bin")
    done = run(step_of("{logdir: {one: tb/one, two: /tmp/pai-tb-two}}"), tmp_path, f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert done.returncode == 0, done.stderr
    assert "main ran" in done.stdout and "TensorBoard" in done.stdout
    assert args_of(tmp_path) == [
        "--logdir_spec", "one:tb/one,two:/tmp/pai-tb-two", "--host", "127.0.0.1", "--port", "16006"]
    assert (tmp_path / "tb" / "one").is_dir()  # made, relative to the working directory


def test_the_platforms_tensorboard_is_used_where_the_task_has_none(tmp_path: Path):
    tool = stand_in(tmp_path / "platform")
    done = run(step_of("{logdir: tb}"), tmp_path, "/usr/bin:/bin", PAI_TENSORBOARD=str(tool))
    assert done.returncode == 0, done.stderr
    assert args_of(tmp_path)[:2] == ["--logdir", "tb"]


def test_only_the_first_task_runs_it(tmp_path: Path):
    stand_in(tmp_path / "bin")
    done = run(step_of("{logdir: tb}"), tmp_path, f"{tmp_path / 'bin'}:/usr/bin:/bin", index="1")
    assert done.returncode == 0 and "main ran" in done.stdout
    assert not (tmp_path / "args").exists()


def test_without_tensorboard_the_task_fails_naming_it_before_its_commands(tmp_path: Path):
    done = run(step_of("{logdir: tb}"), tmp_path, "/usr/bin:/bin")
    assert done.returncode == RUNTIME_PLUGIN_FAILED_EXIT_CODE
    assert "main ran" not in done.stdout
    assert "no TensorBoard in this task" in done.stderr and "pip install tensorboard" in done.stderr
    assert "runtime plugin failed: runtime plugin tensorboard" in done.stderr


def test_failure_policy_ignore_runs_the_job_without_it(tmp_path: Path):
    step = step_of("{logdir: tb}\n      failurePolicy: ignore")
    done = run(step, tmp_path, "/usr/bin:/bin")
    assert done.returncode == 0 and "main ran" in done.stdout
    assert "no TensorBoard in this task" in done.stderr


def test_a_tensorboard_that_ends_says_so_in_the_tasks_log(tmp_path: Path):
    where = tmp_path / "bin"
    where.mkdir()
    (where / "tensorboard").write_text('#!/bin/sh\necho "TensorBoard could not bind to port 16006" >&2\nexit 1\n')
    (where / "tensorboard").chmod(0o755)
    done = run(step_of("{logdir: tb}"), tmp_path, f"{where}:/usr/bin:/bin")
    assert done.returncode == 0 and "main ran" in done.stdout  # the task goes on without it
    assert "TensorBoard ended (exit code 1)" in done.stderr
    assert "could not bind to port 16006" in done.stderr  # its own last lines, in the task's log


def test_in_a_network_of_its_own_it_listens_on_all_the_tasks_addresses(tmp_path: Path):
    """A Pod on the Pod network: the node's address is not one of its own (TensorBoard says
    so); its port reaches it through hostPort on any of the Pod's addresses."""
    where = tmp_path / "bin"
    where.mkdir()
    (where / "tensorboard").write_text(
        '#!/bin/sh\ncase "$*" in *"--host 0.0.0.0"*) echo "$@" > "$PAI_WORK_DIR/args";; *)\n'
        'echo "TensorBoard could not bind to unavailable address 10.0.0.9" >&2; exit 1;; esac\n')
    (where / "tensorboard").chmod(0o755)
    done = run(step_of("{logdir: tb}"), tmp_path, f"{where}:/usr/bin:/bin", PAI_CONTAINER_HOST_IP="10.0.0.9")
    assert done.returncode == 0, done.stderr
    assert args_of(tmp_path)[2:6] == ["--host", "0.0.0.0", "--port", "16006"]
    assert "a network of its own" in done.stderr
