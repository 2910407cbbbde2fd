"""Where each of a job's storages appears in its tasks: pure, shared by every backend.

`bind_mounts(storages)` is the list a process task's mount namespace
(backends/local_namespaces.py) and a container (the engine's bind mounts) both
take: `(host_path, task_path, read_only)`, in the job's order. A storage is bound
from the directory each node has it at (libs/common/storages.py, `node_path`): a
hostPath storage's own directory, an NFS export or a PVC where the admin mounted
it on the node (`data.hostPath`). On Kubernetes the storages are Pod volumes
instead (backends/kube_pods.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from libs.common.storages import Storage, mount_path, node_path

# A task's /dev/shm when its role sets no extraContainerOptions.shmMB (OpenPAI's default):
# a container's and a Pod's (a memory-backed emptyDir of this size).
DEFAULT_SHM_MB = 512


def shm_mb(shm: int | None) -> int:
    return DEFAULT_SHM_MB if shm is None else shm


class BindMount(NamedTuple):
    host_path: str
    container_path: str
    read_only: bool


class UnmountableStorage(ValueError):
    """A storage this node cannot give a task (an NFS export or a claim not mounted on it)."""


def bind_mounts(storages: Sequence[Storage]) -> list[BindMount]:
    """The binds of a job's storages; UnmountableStorage names one that has no directory on the node."""
    binds: list[BindMount] = []
    for storage in storages:
        source = node_path(storage)
        if source is None:
            raise UnmountableStorage(
                f"storage {storage.name} ({storage.type}) has no directory on the nodes: without Kubernetes "
                "an admin mounts it on every node and declares that directory as its data.hostPath"
            )
        binds.append(BindMount(source, mount_path(storage), storage.readOnly))
    return binds
