"""Lines of field paths for refusals decided after parsing (libs/common/protocol/locate.py)."""

from __future__ import annotations

import pytest

from libs.common.errors import BadInput, NoVirtualCluster
from libs.common.protocol.locate import errors_located, line_of_path, parse_path

JOB = """protocolVersion: 2
name: located
type: job
prerequisites:
  - name: data
    type: data
    uri: ["/data"]
taskRoles:
  worker:
    instances: 2
    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 8}
    commands: [train]
defaults:
  virtualCluster: nowhere
"""


@pytest.mark.parametrize(
    ("path", "parts"),
    [
        pytest.param("$", (), id="root"),
        pytest.param("defaults.virtualCluster", ("defaults", "virtualCluster"), id="keys"),
        pytest.param("prerequisites[0].uri", ("prerequisites", 0, "uri"), id="list-index"),
        pytest.param("taskRoles.worker.resourcePerInstance.gpu", ("taskRoles", "worker", "resourcePerInstance", "gpu"),
                     id="deep"),
    ],
)
def test_parse_path(path, parts):
    assert parse_path(path) == parts


@pytest.mark.parametrize(
    ("path", "line"),
    [
        pytest.param("defaults.virtualCluster", 14, id="vc"),
        pytest.param("taskRoles.worker.instances", 10, id="instances"),
        pytest.param("taskRoles.worker.resourcePerInstance.gpu", 11, id="flow-mapping-inside-a-line"),
        pytest.param("prerequisites[0].uri", 7, id="in-a-list"),
        pytest.param("taskRoles.worker.notThere", 9, id="absent-field-its-parent"),
        pytest.param("$", None, id="the-whole-document"),
    ],
)
def test_line_of_path(path, line):
    assert line_of_path(JOB, "text/yaml", path) == line


def test_json_bodies_have_lines_too():
    body = '{\n  "name": "j",\n  "defaults": {\n    "virtualCluster": "nowhere"\n  }\n}\n'
    assert line_of_path(body, "application/json", "defaults.virtualCluster") == 4


def test_a_body_that_does_not_parse_has_no_lines():
    assert line_of_path("name: [unclosed", "text/yaml", "name") is None


def test_a_refusal_leaves_with_the_line_of_each_path_it_names():
    with pytest.raises(NoVirtualCluster) as caught, errors_located(JOB, "text/yaml"):
        raise NoVirtualCluster("no VC nowhere", details={"errors": [
            {"path": "defaults.virtualCluster", "rule": "unknown_virtual_cluster", "message": "no VC"},
            {"path": "taskRoles.worker.instances", "rule": "never_fits", "message": "too many", "line": 3}]})
    lines = [e["line"] for e in caught.value.details["errors"]]
    assert lines == [14, 3]  # found, and a line already given is kept


def test_a_refusal_without_paths_is_left_as_it_is():
    with pytest.raises(BadInput) as caught, errors_located(JOB, "text/yaml"):
        raise BadInput("plain")
    assert caught.value.details is None
