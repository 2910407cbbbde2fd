"""libs/common: configuration precedence, ids, subjects, JSON logs."""

from __future__ import annotations

import json
import logging

import pytest

from libs.common import ids
from libs.common.config import load_config
from libs.common.errors import BadInput
from libs.common.messages import JobPlaced, NodeStatus, TaskPlacement, decode, encode, subject_of
from libs.common.subjects import Kind, kind_filter, kind_of
from libs.common.telemetry import JsonFormatter


def test_environment_overrides_file_which_overrides_defaults(tmp_path):
    path = tmp_path / "pai.yaml"
    path.write_text("rest_port: 1000\nscheduler_port: 2000\n")
    config = load_config(path, env={"PAI_REST_PORT": "3000"})
    assert (config.rest_port, config.scheduler_port, config.launcher_port) == (3000, 2000, 9188)


@pytest.mark.parametrize(
    "env, fragment",
    [({"PAI_REST_PORT": "many"}, "rest_port"), ({"PAI_GRACE_SECONDS": "soon"}, "grace_seconds")],
    ids=["port-not-a-number", "grace-not-a-number"],
)
def test_bad_setting_names_the_setting(env, fragment):
    with pytest.raises(BadInput, match=fragment):
        load_config(env=env)


def test_config_file_that_is_not_a_mapping_is_rejected(tmp_path):
    path = tmp_path / "pai.yaml"
    path.write_text("- a list\n")
    with pytest.raises(BadInput, match="mapping"):
        load_config(path, env={})


@pytest.mark.parametrize("bad", ["alice", "~job", "al.ice~job", "alice~", "alice~jo b"], ids=str)
def test_malformed_job_ids_are_refused(bad):
    with pytest.raises(ValueError):
        ids.split_job_id(bad)


def test_job_key_round_trips():
    assert ids.job_key("alice~train-1") == "alice.train-1"
    assert ids.job_id_from_key("alice.train-1") == "alice~train-1"


def test_subjects_let_integrators_filter_by_kind_vc_user_and_job():
    event = JobPlaced(id="alice~j/1/placed", job="alice~j", vc="vc1", attempt=1,
                      tasks=[TaskPlacement(role="w", index=0, node="10.0.0.1")])
    assert subject_of(event) == "pai.v1.job.placed.vc1.alice.j"
    assert kind_of(subject_of(event)) is Kind.JOB_PLACED
    assert kind_filter(Kind.JOB_PLACED) == "pai.v1.job.placed.>"
    node = NodeStatus(id="n", job="", node="10.0.0.1", healthy=False)
    assert subject_of(node) == "pai.v1.node.status.10_0_0_1"


def test_events_round_trip_through_their_union():
    event = NodeStatus(id="n/1", job="", node="a", healthy=True, reason="ok")
    assert decode(encode(event)) == event


def test_json_logs_carry_service_job_and_message():
    record = logging.LogRecord("pai.x", logging.INFO, __file__, 1, "placed %s", ("job",), None)
    record.job = "alice~j"
    line = json.loads(JsonFormatter("scheduler").format(record))
    assert line["service"] == "scheduler" and line["job"] == "alice~j" and line["msg"] == "placed job"
