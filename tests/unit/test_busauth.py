"""The permission table of the bus (libs/common/busauth.py) against the ownership
rules of docs/architecture.md ("Services"), and the credentials `pai up` keeps."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import nkeys
import pytest

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
    assert len({first.seed(u) for u in busauth.ACCESS}) == len(busauth.ACCESS)
    config = busauth.server_config(first, host="127.0.0.1", port=4222, store_dir=tmp_path)
    text = json.dumps(config)
    assert not any(first.seed(u) in text for u in busauth.ACCESS), "private keys in the server config"
    users = config["authorization"]["users"]
    assert [u["nkey"] for u in users] == [first.users[u].public for u in busauth.ACCESS]
    assert all(u["nkey"].startswith("U") and "password" not in u for u in users)
    assert [u["permissions"] for u in users] == [busauth.permissions_block(u) for u in busauth.ACCESS]


def test_a_password_era_credentials_file_becomes_nkeys(tmp_path):
    """A data dir made before nkeys: its file is rewritten with one key per user,
    and the result is then reused as it is."""
    path = tmp_path / "nats-credentials.json"
    old = {"users": {u: {"password": f"pw-{u}", "bcrypt": "$2b$11$" + "x" * 53} for u in busauth.ACCESS}}
    path.write_text(json.dumps(old))
    migrated = busauth.load_or_create_credentials(path)
    stored = json.loads(path.read_text())
    assert set(stored["users"]) == set(busauth.ACCESS)
    for user in busauth.ACCESS:
        assert set(stored["users"][user]) == {"seed", "public"}
        assert migrated.seed(user).startswith("SU")
        assert busauth.public_key(migrated.seed(user)) == migrated.users[user].public
    assert "pw-" not in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert busauth.load_or_create_credentials(path) == migrated


def test_a_user_added_to_the_table_gets_a_key_and_the_others_keep_theirs(tmp_path):
    path = tmp_path / "nats-credentials.json"
    first = busauth.load_or_create_credentials(path)
    stored = json.loads(path.read_text())
    del stored["users"]["runtime"]
    path.write_text(json.dumps(stored))
    again = busauth.load_or_create_credentials(path)
    assert all(again.users[u] == first.users[u] for u in busauth.ACCESS if u != "runtime")
    assert again.seed("runtime") != first.seed("runtime")


def test_a_damaged_seed_is_refused_not_replaced(tmp_path):
    path = tmp_path / "nats-credentials.json"
    busauth.load_or_create_credentials(path)
    stored = json.loads(path.read_text())
    stored["users"]["rest"]["seed"] = "SUAAAA"
    path.write_text(json.dumps(stored))
    with pytest.raises(nkeys.ErrInvalidSeed):
        busauth.load_or_create_credentials(path)


def test_a_secret_derives_one_stable_key_and_a_seed_is_used_as_it_is():
    """The chart's Secret holds random strings: each pod derives the same key."""
    seed = busauth.new_user_key().seed
    assert busauth.user_seed(seed) == seed
    derived = busauth.user_seed("r4nd0m-chart-secret-of-forty-characters!")
    assert derived.startswith("SU") and derived == busauth.user_seed("r4nd0m-chart-secret-of-forty-characters!\n")
    assert derived != busauth.user_seed("another-secret")
    with pytest.raises(ValueError, match="empty"):
        busauth.user_seed("  ")
    with pytest.raises(ValueError, match="does not decode"):
        busauth.user_seed("SUnot-a-seed")


def test_the_authorization_block_from_a_folder_of_secrets_names_what_is_missing(tmp_path):
    for user in busauth.ACCESS:
        (tmp_path / user).write_text(f"secret-of-{user}")
    block = busauth.authorization_from_keys(tmp_path)
    assert [u["nkey"] for u in block["users"]] == [busauth.public_key(f"secret-of-{u}") for u in busauth.ACCESS]
    (tmp_path / "monitor").unlink()
    with pytest.raises(ValueError, match="'monitor'"):
        busauth.authorization_from_keys(tmp_path)


def test_the_charts_permissions_file_is_generated_from_the_table():
    assert json.loads(CHART_PERMISSIONS.read_text()) == busauth.chart_permissions(), (
        "regenerate with: python -m libs.common.busauth permissions > deploy/helm/pai/files/nats-permissions.json"
    )
