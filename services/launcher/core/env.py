"""The environment a task sees: OpenPAI's PAI_* variables, computed from the placement.

Pure, shared by every backend (local processes and Kubernetes Pods get the same
variables). Names follow OpenPAI's runtime:

- `PAI_JOB_NAME`: the job id `user~name`, as OpenPAI sets it;
- `PAI_USER_NAME`, `PAI_VIRTUAL_CLUSTER`;
- `PAI_TASK_ROLE_LIST`: role names, comma-separated, in the job's order;
- `PAI_TASK_ROLE_TASK_COUNT_<role>`: instances of each role;
- `PAI_CURRENT_TASK_ROLE_NAME`, `PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX`;
- `PAI_HOST_IP_<role>_<i>` and `PAI_PORT_LIST_<role>_<i>_<label>` (comma-separated
  ports) for every placed task of the job;
- `PAI_TASK_ROLE_<role>_HOST_LIST`: comma-separated, one entry per placed task in
  index order. OpenPAI writes `ip:port` with the first port of the `http` label
  (its rest server always reserves `http` and `ssh` ports). PAI reserves only the
  ports a job asks for, so the entry is `ip:port` with the first port of `http`
  when the role declares that label, else of the role's first declared label,
  else the bare `ip`;
- `PAI_TASK_ROLE_INSTANCES`: `role:index` of every placed task, comma-separated;
- `PAI_JOB_ATTEMPT_ID` (from 1, as the API shows attempts) and
  `PAI_TASK_ATTEMPT_ID` (from 0, bumped by each retry of the task alone);
- `CUDA_VISIBLE_DEVICES`: the placed GPU indices, comma-separated; empty when
  the task got no GPU, so that it cannot use any GPU of the node;
- `PAI_GPU_COUNT`: how many GPUs were placed.

With `gangAllocation: false` a task starts before its peers are placed; it sees
the addresses of the tasks placed so far only (OpenPAI does the same: peers
without an IP are left out).

The rest of OpenPAI's list, as its rest server (runtime-env.js, k8s.js) and runtime
(framework_parser.py genenv) write it:

- job: `PAI_FRAMEWORK_NAME` (the job id), `PAI_DEFAULT_FS_URI` (empty, as OpenPAI
  sets it), `PAI_TASK_ROLE_COUNT`, `PAI_JOB_TASK_COUNT`, and the older names
  `PAI_USERNAME`, `PAI_TASKS_NUM`, `PAI_TASK_ROLES_NUM`, `PAI_JOB_TASK_ROLE_COUNT`,
  `PAI_JOB_TASK_ROLE_LIST`;
- each role: `PAI_RESOURCE_<role>` (`gpu,cpu,memoryMB,shmMB`, shmMB 0 when the job
  sets none, as OpenPAI writes it), `PAI_MIN_FAILED_TASK_COUNT_<role>`,
  `PAI_MIN_SUCCEEDED_TASK_COUNT_<role>` (the completion policy's counts);
- each placed task and port label: `PAI_<role>_<i>_<label>_PORT` (the same list
  as `PAI_PORT_LIST_<role>_<i>_<label>`);
- the task itself: `PAI_TASK_INDEX` and `PAI_TASK_ROLE_INDEX` (its index in its
  role), `PAI_TASK_ROLE_NO` (its role's place in the job), `PAI_CURRENT_CONTAINER_IP`
  and `PAI_CONTAINER_HOST_IP` (its node's address), `PAI_CONTAINER_HOST_<label>_PORT_LIST`
  per label and `PAI_CONTAINER_HOST_PORT_LIST` (`label:p1,p2;` for each label),
  `PAI_CURRENT_CONTAINER_PORT`/`PAI_CONTAINER_HOST_PORT` (its first `http` port) and
  `PAI_CONTAINER_SSH_PORT` (its first `ssh` port) where it has those labels, and the
  role's own figures under OpenPAI's older names (`PAI_CURRENT_TASK_ROLE_TASK_COUNT`,
  `_CPU_COUNT`, `_MEM_MB`, `_SHM_MB`, `_GPU_COUNT`, `_MIN_FAILED_TASK_COUNT`,
  `_MIN_SUCCEEDED_TASK_COUNT`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from libs.common.protocol.model import JobSpec, TaskRole

HOST_LIST_PREFERRED_LABEL = "http"


class PeerAddress(msgspec.Struct, frozen=True, kw_only=True):
    """Where one task of the job can be reached."""

    hostIp: str
    ports: dict[str, list[int]] = {}


def host_list_label(role: TaskRole) -> str | None:
    """The port label whose first port goes into the role's host list, if any."""
    labels = list(role.resources.ports)
    if HOST_LIST_PREFERRED_LABEL in labels:
        return HOST_LIST_PREFERRED_LABEL
    return labels[0] if labels else None


def host_list_entry(address: PeerAddress, label: str | None) -> str:
    ports = address.ports.get(label, []) if label is not None else []
    return f"{address.hostIp}:{ports[0]}" if ports else address.hostIp


def peers_env(*, spec: JobSpec, job: str, peers: Mapping[tuple[str, int], PeerAddress]) -> dict[str, str]:
    """The part of the environment every task of the job shares (job, roles, peers)."""
    role_list = ",".join(r.name for r in spec.taskRoles)
    role_count, task_count = str(len(spec.taskRoles)), str(spec.task_count)
    env: dict[str, str] = {
        "PAI_JOB_NAME": job,
        "PAI_FRAMEWORK_NAME": job,
        "PAI_USER_NAME": spec.user,
        "PAI_USERNAME": spec.user,
        "PAI_VIRTUAL_CLUSTER": spec.virtualCluster,
        "PAI_DEFAULT_FS_URI": "",
        "PAI_TASK_ROLE_LIST": role_list,
        "PAI_JOB_TASK_ROLE_LIST": role_list,
        "PAI_TASK_ROLE_COUNT": role_count,
        "PAI_TASK_ROLES_NUM": role_count,
        "PAI_JOB_TASK_ROLE_COUNT": role_count,
        "PAI_JOB_TASK_COUNT": task_count,
        "PAI_TASKS_NUM": task_count,
    }
    instances: list[str] = []
    for task_role in spec.taskRoles:
        env[f"PAI_TASK_ROLE_TASK_COUNT_{task_role.name}"] = str(task_role.instances)
        env[f"PAI_RESOURCE_{task_role.name}"] = resource_line(task_role)
        env[f"PAI_MIN_FAILED_TASK_COUNT_{task_role.name}"] = str(task_role.completion.minFailedInstances)
        env[f"PAI_MIN_SUCCEEDED_TASK_COUNT_{task_role.name}"] = str(task_role.completion.minSucceededInstances)
        label = host_list_label(task_role)
        host_list: list[str] = []
        for i in range(task_role.instances):
            address = peers.get((task_role.name, i))
            if address is None:
                continue
            instances.append(f"{task_role.name}:{i}")
            env[f"PAI_HOST_IP_{task_role.name}_{i}"] = address.hostIp
            for port_label, ports in address.ports.items():
                listed = ",".join(str(p) for p in ports)
                env[f"PAI_PORT_LIST_{task_role.name}_{i}_{port_label}"] = listed
                env[f"PAI_{task_role.name}_{i}_{port_label}_PORT"] = listed
            host_list.append(host_list_entry(address, label))
        env[f"PAI_TASK_ROLE_{task_role.name}_HOST_LIST"] = ",".join(host_list)
    env["PAI_TASK_ROLE_INSTANCES"] = ",".join(instances)
    return env


def resource_line(role: TaskRole) -> str:
    """OpenPAI's `PAI_RESOURCE_<role>`: gpu,cpu,memoryMB,shmMB (shmMB 0 when the job sets none)."""
    r = role.resources
    return f"{r.gpu},{r.cpu},{r.memoryMB},{role.shmMB or 0}"


def own_env(spec: JobSpec, role: str, index: int, address: PeerAddress | None) -> dict[str, str]:
    """What OpenPAI tells a task of itself: its indexes, its address and ports, its role's figures."""
    task_role = spec.role(role)
    env = {
        "PAI_TASK_INDEX": str(index),
        "PAI_TASK_ROLE_INDEX": str(index),
        "PAI_TASK_ROLE_NO": str(next(i for i, r in enumerate(spec.taskRoles) if r.name == role)),
        "PAI_CURRENT_TASK_ROLE_TASK_COUNT": str(task_role.instances),
        "PAI_CURRENT_TASK_ROLE_CPU_COUNT": str(task_role.resources.cpu),
        "PAI_CURRENT_TASK_ROLE_MEM_MB": str(task_role.resources.memoryMB),
        "PAI_CURRENT_TASK_ROLE_SHM_MB": str(task_role.shmMB or 0),
        "PAI_CURRENT_TASK_ROLE_GPU_COUNT": str(task_role.resources.gpu),
        "PAI_CURRENT_TASK_ROLE_MIN_FAILED_TASK_COUNT": str(task_role.completion.minFailedInstances),
        "PAI_CURRENT_TASK_ROLE_MIN_SUCCEEDED_TASK_COUNT": str(task_role.completion.minSucceededInstances),
    }
    if address is None:
        return env
    env["PAI_CURRENT_CONTAINER_IP"] = env["PAI_CONTAINER_HOST_IP"] = address.hostIp
    port_list = ""
    for label, ports in address.ports.items():
        listed = ",".join(str(p) for p in ports)
        env[f"PAI_CONTAINER_HOST_{label}_PORT_LIST"] = listed
        port_list += f"{label}:{listed};"
    env["PAI_CONTAINER_HOST_PORT_LIST"] = port_list
    if address.ports.get("http"):
        env["PAI_CURRENT_CONTAINER_PORT"] = env["PAI_CONTAINER_HOST_PORT"] = str(address.ports["http"][0])
    if address.ports.get("ssh"):
        env["PAI_CONTAINER_SSH_PORT"] = str(address.ports["ssh"][0])
    return env


def task_env(
    *,
    spec: JobSpec,
    job: str,
    attempt: int,
    role: str,
    index: int,
    task_attempt: int,
    peers: Mapping[tuple[str, int], PeerAddress],
    gpus: Sequence[int],
    shared: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment of task `role`/`index`; `peers` holds every placed task, itself included.

    `shared` is `peers_env(...)` for the same job and peers, when the caller
    computes the environments of many tasks at once.
    """
    env = dict(shared if shared is not None else peers_env(spec=spec, job=job, peers=peers))
    env.update(own_env(spec, role, index, peers.get((role, index))))
    env.update(
        {
            "PAI_CURRENT_TASK_ROLE_NAME": role,
            "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": str(index),
            "PAI_JOB_ATTEMPT_ID": str(attempt),
            "PAI_TASK_ATTEMPT_ID": str(task_attempt),
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
            "PAI_GPU_COUNT": str(len(gpus)),
        }
    )
    return env
