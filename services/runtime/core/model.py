"""The shape of a failure rule, in OpenPAI's exit-spec format.

A rule file is the `spec:` list of OpenPAI's `k8s-job-exit-spec.yaml`: each
entry names an exit code and phrase, who issued and caused it, what PAI should
do about it (`reaction`), an explanation a researcher can act on, and the
patterns that recognise it. Field names are the file's own (camelCase), so a
rule encodes back to the same YAML an admin wrote.

Pattern semantics (as in OpenPAI): every field of a pattern is optional and
matches anything when absent; a pattern matches when ALL its given fields
match; a rule matches when ANY of its patterns matches; the first matching rule
in file order wins.
"""

from __future__ import annotations

from typing import Any

import msgspec

from libs.common.messages import ExitSpec

# The enums of the exit-spec schema. A rule may leave any of them empty.
# OpenPAI's own spec also uses UNKNOWN as an issuer (for -8000), so it is allowed.
ISSUERS = (
    "USER_CONTAINER",
    "PAI_OS",
    "PAI_RUNTIME",
    "PAI_DOCKER",
    "PAI_K8S",
    "PAI_FC",
    "PAI_DB_CONTROLLER",
    "UNKNOWN",
)
CAUSERS = (
    "USER_SUBMISSION",
    "USER_CONTAINER",
    "USER_STOP",
    "USER_SCALEDOWN",
    "USER_RETRY",
    "USER_UPGRADE",
    "USER_UNKNOWN",
    "RESOURCE_ALLOCATION_TIMEOUT",
    "PAI_OS",
    "PAI_DOCKER",
    "PAI_RUNTIME",
    "PAI_K8S",
    "PAI_FC",
    "PAI_HW",
    "PAI_UNKNOWN",
    "UNKNOWN",
)
TYPES = (
    "USER_SUCCESS",
    "USER_STOP",
    "USER_FAILURE",
    "PLATFORM_FAILURE",
    "RESOURCE_ALLOCATION_TIMEOUT",
    "UNKNOWN_FAILURE",
)
STAGES = ("SUBMITTING", "ALLOCATING", "LAUNCHING", "RUNNING", "COMPLETING", "UNKNOWN")
BEHAVIORS = ("TRANSIENT", "TRANSIENT_CONFLICT", "PERMANENT", "UNKNOWN")

# The schema's range for `code`.
MIN_CODE = -8000
MAX_CODE = 256


class _Pattern(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    pass


class RuntimePattern(_Pattern, frozen=True, kw_only=True):
    """What the task itself showed: its exit code and its output.

    `userLogRegex` is searched in the last 64 KiB of the task's output,
    `platformLogRegex` in `platformReason + "\\n" + platformMessage`.
    `gpuInfo` is kept for compatibility with OpenPAI files; PAI reports GPU
    faults through the platform log instead, so a pattern that asks for
    `gpuInfo` never matches.
    """

    exitCode: int | None = None
    userLogRegex: str | None = None
    platformLogRegex: str | None = None
    gpuInfo: dict[str, bool] | None = None


class ContainerPattern(_Pattern, frozen=True, kw_only=True):
    """One container of the task's Pod, as the platform reported it.

    The container is named after the task role, or `init` when the platform
    reason carries Kubernetes' `Init:` prefix (e.g. `Init:OOMKilled`); its
    reason is the platform reason without that prefix.
    """

    nameRegex: str | None = None
    reasonRegex: str | None = None
    messageRegex: str | None = None
    exitCode: int | None = None


class PodPattern(_Pattern, frozen=True, kw_only=True):
    """What the platform said about the task (Pod reason and message)."""

    reasonRegex: str | None = None
    messageRegex: str | None = None
    # Every listed container pattern must match (the task has one container).
    containers: list[ContainerPattern] = []


class ExitPattern(_Pattern, frozen=True, kw_only=True):
    runtimeContainerPatterns: list[RuntimePattern] = []
    controllerPodPatterns: list[PodPattern] = []


class Rule(ExitSpec, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """One entry of the exit spec: the `ExitSpec` it gives, and the patterns that
    recognise it. Regexes are compiled by `RuleEngine`."""

    pattern: ExitPattern | None = None

    def to_spec(self) -> ExitSpec:
        fields = msgspec.structs.asdict(self)
        del fields["pattern"]
        return ExitSpec(**fields)

    def to_dict(self) -> dict[str, Any]:
        """The rule as it would be written in a rule file (empty fields left out,
        the reaction always written: it is what people look for first)."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        data.setdefault("reaction", self.reaction.value)
        return data


class Classification(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict on one task exit."""

    spec: ExitSpec
    # A few log lines that explain the verdict: the lines a pattern matched, or
    # the last lines of the output when no rule recognised the failure.
    diagnostics: list[str] = []
    # The code of the rule that decided; differs from `spec.code` only for the
    # shadow fallbacks (-8000, 256), which expose the raw exit code instead.
    rule_code: int
