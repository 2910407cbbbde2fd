"""A user's default for job status mail (the profile page's Notifications), pure.

A user keeps it in their record's `extension.jobStatusChangeNotification`, in the
shape a job's `extras.jobStatusChangeNotification` has: `true` (the monitor's default
states) or a mapping of states to booleans (`{failed: true, succeeded: true}`). It is
set with OpenPAI's `PUT /api/v2/users/{user}/extension`, which takes any object, so it
is read leniently: anything else, and states PAI does not know, mean nothing.

A job that says nothing about notification follows the user's default as it is when
the job is submitted; a job's own setting (even `false`) wins.
"""

from __future__ import annotations

from typing import Any

import msgspec

from libs.common.protocol.model import JobSpec
from libs.common.protocol.validate_extras import NOTIFY_STATES

SETTING = "jobStatusChangeNotification"
EVERY_DEFAULT_STATE = ("*",)  # `true`: the job's notifyStates stay empty, the monitor's default


def wanted_states(extension: dict[str, Any]) -> tuple[str, ...]:
    """The states the user asks mail for by default; () for none."""
    setting = extension.get(SETTING) if isinstance(extension, dict) else None
    if setting is True:
        return EVERY_DEFAULT_STATE
    if isinstance(setting, dict):
        return tuple(sorted({str(s).lower() for s, on in setting.items() if on is True and str(s).lower() in NOTIFY_STATES}))
    return ()


def with_default(spec: JobSpec, config: dict[str, Any], states: tuple[str, ...]) -> JobSpec:
    """`spec` with the user's default applied where the job's document does not say."""
    extras = config.get("extras")
    if not states or (isinstance(extras, dict) and SETTING in extras):
        return spec
    return msgspec.structs.replace(spec, notifyOnStateChange=True,
                                   notifyStates=[] if states == EVERY_DEFAULT_STATE else list(states))
