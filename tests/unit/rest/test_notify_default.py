"""A user's default for job status mail (services/rest/notify_default.py): read leniently
from their extension, applied only to a job whose document does not say."""

from __future__ import annotations

import pytest

from libs.common.protocol import parse_job
from services.rest.notify_default import EVERY_DEFAULT_STATE, wanted_states, with_default

JOB = "protocolVersion: 2\nname: j\ntype: job\ntaskRoles:\n  a:\n    instances: 1\n    commands: [train]\n"


@pytest.mark.parametrize(("setting", "states"), [
    pytest.param(True, EVERY_DEFAULT_STATE, id="true-the-monitors-default"),
    pytest.param({"Failed": True, "succeeded": True, "running": False}, ("failed", "succeeded"), id="chosen-states"),
    pytest.param({"exploded": True, "failed": "yes"}, (), id="unknown-state-and-non-boolean-mean-nothing"),
    pytest.param(False, (), id="false"),
    pytest.param("always", (), id="a-string-means-nothing"),
    pytest.param(None, (), id="absent"),
])
def test_the_setting_is_read_leniently(setting, states):
    extension = {} if setting is None else {"jobStatusChangeNotification": setting}
    assert wanted_states(extension) == states


@pytest.mark.parametrize(("extra", "states", "expected"), [
    pytest.param("", ("failed",), (True, ["failed"]), id="silent-job-follows-the-user"),
    pytest.param("", EVERY_DEFAULT_STATE, (True, []), id="true-leaves-the-states-to-the-monitor"),
    pytest.param("", (), (False, []), id="no-default"),
    pytest.param("extras:\n  jobStatusChangeNotification: false\n", ("failed",), (False, []), id="the-jobs-false-wins"),
    pytest.param("extras:\n  jobStatusChangeNotification: {stopped: true}\n", ("failed",), (True, ["stopped"]),
                 id="the-jobs-states-win"),
])
def test_the_default_applies_only_where_the_job_does_not_say(extra, states, expected):
    parsed = parse_job(JOB + extra, user="u")
    spec = with_default(parsed.spec, parsed.config, states)
    assert (spec.notifyOnStateChange, spec.notifyStates) == expected
