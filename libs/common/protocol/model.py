"""The normalised job: what every service reads after the protocol layer accepted a job.

The protocol layer (`libs.common.protocol.parse_job`) turns an OpenPAI v2 YAML/JSON
document into a `JobSpec`: defaults filled, templates rendered, the selected
deployment's pre/post commands folded into `commands`, names checked. Services
never look at the raw document again, except rest, which keeps it for
`GET .../config` (with secrets masked).

Field names follow OpenPAI's spelling where one exists so that the JSON on the bus
reads like the protocol. New fields must have defaults (schema evolution rule).
"""

from __future__ import annotations

import msgspec

from libs.common.storages import Storage, StorageRequest

# extras.hivedScheduler.jobPriorityClass -> priority, as in HiveD/OpenPAI.
PRIORITY_CLASSES: dict[str, int] = {"crit": 120, "prod": 100, "test": 10, "oppo": -1}
DEFAULT_PRIORITY_CLASS = "test"
OPPORTUNISTIC_PRIORITY = -1


class Resources(msgspec.Struct, frozen=True, kw_only=True):
    """`resourcePerInstance` of a task role."""

    cpu: int = 1
    memoryMB: int = 1024
    gpu: int = 0
    # label -> how many ports of that label each instance needs
    ports: dict[str, int] = {}


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    # OpenPAI: the job fails as soon as this many instances of the role failed
    # (-1: never because of this role); it succeeds once this many succeeded
    # (-1: only when all instances succeeded).
    minFailedInstances: int = 1
    minSucceededInstances: int = -1


class TaskRole(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    instances: int = 1
    completion: Completion = Completion()
    taskRetryCount: int = 0
    dockerImage: str | None = None  # prerequisite name
    dockerImageUri: str | None = None  # resolved from prerequisites
    # The image prerequisite's `auth` (username, password, registryuri), secret
    # references kept for the launcher to fill in.
    dockerImageAuth: dict[str, str] | None = None
    shmMB: int | None = None  # extraContainerOptions.shmMB
    # extraContainerOptions.hostNetwork: the job asks for its node's network (Kubernetes
    # backend; granted where the admin lets jobs ask, kube_job_host_network).
    hostNetwork: bool = False
    resources: Resources = Resources()
    # Rendered shell lines, pre-commands and post-commands of the active
    # deployment included; run in order by one shell, stopping at the first failure.
    commands: list[str] = []
    # hivedScheduler.taskRoles.<role>.skuType / affinityGroupName overrides
    skuType: str | None = None
    affinityGroupName: str | None = None
    # hivedScheduler.taskRoles.<role>.skuNumber (HiveD's leafCellNumber): leaf cells per
    # task, at least what its resources need; None: what they need.
    skuNumber: int | None = None
    # hivedScheduler.taskRoles.<role>.pinnedCellId, else the job's hivedScheduler.pinnedCellId:
    # the VC's pinned cell the role's tasks run in (roles may be pinned to different cells).
    pinnedCellId: str | None = None
    # hivedScheduler.taskRoles.<role>.gangReleaseEnable, else the job's: true (PAI's default)
    # releases the role's cells with its attempt's; false releases each task's cells as soon
    # as the task has ended for good in its attempt (HiveD's release per pod).
    gangReleaseEnable: bool = True


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    user: str
    virtualCluster: str = "default"
    jobRetryCount: int = 0
    priorityClass: str = DEFAULT_PRIORITY_CLASS
    priority: int = PRIORITY_CLASSES[DEFAULT_PRIORITY_CLASS]
    # extras.gangAllocation (default true): all tasks of an affinity group start together
    gangAllocation: bool = True
    lazyPreemptionEnable: bool = False
    skuType: str | None = None  # extras.hivedScheduler.skuType
    # extras.hivedScheduler.pinnedCellId: the pin of every role that names none of its own
    # (each role's pin is TaskRole.pinnedCellId; specs stored before it carry this alone).
    pinnedCellId: str | None = None
    taskRoles: list[TaskRole] = []
    # extras.jobStatusChangeNotification
    notifyOnStateChange: bool = False
    # The mapping form's states asked for (lower case: running, succeeded,
    # failed, stopped, stopping, waiting, retried); empty with notifyOnStateChange:
    # `true`, the monitor's default set (services/monitor/alerts/core.py).
    notifyStates: list[str] = []
    notifyEmails: list[str] = []
    # teamwise_storage's storageConfigNames (extras.com.microsoft.pai.runtimeplugin):
    # None: the job has no such plugin; []: the plugin names none (the default storages).
    storageConfigNames: list[str] | None = None
    # OpenPAI's extras.storages: storages by name with the job's mount path, read-only
    # flag or `share: false` (the user's own subdirectory).
    storageRequests: list[StorageRequest] = []
    # The storages the job mounts, resolved by rest at submission from the admins'
    # declarations and the user's grants (libs/common/storages.py).
    storages: list[Storage] = []
    # Keys of the protocol we accept and keep but do not act on, e.g.
    # "extras.com.microsoft.pai.runtimeplugin"; reported back to the user.
    ignoredFields: list[str] = []

    def role(self, name: str) -> TaskRole:
        for role in self.taskRoles:
            if role.name == name:
                return role
        raise KeyError(name)

    def pin_of(self, role: TaskRole) -> str | None:
        """The pinned cell of a role's tasks: its own, else the job's."""
        return role.pinnedCellId or self.pinnedCellId

    @property
    def pinned(self) -> bool:
        """Whether any role runs in a pinned cell."""
        return self.pinnedCellId is not None or any(role.pinnedCellId for role in self.taskRoles)

    @property
    def task_count(self) -> int:
        return sum(r.instances for r in self.taskRoles)


class FieldError(msgspec.Struct, frozen=True, kw_only=True):
    """One reason a job document was rejected."""

    path: str  # e.g. "taskRoles.worker.instances", "$" for the whole document
    rule: str  # machine-readable, e.g. "minimum", "required", "unknown_key", "yaml_syntax"
    message: str  # for a person
    line: int | None = None


class ProtocolError(ValueError):
    """A job document that cannot be accepted; rest answers 400 with `errors`."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(f"{e.path}: {e.message}" for e in errors))
