"""Turn a valid job document into the JobSpec every service reads.

Runs only after validation found no error, so it may index without checking.
Defaults are the protocol's where it has one (instances 1, retries 0,
completion 1 / -1, gangAllocation true) and the JobSpec model's otherwise
(a missing resourcePerInstance field: cpu 1, memoryMB 1024, gpu 0).
"""

from __future__ import annotations

from libs.common.protocol.commands import prerequisites_by_name, rendered_commands
from libs.common.protocol.limits import MAX_JOB_RETRY_COUNT
from libs.common.protocol.model import (
    DEFAULT_PRIORITY_CLASS,
    PRIORITY_CLASSES,
    Completion,
    JobSpec,
    Resources,
    TaskRole,
)
from libs.common.protocol.paths import RawMapping
from libs.common.protocol.plugins import storage_config_names, with_steps
from libs.common.protocol.validate_extras import extras_storages

DEFAULT_VIRTUAL_CLUSTER = "default"


def build_job_spec(data: RawMapping, *, user: str, ignored_fields: list[str]) -> JobSpec:
    extras = data.get("extras", {})
    hived = extras.get("hivedScheduler", {})
    hived_roles = hived.get("taskRoles", {})
    priority_class = hived.get("jobPriorityClass", DEFAULT_PRIORITY_CLASS)
    defaults = data.get("defaults", {})
    return JobSpec(
        name=data["name"],
        user=user,
        virtualCluster=defaults.get("virtualCluster", DEFAULT_VIRTUAL_CLUSTER),
        jobRetryCount=_job_retry_count(data.get("jobRetryCount", 0)),
        priorityClass=priority_class,
        priority=PRIORITY_CLASSES[priority_class],
        gangAllocation=extras.get("gangAllocation", True),
        lazyPreemptionEnable=hived.get("lazyPreemptionEnable", False),
        skuType=hived.get("skuType"),
        pinnedCellId=hived.get("pinnedCellId"),  # every role's pin unless it names its own
        taskRoles=[
            _task_role(data, name, role, hived_roles.get(name) or {}, job_pin=hived.get("pinnedCellId"),
                       job_gang_release=hived.get("gangReleaseEnable", True))
            for name, role in data["taskRoles"].items()
        ],
        notifyOnStateChange=_wants_notification(extras.get("jobStatusChangeNotification", False)),
        notifyStates=_notify_states(extras.get("jobStatusChangeNotification", False)),
        notifyEmails=_emails(extras.get("notifyEmails", [])),
        storageConfigNames=storage_config_names(data),
        storageRequests=extras_storages(data),
        ignoredFields=ignored_fields,
    )


def _task_role(data: RawMapping, name: str, role: RawMapping, hived: RawMapping, *, job_pin: str | None,
               job_gang_release: bool) -> TaskRole:
    image = role.get("dockerImage")
    completion = role.get("completion", {})
    resources = role.get("resourcePerInstance", {})
    model_defaults = Resources()
    return TaskRole(
        name=name,
        instances=role.get("instances", 1),
        completion=Completion(
            minFailedInstances=completion.get("minFailedInstances", completion.get("minFailedTaskCount", 1)),
            minSucceededInstances=completion.get("minSucceededInstances", completion.get("minSucceededTaskCount", -1)),
        ),
        taskRetryCount=role.get("taskRetryCount", 0),
        dockerImage=image,
        dockerImageUri=prerequisites_by_name(data)[image]["uri"] if image is not None else None,
        dockerImageAuth=_image_auth(data, image),
        shmMB=role.get("extraContainerOptions", {}).get("shmMB"),
        hostNetwork=role.get("extraContainerOptions", {}).get("hostNetwork", False),
        resources=Resources(
            cpu=resources.get("cpu", model_defaults.cpu),
            memoryMB=resources.get("memoryMB", model_defaults.memoryMB),
            gpu=resources.get("gpu", model_defaults.gpu),
            ports=dict(resources.get("ports", {})),
        ),
        commands=with_steps(data, name, rendered_commands(data, name)),
        skuType=hived.get("skuType"),
        affinityGroupName=hived.get("affinityGroupName"),
        skuNumber=hived.get("skuNumber"),
        pinnedCellId=hived.get("pinnedCellId") or job_pin,
        gangReleaseEnable=job_gang_release if hived.get("gangReleaseEnable") is None else hived["gangReleaseEnable"],
    )


def _image_auth(data: RawMapping, image: str | None) -> dict[str, str] | None:
    """The registry credentials of the role's image prerequisite, as written."""
    auth = prerequisites_by_name(data)[image].get("auth") if image is not None else None
    if not isinstance(auth, dict):
        return None
    return {key: str(value) for key, value in auth.items() if value is not None}


def _job_retry_count(value: int) -> int:
    """OpenPAI's negative counts (retry without limit) become PAI's largest."""
    return MAX_JOB_RETRY_COUNT if value < 0 else value


def _wants_notification(setting: bool | RawMapping) -> bool:
    if isinstance(setting, dict):
        return any(setting.values())
    return setting


def _notify_states(setting: bool | RawMapping) -> list[str]:
    if isinstance(setting, dict):
        return sorted(str(state).lower() for state, wanted in setting.items() if wanted)
    return []


def _emails(setting: str | list[str]) -> list[str]:
    return [setting] if isinstance(setting, str) else list(setting)
