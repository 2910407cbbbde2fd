"""A storage outlives the job: a checkpoint one job writes to its team's storage is read
by the next, through the whole platform, tasks as processes (each job under a uid of
its own, the storage bound into each task's mount namespace at its mount path)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.integration.conftest import Api, job_yaml

pytestmark = pytest.mark.integration


def with_storages(*names: str) -> str:
    listed = ", ".join(names)
    return ("extras:\n  com.microsoft.pai.runtimeplugin:\n    - plugin: teamwise_storage\n"
            f"      parameters: {{storageConfigNames: [{listed}]}}\n")


async def test_a_checkpoint_written_by_one_job_is_read_by_the_next(platform: Api, tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("storages are bound into a task's own mount namespace, which needs root")
    run = uuid.uuid4().hex[:6]
    ckpt, data = f"ckpt{run}", f"data{run}"
    ckpt_dir, data_dir = tmp_path / "storage" / "ckpt", tmp_path / "storage" / "data"
    data_dir.mkdir(parents=True)
    (data_dir / "dataset.txt").write_text("the dataset\n")
    client = platform.client
    await client.request("PUT", f"/api/v2/storages/{ckpt}",
                         json_body={"type": "hostPath", "data": {"path": str(ckpt_dir)}})
    await client.request("PUT", f"/api/v2/storages/{data}",
                         json_body={"type": "hostPath", "data": {"path": str(data_dir)}, "readOnly": True,
                                    "mountPath": f"/mnt/datasets/{data}"})

    first = f"train-{run}"
    answer = await platform.submit(job_yaml(first, [
        f"cat /mnt/datasets/{data}/dataset.txt",
        f"echo step-41 > /mnt/{ckpt}/checkpoint.txt",
        f"if touch /mnt/datasets/{data}/x 2>/dev/null; then echo dataset-writable; fi",
    ], extra=with_storages(ckpt, data)))
    detail = await platform.wait_state(answer["job"], {"SUCCEEDED", "FAILED"})
    log = await platform.logs(answer["job"])
    assert detail["jobStatus"]["state"] == "SUCCEEDED", log
    assert "the dataset" in log and "dataset-writable" not in log
    assert (ckpt_dir / "checkpoint.txt").read_text() == "step-41\n"  # on the node, where the storage is

    second = f"resume-{run}"
    answer = await platform.submit(job_yaml(second, [
        f'echo "resumed from $(cat /mnt/{ckpt}/checkpoint.txt)"',
    ], extra=with_storages(ckpt)))
    detail = await platform.wait_state(answer["job"], {"SUCCEEDED", "FAILED"})
    log = await platform.logs(answer["job"])
    assert detail["jobStatus"]["state"] == "SUCCEEDED", log
    assert "resumed from step-41" in log

    # A job that does not ask for the storage does not find it at its mount path.
    third = f"other-{run}"
    answer = await platform.submit(job_yaml(third, [f"test ! -e /mnt/{ckpt}/checkpoint.txt"]))
    detail = await platform.wait_state(answer["job"], {"SUCCEEDED", "FAILED"})
    assert detail["jobStatus"]["state"] == "SUCCEEDED", await platform.logs(answer["job"])


async def test_a_storage_the_node_does_not_have_fails_the_task_naming_it(platform: Api):
    if os.geteuid() != 0:
        pytest.skip("storages are bound into a task's own mount namespace, which needs root")
    name = f"claim{uuid.uuid4().hex[:6]}"
    await platform.client.request("PUT", f"/api/v2/storages/{name}", json_body={"type": "pvc"})
    answer = await platform.submit(job_yaml(f"noclaim-{name}", ["true"], extra=with_storages(name)))
    detail = await platform.wait_state(answer["job"], {"SUCCEEDED", "FAILED"})
    assert detail["jobStatus"]["state"] == "FAILED"
    assert f"storage {name}" in str(detail), detail


async def test_openpais_extras_storages_give_the_user_their_own_part_where_the_job_says(platform: Api, tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("storages are bound into a task's own mount namespace, which needs root")
    name = f"own{uuid.uuid4().hex[:6]}"
    root = tmp_path / "storage" / "own"
    await platform.client.request("PUT", f"/api/v2/storages/{name}",
                                  json_body={"type": "hostPath", "data": {"path": str(root)}})
    extra = f"extras:\n  storages:\n    - {{name: {name}, mountPath: /data/{name}, share: false}}\n"
    answer = await platform.submit(job_yaml(f"own-{name}", [f"echo mine > /data/{name}/result.txt"], extra=extra))
    detail = await platform.wait_state(answer["job"], {"SUCCEEDED", "FAILED"})
    assert detail["jobStatus"]["state"] == "SUCCEEDED", await platform.logs(answer["job"])
    user = answer["job"].split("~")[0]
    assert (root / user / "result.txt").read_text() == "mine\n"
