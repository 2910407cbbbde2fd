"""Exit specs the launcher issues itself (OpenPAI's PAI_FC range, [-999, -1]).

The runtime explains exits of user processes; these explain ends the launcher
decided: a user stop, the end of a completing attempt, a preemption by the
scheduler, a task lost across a restart, no free port on a node.

OpenPAI has no code for "preempted by another job" (HiveD deletes the pods and
the framework controller sees them deleted externally), so PAI defines
`-240 PreemptedByScheduler`, next to OpenPAI's user-stop codes, and
`-250 PortRangeExhausted`.
"""

from __future__ import annotations

from libs.common.messages import SUCCEEDED_EXIT_SPEC, ExitSpec, Reaction

SUCCEEDED_EXIT_CODE = 0
STOP_EXIT_CODE = -210
ATTEMPT_COMPLETION_EXIT_CODE = -220
PREEMPTED_EXIT_CODE = -240
PORTS_EXHAUSTED_EXIT_CODE = -250
# A task the launcher recorded as running but the backend no longer knows after
# a restart; the same code as OpenPAI's PodNodeLost, with platform reason "Lost".
LOST_EXIT_CODE = -1001
LOST_PLATFORM_REASON = "Lost"

SUCCEEDED = SUCCEEDED_EXIT_SPEC


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
