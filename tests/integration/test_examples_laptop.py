"""A laptop runs the examples: `pai up` with no cluster file on a 2-core machine
(`--cpus 2`: the default one-node cluster, CPU cells oversubscribed 4 per core)
runs every job file in examples/ to the end it is written for, and the OpenPAI-shaped
job files of tests/fixtures/jobs/openpai_shapes/ to SUCCEEDED, unchanged.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from cli.up import Platform
from tests.integration.conftest import Api, platform_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SHAPES = sorted((ROOT / "tests" / "fixtures" / "jobs" / "openpai_shapes").glob("*.yaml"))
# examples/fail-syntax.yaml shows a failure PAI explains and does not retry; every other one succeeds.
EXPECTED = {"fail-syntax": "FAILED"}


@pytest.fixture(scope="module")
def laptop(tmp_path_factory):
    # The shared platform config names a cluster file; a laptop has none. One OpenPAI shape
    # mounts its team's storage "shared-data": declared here, as its admins would have.
    root = tmp_path_factory.mktemp("laptop")
    storages = root / "storages.yaml"
    storages.write_text(f"storages:\n  - name: shared-data\n    type: hostPath\n"
                        f"    data: {{path: {root / 'shared-data'}}}\n")
    config = msgspec.structs.replace(platform_config(root, local_cpus=2), cluster_file="",
                                     storages_file=str(storages))
    plat = Platform(config, print_fn=lambda *_: None)
    try:
        yield Api(plat, plat.start())
    finally:
        from tests.chaos.harness import _stop_quickly  # idle services are not awaited in NATS drain

        _stop_quickly(plat)


async def test_every_example_and_openpai_shape_runs_to_its_end_on_two_cores(laptop):
    vcs = await laptop.client.request("GET", "/api/v2/virtual-clusters")
    (cpu,) = vcs["default"]["skus"]
    assert (cpu["sku"], cpu["total"]) == ("cpu", 8)  # 2 cores x 4 cells

    files = EXAMPLES + SHAPES
    submitted = {}
    for path in files:
        got = await laptop.submit(path.read_text())
        submitted[got["job"]] = EXPECTED.get(path.stem, "SUCCEEDED")
    finals = await asyncio.gather(*(laptop.wait_state(job, {"SUCCEEDED", "FAILED", "STOPPED"}, timeout=180)
                                    for job in submitted))
    ended = {job: detail["jobStatus"]["state"] for job, detail in zip(submitted, finals, strict=True)}
    assert ended == submitted
    LAST_RUN.update(zip(submitted, finals, strict=True))


LAST_RUN: dict[str, dict] = {}


async def test_the_syntax_error_example_is_explained_and_not_retried(laptop):
    failed = next((d for job, d in LAST_RUN.items() if job.endswith("~fail-syntax")), None)
    if failed is None:
        pytest.skip("the examples run did not happen")
    status = failed["jobStatus"]
    assert status["retries"] == 0, (status["appExitSpec"], status["appExitDiagnostics"])
