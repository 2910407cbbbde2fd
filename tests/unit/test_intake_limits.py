"""Intake bounds of the job protocol (libs/common/protocol/limits.py): every bound is a
400 naming the field path and the limit, deep bodies are refused before a loader
recurses into them, and the largest job allowed still fits in one NATS message."""

from __future__ import annotations

import json

import msgspec
import pytest

from libs.common.messages import JobPlaced, JobSubmitted, TaskPlacement, encode
from libs.common.protocol import ProtocolError, limits
from libs.common.records import AttemptRecord, JobRecord, TaskRecord
from tests.unit.test_protocol import BASE_JOB, job, rejection, submit

NATS_MAX_PAYLOAD = 1024 * 1024  # nats-server's default max_payload


def only_error(err: ProtocolError, path: str) -> str:
    """The (rule, message) of the one error at `path`."""
    found = [e for e in err.errors if e.path == path]
    assert found, f"no error at {path}: {[(e.path, e.rule) for e in err.errors]}"
    return f"{found[0].rule}: {found[0].message}"


OVER_THE_LIMIT = [
    ("job-name", job(name="n" * (limits.MAX_JOB_NAME_LENGTH + 1)), "name",
     f"maxLength: a job name is at most {limits.MAX_JOB_NAME_LENGTH} characters"),
    ("job-name-241", job(name="n" * 241), "name", "maxLength"),
    ("virtual-cluster-name", job(**{"defaults.virtualCluster": "v" * (limits.MAX_NAME_LENGTH + 1)}),
     "defaults.virtualCluster", f"at most {limits.MAX_NAME_LENGTH} characters"),
    ("task-role-name", job(taskRoles={"r" * (limits.MAX_TASK_ROLE_NAME_LENGTH + 1): BASE_JOB["taskRoles"]["worker"]}),
     "taskRoles." + "r" * (limits.MAX_TASK_ROLE_NAME_LENGTH + 1), "maxLength"),
    ("instances-million", job(**{"taskRoles.worker.instances": 1_000_000}), "taskRoles.worker.instances",
     f"maximum: must be at most {limits.MAX_INSTANCES_PER_ROLE} (PAI's limit of instances per task role)"),
    ("job-retries-1e30", job(jobRetryCount=10**30), "jobRetryCount",
     f"maximum: must be at most {limits.MAX_JOB_RETRY_COUNT} (PAI's limit of job retries), got a number of about 31"),
    ("task-retries", job(**{"taskRoles.worker.taskRetryCount": limits.MAX_TASK_RETRY_COUNT + 1}),
     "taskRoles.worker.taskRetryCount", f"at most {limits.MAX_TASK_RETRY_COUNT}"),
    ("cpu-1e30", job(**{"taskRoles.worker.resourcePerInstance.cpu": 10**30}),
     "taskRoles.worker.resourcePerInstance.cpu", f"at most {limits.MAX_CPU} (PAI's limit of CPUs"),
    ("gpu-1e9", job(**{"taskRoles.worker.resourcePerInstance.gpu": 10**9}),
     "taskRoles.worker.resourcePerInstance.gpu", f"at most {limits.MAX_GPU} (PAI's limit of GPUs"),
    ("memory", job(**{"taskRoles.worker.resourcePerInstance.memoryMB": limits.MAX_MEMORY_MB + 1}),
     "taskRoles.worker.resourcePerInstance.memoryMB", f"at most {limits.MAX_MEMORY_MB}"),
    ("ports-one-label", job(**{"taskRoles.worker.resourcePerInstance.ports": {"http": 10**6}}),
     "taskRoles.worker.resourcePerInstance.ports.http", f"at most {limits.MAX_PORTS_PER_INSTANCE}"),
    ("ports-in-all", job(**{"taskRoles.worker.resourcePerInstance.ports": {f"p{i}": 30 for i in range(4)}}),
     "taskRoles.worker.resourcePerInstance.ports", f"at most {limits.MAX_PORTS_PER_INSTANCE} ports per task instance"),
    ("shm", job(**{"taskRoles.worker.extraContainerOptions": {"shmMB": 10**30}}),
     "taskRoles.worker.extraContainerOptions.shmMB", "maximum"),
    ("task-roles", job(taskRoles={f"r{i}": BASE_JOB["taskRoles"]["worker"] for i in range(limits.MAX_TASK_ROLES + 1)}),
     "taskRoles", f"maxProperties: a job has at most {limits.MAX_TASK_ROLES} task roles"),
    ("tasks-per-job", job(taskRoles={f"r{i}": {**BASE_JOB["taskRoles"]["worker"], "instances": 200} for i in range(3)}),
     "taskRoles", f"maxTasks: a job has at most {limits.MAX_TASKS_PER_JOB} tasks in all (PAI's limit), got 600"),
    ("commands", job(**{"taskRoles.worker.commands": ["echo " + "x" * limits.MAX_COMMANDS_CHARS_PER_ROLE]}),
     "taskRoles.worker.commands", f"at most {limits.MAX_COMMANDS_CHARS_PER_ROLE} characters"),
]


@pytest.mark.parametrize(("document", "path", "expected"), [c[1:] for c in OVER_THE_LIMIT],
                         ids=[c[0] for c in OVER_THE_LIMIT])
def test_each_bound_is_a_rejection_naming_the_path_and_the_limit(document, path, expected):
    assert expected in only_error(rejection(document), path)


def test_bounds_themselves_are_allowed():
    at_the_limit = job(
        name="n" * limits.MAX_JOB_NAME_LENGTH,
        jobRetryCount=limits.MAX_JOB_RETRY_COUNT,
        **{
            "taskRoles.worker.instances": limits.MAX_INSTANCES_PER_ROLE,
            "taskRoles.worker.taskRetryCount": limits.MAX_TASK_RETRY_COUNT,
            "taskRoles.worker.resourcePerInstance": {"cpu": limits.MAX_CPU, "memoryMB": limits.MAX_MEMORY_MB,
                                                     "gpu": limits.MAX_GPU, "ports": {"a": 50, "b": 50}},
        },
    )
    spec = submit(at_the_limit).spec
    assert spec.task_count == limits.MAX_TASKS_PER_JOB


def test_a_parameter_named_a_thousand_times_cannot_blow_up_the_commands():
    document = job(parameters={"big": "x" * 100_000},
                   **{"taskRoles.worker.commands": ["echo <% $parameters.big %>"] * 1000})
    assert "maxLength" in only_error(rejection(document), "taskRoles.worker.commands")


def test_deployment_commands_count_towards_every_role():
    hooks = {"preCommands": ["echo " + "p" * 40_000], "postCommands": ["echo " + "q" * 30_000]}
    document = job(deployments=[{"name": "d", "taskRoles": {"worker": hooks}}], defaults={"deployment": "d"})
    assert "maxLength" in only_error(rejection(document), "taskRoles.worker.commands")


def test_the_whole_normalised_job_is_bounded():
    # Each role's commands are under their limit; together they are not.
    line = "echo " + "x" * (limits.MAX_COMMANDS_CHARS_PER_ROLE - 100)
    roles = {f"r{i}": {"instances": 1, "commands": [line]} for i in range(5)}
    err = rejection(json.dumps(job(taskRoles=roles)), content_type="application/json")
    assert [(e.path, e.rule) for e in err.errors] == [("$", "maxSize")]
    assert str(limits.MAX_SPEC_BYTES) in err.errors[0].message


@pytest.mark.parametrize("content_type", ["text/yaml", "application/json"])
@pytest.mark.parametrize("opening", ["[", "{\"a\": "], ids=["lists", "mappings"])
def test_deep_flow_nesting_is_refused_before_loading(content_type, opening):
    # 30,000 levels took the whole of rest down (PyYAML's C composer).
    closing = "]" if opening == "[" else "}"
    body = opening * 30_000 + "1" + closing * 30_000
    err = rejection(body, content_type=content_type)
    assert [(e.path, e.rule) for e in err.errors] == [("$", "max_depth")]
    assert f"more than {limits.MAX_NESTING_DEPTH} levels" in err.errors[0].message


def test_deep_block_nesting_is_refused_before_loading():
    body = "".join(" " * i + f"k{i}:\n" for i in range(500)) + " " * 500 + "v\n"
    err = rejection(body)
    assert [(e.path, e.rule, e.line) for e in err.errors] == [("$", "max_depth", limits.MAX_NESTING_DEPTH + 1)]


def test_block_sequences_on_one_line_count_as_nesting():
    err = rejection("- " * 30_000 + "x\n")
    assert err.errors[0].rule == "max_depth"


@pytest.mark.parametrize("content_type", ["text/yaml", "application/json"])
def test_an_integer_of_thousands_of_digits_is_a_rejection_not_a_crash(content_type):
    body = json.dumps(job()).replace('"type": "job"', '"type": "job", "jobRetryCount": ' + "9" * 5000)
    err = rejection(body, content_type=content_type)
    assert err.errors[0].path == "$" and "4300 digits" in err.errors[0].message


def test_the_largest_job_allowed_fits_in_one_nats_message_at_every_hop():
    # As large as the bounds let a job be: longest names, most tasks, commands up to the size bound.
    roles = {}
    for r in range(limits.MAX_TASK_ROLES):
        name = f"r{r:02d}" + "x" * (limits.MAX_TASK_ROLE_NAME_LENGTH - 3)
        roles[name] = {"instances": 1, "commands": ["echo " + "c" * 3_400],
                       "resourcePerInstance": {"cpu": 8, "gpu": 8, "memoryMB": 4096,
                                               "ports": {"p" * 60: 1, "q" * 60: 1}}}
    roles[next(iter(roles))]["instances"] = limits.MAX_TASKS_PER_JOB - (limits.MAX_TASK_ROLES - 1)
    spec = submit(job(name="n" * limits.MAX_JOB_NAME_LENGTH, taskRoles=roles),
                  user="u" * limits.MAX_USERNAME_LENGTH).spec
    assert spec.task_count == limits.MAX_TASKS_PER_JOB
    assert len(msgspec.json.encode(spec)) > limits.MAX_SPEC_BYTES * 0.8  # near the bound, not a toy
    jid = f"{spec.user}~{spec.name}"
    submitted = encode(JobSubmitted(id=f"{jid}/submitted", job=jid, at=1.0, spec=spec))
    node = "node-" + "0" * 40
    tasks = [(role.name, i) for role in spec.taskRoles for i in range(role.instances)]
    placements = [TaskPlacement(role=role, index=i, node=node, hostIp="10.200.200.200", gpus=list(range(8)),
                                leafCells=[f"rack-00/{node}/gpu-{g}" for g in range(8)], skuType="A100-80G")
                  for role, i in tasks]
    placed = encode(JobPlaced(id=f"{jid}/1/placed", job=jid, vc="v" * limits.MAX_NAME_LENGTH, attempt=1,
                              tasks=placements))
    running = [TaskRecord(role=p.role, index=p.index, node=p.node, hostIp=p.hostIp, gpus=p.gpus,
                          leafCells=p.leafCells, ports={"p" * 60: [20001], "q" * 60: [20002]},
                          logPath=f"/var/lib/pai/launcher/tasks/{jid}/1/{p.role}/{p.index}/0/output.log",
                          runtimeDetail="limits: cgroup v2 (cpu 8, memory 4096 MiB)", launchedTime=1.0)
               for p in placements]
    status = msgspec.json.encode(JobRecord(job=jid, name=spec.name, user=spec.user, vc="default", spec=spec,
                                           attempts=[AttemptRecord(attempt=1, tasks=running)]))
    sizes = {"job.submitted": len(submitted), "job.placed": len(placed), "job status document": len(status)}
    assert all(size < NATS_MAX_PAYLOAD for size in sizes.values()), sizes

