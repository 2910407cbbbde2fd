"""The exit specs PAI gives itself, in one table: the launcher's and the runtime's.

OpenPAI's exit spec explains every end of a task with a code. Most codes come from
the runtime's rule set (`services/runtime/rules/default-rules.yaml`); the ones here
are those PAI issues without a rule:

- the launcher's (OpenPAI's PAI_FC range, [-999, -1]): a user stop, the end of a
  completing attempt, a preemption by the scheduler, no free port on a node, and
  a task lost across a restart;
- the runtime's fallbacks, used when a rule set does not define them itself:
  success, "no rule recognised it", and the two undefined-code shadows.

OpenPAI has no code for "preempted by another job" (HiveD deletes the pods and
the framework controller sees them deleted externally), so PAI defines
`-240 PreemptedByScheduler`, next to OpenPAI's user-stop codes, and
`-250 PortRangeExhausted`.
"""

from __future__ import annotations

import msgspec

from libs.common.messages import ExitSpec, Reaction

SUCCEEDED_EXIT_CODE = 0
STOP_EXIT_CODE = -210
ATTEMPT_COMPLETION_EXIT_CODE = -220
PREEMPTED_EXIT_CODE = -240
PORTS_EXHAUSTED_EXIT_CODE = -250
DEAD_LETTERED_EXIT_CODE = -260
# A task the launcher recorded as running but the backend no longer knows after
# a restart; the same code as OpenPAI's PodNodeLost, with platform reason "Lost".
LOST_EXIT_CODE = -1001
LOST_PLATFORM_REASON = "Lost"
# A task on a node the monitor declared lost (its agent silent for
# `node_lost_seconds`): the launcher ends it with platform reason "NodeLost",
# which the runtime's PodNodeLost rule (the same code) retries without counting.
NODE_LOST_EXIT_CODE = -1001
NODE_LOST_PLATFORM_REASON = "NodeLost"
UNKNOWN_FAILURE_CODE = 255
# A runtime plugin's or prerequisite's commands failed (cmd, callbacks: protocol/plugins.py; 199:
# no signal's 128+n, no code of the default rules):
# the task's shell says which in a line starting with the marker, then exits with this
# code; the runtime's rule of the code (RuntimePluginFailed, default-rules.yaml) matches
# both, and the matched line, in the diagnostics, names the plugin.
RUNTIME_PLUGIN_FAILED_EXIT_CODE = 199
RUNTIME_PLUGIN_FAILED_MARKER = "[PAI] runtime plugin failed:"
UNDEFINED_NEGATIVE_CODE = -8000
UNDEFINED_POSITIVE_CODE = 256



def runtime_plugin_failed_line(name: str) -> str:
    """The line a task's shell prints before exiting with RUNTIME_PLUGIN_FAILED_EXIT_CODE."""
    return f"{RUNTIME_PLUGIN_FAILED_MARKER} {name}"


# Rules that only name what PAI reports when nothing else matched.
CATCH_ALL_CODES = frozenset({UNKNOWN_FAILURE_CODE, UNDEFINED_NEGATIVE_CODE, UNDEFINED_POSITIVE_CODE})

# The explanation of a clean exit, the same wherever PAI gives it.
SUCCEEDED = ExitSpec(
    code=SUCCEEDED_EXIT_CODE,
    phrase="Succeeded",
    issuer="USER_CONTAINER",
    causer="USER_CONTAINER",
    type="USER_SUCCESS",
    stage="COMPLETING",
    behavior="UNKNOWN",
    reaction=Reaction.NEVER_RETRY,
)


def stopped(by: str) -> ExitSpec:
    return ExitSpec(
        code=STOP_EXIT_CODE,
        phrase="StopFrameworkRequested",
        issuer="PAI_FC",
        causer="USER_STOP",
        type="USER_STOP",
        stage="UNKNOWN",
        behavior="PERMANENT",
        reaction=Reaction.NEVER_RETRY,
        reason=f"{by} requested to stop the job" if by else "The job was requested to stop",
    )


ATTEMPT_COMPLETION = ExitSpec(
    code=ATTEMPT_COMPLETION_EXIT_CODE,
    phrase="FrameworkAttemptCompletion",
    issuer="PAI_FC",
    causer="USER_STOP",
    type="USER_STOP",
    stage="UNKNOWN",
    behavior="PERMANENT",
    reaction=Reaction.NEVER_RETRY,
    reason="Stopped to complete the current job attempt",
)


def preempted(by: str, reason: str = "") -> ExitSpec:
    because = f": {reason}" if reason else ""
    return ExitSpec(
        code=PREEMPTED_EXIT_CODE,
        phrase="PreemptedByScheduler",
        issuer="PAI_FC",
        causer="PAI_FC",
        type="PLATFORM_FAILURE",
        stage="RUNNING",
        behavior="TRANSIENT",
        reaction=Reaction.ALWAYS_RETRY,
        reason=f"Preempted by job {by}{because}",
        solution=[
            "Wait: the job is queued again and keeps its retry budget",
            "Use a higher jobPriorityClass, or a VC with free quota",
        ],
    )


PORTS_EXHAUSTED = ExitSpec(
    code=PORTS_EXHAUSTED_EXIT_CODE,
    phrase="PortRangeExhausted",
    issuer="PAI_FC",
    causer="PAI_FC",
    type="PLATFORM_FAILURE",
    stage="LAUNCHING",
    behavior="TRANSIENT",
    reaction=Reaction.RETRY_TO_MAX,
    reason="No free port left in the launcher's port range on the placed node",
    solution=["Wait result from next retry", "Contact Cluster Admin"],
)

UNKNOWN_FAILURE = ExitSpec(
    code=UNKNOWN_FAILURE_CODE,
    phrase="PAIRuntimeUnknownFailed",
    issuer="PAI_RUNTIME",
    causer="UNKNOWN",
    type="UNKNOWN_FAILURE",
    stage="UNKNOWN",
    behavior="UNKNOWN",
    reaction=Reaction.RETRY_TO_MAX,
    reason="The command failed and no failure rule recognised why.",
    solution=["Read the diagnostics and the end of the task log."],
)

UNDEFINED_NEGATIVE = ExitSpec(
    code=UNDEFINED_NEGATIVE_CODE,
    phrase="ContainerUndefinedNegativeExitCode",
    issuer="UNKNOWN",
    causer="UNKNOWN",
    type="UNKNOWN_FAILURE",
    stage="UNKNOWN",
    behavior="UNKNOWN",
    reaction=Reaction.RETRY_TO_MAX,
    reason="The task ended with a negative exit code that no rule defines.",
)

UNDEFINED_POSITIVE = ExitSpec(
    code=UNDEFINED_POSITIVE_CODE,
    phrase="PAIRuntimeExitAbnormally",
    issuer="PAI_RUNTIME",
    causer="PAI_RUNTIME",
    type="PLATFORM_FAILURE",
    stage="UNKNOWN",
    behavior="UNKNOWN",
    reaction=Reaction.RETRY_TO_MAX,
    reason="The task ended with an exit code above 255, which no process can return by itself.",
)

NODE_LOST = ExitSpec(
    code=NODE_LOST_EXIT_CODE,
    phrase="PodNodeLost",
    issuer="PAI_FC",
    causer="PAI_FC",
    type="PLATFORM_FAILURE",
    stage="RUNNING",
    behavior="TRANSIENT",
    reaction=Reaction.ALWAYS_RETRY,
    reason=(
        "The node running the task stopped answering (its PAI agent sent no sample for too long), "
        "so PAI ended the task and runs the job again on healthy nodes."
    ),
    solution=["Wait for the automatic retry", "Tell your cluster admin: the node needs attention"],
)


def dead_lettered(consumer: str, event_kind: str, reason: str) -> ExitSpec:
    """A PAI service could not handle one of this job's events, on every try, and
    gave up on it (a poison message) so that other jobs go on."""
    return ExitSpec(
        code=DEAD_LETTERED_EXIT_CODE,
        phrase="PlatformGaveUpOnEvent",
        issuer="PAI_FC",
        causer="PAI_FC",
        type="PLATFORM_FAILURE",
        stage="UNKNOWN",
        behavior="PERMANENT",
        reaction=Reaction.NEVER_RETRY,
        reason=f"The {consumer} service failed on this job's {event_kind} event on every try and gave up on it: {reason}",
        solution=[
            "Contact the cluster admin: the failure is PAI's, and an alert was raised",
            "Submitting the job again under another name may work once the cause is fixed",
        ],
    )


def platform_retries_exhausted(spec: ExitSpec, *, retries: int) -> ExitSpec:
    """The failure that the job kept meeting, once PAI stopped retrying it: same
    code and phrase, so a person sees what failed, and a reason saying why the
    job ended although the failure is one PAI normally retries."""
    return msgspec.structs.replace(
        spec,
        reaction=Reaction.NEVER_RETRY,
        reason=(
            f"{spec.reason} PAI retried this job {retries} times for failures that do not use its "
            f"jobRetryCount (the platform's limit), and stops here."
        ).strip(),
        solution=[
            *spec.solution,
            "Look at why each attempt failed (job attempts, task logs) before submitting again",
        ],
    )


# Every fixed spec by code: what `spec_for(code)` answers when no rule names the
# code (the two that carry who and why, stop and preemption, are built per event).
BUILTIN: dict[int, ExitSpec] = {
    spec.code: spec
    for spec in (
        SUCCEEDED,
        ATTEMPT_COMPLETION,
        PORTS_EXHAUSTED,
        UNKNOWN_FAILURE,
        UNDEFINED_NEGATIVE,
        UNDEFINED_POSITIVE,
        NODE_LOST,
    )
}
