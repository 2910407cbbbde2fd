"""Every shape a real OpenPAI job file takes is accepted unchanged, and means what it means there.

The files under tests/fixtures/jobs/openpai_shapes/ are PAI's own, written in the
shapes of OpenPAI's examples/ and marketplace-v2/ job files (see their README).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.common.protocol import parse_job
from libs.common.protocol.limits import MAX_JOB_RETRY_COUNT
from libs.common.protocol.model import ProtocolError

SHAPES = Path(__file__).parents[2] / "fixtures" / "jobs" / "openpai_shapes"
SHAPE_FILES = sorted(SHAPES.glob("*.yaml"))
OPENPAI_REFERENCE = Path("/work/shared/reference/openpai")


def _parse(text: str | bytes):
    return parse_job(text if isinstance(text, bytes) else text.encode(), content_type="text/yaml", user="alice")


def test_there_are_shapes_to_test():
    assert len(SHAPE_FILES) >= 7


@pytest.mark.parametrize("path", SHAPE_FILES, ids=lambda p: p.stem)
def test_openpai_shape_is_accepted_unchanged(path: Path):
    parsed = _parse(path.read_bytes())
    assert parsed.spec.taskRoles
    assert parsed.config["name"] == parsed.spec.name


def test_null_sku_type_means_any_sku():
    spec = _parse((SHAPES / "hived-null-sku.yaml").read_bytes()).spec
    assert spec.taskRoles[0].skuType is None
    assert spec.priorityClass == "test"
    assert spec.ignoredFields == []


@pytest.mark.parametrize("value", ["''", "3", "[gpu]"], ids=["empty", "number", "list"])
def test_sku_type_that_is_neither_null_nor_a_name_is_refused(value):
    text = (SHAPES / "hived-null-sku.yaml").read_text().replace("skuType: null", f"skuType: {value}")
    with pytest.raises(ProtocolError) as caught:
        _parse(text)
    assert "extras.hivedScheduler.taskRoles.main.skuType" in str(caught.value)


def test_job_level_null_sku_type_is_accepted():
    text = (SHAPES / "hived-null-sku.yaml").read_text().replace(
        "    jobPriorityClass: test", "    jobPriorityClass: test\n    skuType: null")
    assert _parse(text).spec.skuType is None


@pytest.mark.parametrize("count", [-1, -2])
def test_negative_job_retry_count_is_openpais_unlimited_capped_and_reported(count):
    text = (SHAPES / "negative-retry-port-zero.yaml").read_text().replace("jobRetryCount: -2", f"jobRetryCount: {count}")
    parsed = _parse(text)
    assert parsed.spec.jobRetryCount == MAX_JOB_RETRY_COUNT
    assert any(w.startswith("jobRetryCount:") and "without limit" in w for w in parsed.warnings)


def test_other_negative_job_retry_count_is_refused():
    text = (SHAPES / "negative-retry-port-zero.yaml").read_text().replace("jobRetryCount: -2", "jobRetryCount: -3")
    with pytest.raises(ProtocolError) as caught:
        _parse(text)
    assert "jobRetryCount" in str(caught.value)


def test_older_completion_name_sets_the_same_count():
    spec = _parse((SHAPES / "old-completion-name.yaml").read_bytes()).spec
    assert spec.taskRoles[0].completion.minSucceededInstances == 1


def test_older_and_newer_completion_name_together_are_refused():
    text = (SHAPES / "old-completion-name.yaml").read_text().replace(
        "minSucceededTaskCount: 1", "minSucceededTaskCount: 1\n      minSucceededInstances: 1")
    with pytest.raises(ProtocolError) as caught:
        _parse(text)
    assert "minSucceededTaskCount" in str(caught.value)


def test_docker_image_naming_no_prerequisite_is_refused_as_openpai_does():
    text = (SHAPES / "old-completion-name.yaml").read_text().replace("dockerImage: some_image", "dockerImage: undeclared")
    with pytest.raises(ProtocolError) as caught:
        _parse(text)
    assert "taskRoles.worker.dockerImage" in str(caught.value) and "some_image" in str(caught.value)


def test_registry_credentials_reach_the_role_and_are_not_reported_ignored():
    spec = _parse((SHAPES / "prerequisite-kinds.yaml").read_bytes()).spec
    assert spec.taskRoles[0].dockerImageAuth == {"username": "reader", "password": "not-a-real-password",
                                                 "registryuri": "registry.example.com"}
    assert not any(".auth" in field for field in spec.ignoredFields), spec.ignoredFields


def test_docker_image_naming_a_data_prerequisite_is_still_refused():
    text = (SHAPES / "prerequisite-kinds.yaml").read_text().replace("dockerImage: private_img", "dockerImage: corpus")
    with pytest.raises(ProtocolError) as caught:
        _parse(text)
    assert "taskRoles.main.dockerImage" in str(caught.value)


@pytest.mark.skipif(not OPENPAI_REFERENCE.is_dir(), reason="the OpenPAI reference files (/work/shared) are not here")
@pytest.mark.parametrize("name", ["example-CPU_500Task_MNIST.yaml", "example-hello-world-job.yaml",
                                  "example-pytorch-mnist.yaml", "example-tensorflow-cifar10.yaml"])
def test_openpai_reference_examples_are_accepted(name):
    assert _parse((OPENPAI_REFERENCE / name).read_bytes()).spec.taskRoles
