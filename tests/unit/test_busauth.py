"""The permission table of the bus (libs/common/busauth.py) against DESIGN.md's
ownership rules, and the credentials `pai up` keeps."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from libs.common import busauth
from libs.common.subjects import Bucket, Kind

CHART_PERMISSIONS = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "pai" / "files" / "nats-permissions.json"


def test_every_bucket_but_the_leases_has_exactly_one_writer():
    for bucket in Bucket:
        writers = [user for user, access in busauth.ACCESS.items() if bucket in access.writes]
        expected = 0 if bucket is Bucket.LEASES else 1  # leases: each single-active service its own key
        assert len(writers) == expected, f"{bucket.value} written by {writers}"


# Alert actions (stop-job, cordon-node) make the very requests an admin makes
# through rest, so these two kinds have the monitor as a second publisher.
ALERT_ACTION_REQUESTS = {Kind.JOB_STOP_REQUESTED: ["rest", "monitor"], Kind.NODE_CORDON: ["rest", "monitor"]}


def test_every_event_kind_has_exactly_one_publisher():
    for kind in Kind:
        publishers = [user for user, access in busauth.ACCESS.items() if kind in access.publishes]
        if kind in ALERT_ACTION_REQUESTS:
            assert publishers == ALERT_ACTION_REQUESTS[kind], f"{kind.value} published by {publishers}"
            continue
        expected = 0 if kind is Kind.EVENT_DEAD_LETTERED else 1  # each consumer under its own name
        assert len(publishers) == expected, f"{kind.value} published by {publishers}"


def test_only_the_launcher_reads_job_secrets():
    readers = [user for user, access in busauth.ACCESS.items() if Bucket.SECRETS in access.reads]
    assert readers == ["launcher"]
    assert not any("KV_pai_secrets" in s for s in busauth.permissions("rest").publish if "STREAM.INFO" not in s)


def test_the_integrator_may_not_publish_events_or_touch_kv():
    perms = busauth.permissions(busauth.INTEGRATOR)
    assert not any(s.startswith(("pai.", "$KV.")) or "KV_" in s or "CONSUMER" in s for s in perms.publish)
    assert "pai.v1.>" in perms.subscribe


def test_credentials_are_private_and_reused(tmp_path):
    path = tmp_path / "pai" / "nats-credentials.json"
    first = busauth.load_or_create_credentials(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert busauth.load_or_create_credentials(path) == first
    assert len({first.password(u) for u in busauth.ACCESS}) == len(busauth.ACCESS)
    config = busauth.server_config(first, host="127.0.0.1", port=4222, store_dir=tmp_path)
    text = json.dumps(config)
    assert not any(first.password(u) in text for u in busauth.ACCESS), "plain passwords in the server config"


def test_the_charts_permissions_file_is_generated_from_the_table():
    assert json.loads(CHART_PERMISSIONS.read_text()) == busauth.chart_permissions(), (
        "regenerate with: python -m libs.common.busauth permissions > deploy/helm/pai/files/nats-permissions.json"
    )
