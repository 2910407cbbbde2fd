"""A waiting job says why, in words a person can act on, through the API and `pai status`."""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest

from cli.main import main as pai
from tests.integration.conftest import job_yaml

pytestmark = pytest.mark.integration


async def test_job_waiting_for_a_full_vc_names_the_vc_and_the_cells(platform, tmp_path, capsys):
    tag = uuid.uuid4().hex[:6]
    holder, waiter = f"holder-{tag}", f"waiter-{tag}"
    release = tmp_path / "release"
    hold = job_yaml(holder, [f"while [ ! -e {release} ]; do sleep 0.1; done"], vc="research").replace("cpu: 1,", "cpu: 8,")
    await platform.submit(hold)
    await platform.wait_state(f"admin~{holder}", "RUNNING")
    await platform.submit(job_yaml(waiter, ["true"], vc="research").replace("cpu: 1,", "cpu: 4,"))
    try:
        reason = ""
        for _ in range(50):
            detail = await platform.job(f"admin~{waiter}")
            reason = detail["jobStatus"]["waitingReason"] or ""
            if "research" in reason and re.search(r"\d", reason):
                break
            await asyncio.sleep(0.1)
        assert detail["jobStatus"]["state"] == "WAITING"
        assert "research" in reason and re.search(r"\b4\b", reason), reason  # the VC and the 4 cells it needs

        rows = await platform.client.request("GET", "/api/v2/jobs", params={"vc": "research", "state": "WAITING"})
        assert [r["waitingReason"] for r in rows if r["name"] == waiter] == [reason]
        conn = platform.conn
        code = await asyncio.to_thread(pai, ["--url", conn.url, "--token", conn.token, "status", f"admin~{waiter}"])
        assert code == 0
        assert "waiting:" in capsys.readouterr().out
    finally:
        release.touch()
    await platform.wait_state(f"admin~{waiter}", "SUCCEEDED", timeout=30)
