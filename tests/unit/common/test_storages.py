"""Storage declarations, grants and a job's storages (libs/common/storages.py), and the
binds a task gets from them (services/launcher/core/mounts.py)."""

from __future__ import annotations

import pytest

from libs.common.errors import BadInput, Forbidden, NoStorage
from libs.common.storages import (
    Storage,
    StorageData,
    decode_storage,
    detail,
    granted_names,
    parse_storages_file,
    resolve_for_job,
    summary,
    visible,
)
from services.launcher.core.mounts import BindMount, UnmountableStorage, bind_mounts

TEAM = Storage(name="team", type="hostPath", data=StorageData(path="/srv/pai-storage/team"), default=True)
NFS = Storage(name="share", type="nfs", data=StorageData(server="nfs.example", path="/export/share",
                                                          hostPath="/mnt/nfs/share"), readOnly=True)
CLAIM = Storage(name="ckpt", type="pvc", mountPath="/data/ckpt")
DECLARED = {s.name: s for s in (TEAM, NFS, CLAIM)}


@pytest.mark.parametrize(("raw", "field"), [
    ({"name": "a b", "type": "hostPath", "data": {"path": "/x"}}, "name"),
    ({"name": "a", "type": "hostPath", "data": {}}, "data.path"),
    ({"name": "a", "type": "hostPath", "data": {"path": "relative"}}, "data.path"),
    ({"name": "a", "type": "hostPath", "data": {"path": "/x/../etc"}}, "data.path"),
    ({"name": "a", "type": "hostPath", "data": {"path": "/"}}, "data.path"),
    ({"name": "a", "type": "hostPath", "data": {"path": "/proc/1"}}, "data.path"),
    ({"name": "a", "type": "nfs", "data": {"server": "s", "path": "/e", "hostPath": "/dev"}}, "data.hostPath"),
    ({"name": "a", "type": "nfs", "data": {"path": "/export"}}, "data"),
    ({"name": "a", "type": "pvc", "data": {"server": "x"}}, "data"),
    ({"name": "a", "type": "hostPath", "data": {"path": "/x"}, "mountPath": "/proc/x"}, "mountPath"),
    ({"name": "a", "type": "hostPath", "data": {"path": "/x"}, "mountPath": "/"}, "mountPath"),
    ({"name": "a", "type": "hostPath", "data": {"path": "/x"}, "mountPath": "/tmp"}, "mountPath"),
])
def test_a_declaration_that_cannot_be_mounted_is_refused_naming_the_field(raw, field):
    with pytest.raises(BadInput) as refused:
        decode_storage(raw)
    assert refused.value.details["errors"][0]["path"] == field


def test_an_unknown_type_or_field_is_refused():
    with pytest.raises(BadInput, match="type"):
        decode_storage({"name": "a", "type": "s3", "data": {"path": "/x"}})
    with pytest.raises(BadInput, match="size"):
        decode_storage({"name": "a", "type": "hostPath", "data": {"path": "/x"}, "size": 3})


def test_the_storages_file_takes_a_list_or_a_mapping_and_refuses_a_name_twice():
    raw = [{"name": "team", "type": "hostPath", "data": {"path": "/srv/team"}}]
    assert parse_storages_file(raw, "f") == parse_storages_file({"storages": raw}, "f")
    with pytest.raises(BadInput, match="declared twice"):
        parse_storages_file(raw * 2, "f")
    with pytest.raises(BadInput, match=r"storages\[0\]"):
        parse_storages_file([{"name": "x", "type": "nfs"}], "f")


def test_a_caller_sees_what_their_groups_grant_and_an_admin_sees_all():
    granted = granted_names([["team"], ["share", "team"]])
    assert [s.name for s in visible(DECLARED.values(), granted)] == ["share", "team"]
    assert [s.name for s in visible(DECLARED.values(), None)] == ["ckpt", "share", "team"]


@pytest.mark.parametrize(("requested", "granted", "mounted"), [
    (None, frozenset({"team"}), []),  # no teamwise_storage plugin: nothing
    ([], frozenset({"team", "share"}), ["team"]),  # the plugin names none: the granted defaults
    ([], frozenset({"share"}), []),
    (["share", "team"], frozenset({"team", "share"}), ["share", "team"]),
    (["ckpt"], None, ["ckpt"]),  # an admin
])
def test_a_jobs_storages(requested, granted, mounted):
    assert [s.name for s in resolve_for_job(requested, DECLARED, granted)] == mounted


def test_a_storage_not_granted_is_forbidden_and_an_unknown_one_not_found_each_named():
    with pytest.raises(Forbidden, match="'share'") as forbidden:
        resolve_for_job(["team", "share"], DECLARED, frozenset({"team"}))
    assert forbidden.value.status == 403
    with pytest.raises(NoStorage, match="'nope'") as unknown:
        resolve_for_job(["nope"], DECLARED, None)
    assert (unknown.value.status, unknown.value.code) == (404, "NoStorageError")


def test_two_storages_at_overlapping_paths_are_refused():
    inner = Storage(name="inner", type="hostPath", data=StorageData(path="/srv/x"), mountPath="/mnt/team/inner")
    with pytest.raises(BadInput, match="mount_path_overlap|mount at"):
        resolve_for_job(["team", "inner"], {**DECLARED, "inner": inner}, None)


def test_openpais_shapes():
    assert summary(TEAM) == {"name": "team", "share": True, "volumeName": "team", "default": True,
                             "type": "hostPath", "mountPath": "/mnt/team", "readOnly": False}
    assert detail(NFS)["data"] == {"server": "nfs.example", "path": "/export/share", "hostPath": "/mnt/nfs/share"}
    assert summary(CLAIM)["volumeName"] == "ckpt"


def test_binds_of_a_jobs_storages_for_processes_and_containers():
    assert bind_mounts([TEAM, NFS]) == [
        BindMount("/srv/pai-storage/team", "/mnt/team", False),
        BindMount("/mnt/nfs/share", "/mnt/share", True),
    ]
    assert bind_mounts([]) == []
    with pytest.raises(UnmountableStorage, match="ckpt"):
        bind_mounts([CLAIM])


def test_openpais_extras_storages_set_the_mount_path_read_only_and_the_users_own_part():
    from libs.common.storages import StorageRequest

    asks = [StorageRequest(name="team", mountPath="/data/team", readOnly=True, share=False),
            StorageRequest(name="share", mountPath="")]
    got = resolve_for_job(None, DECLARED, frozenset({"team", "share"}), asks=asks, user="alice")
    assert [(s.name, s.mountPath, s.readOnly, s.subPath) for s in got] == [
        ("team", "/data/team", True, "alice"), ("share", "", True, "")]  # share: declared read-only stays so
    assert bind_mounts(got) == [BindMount("/srv/pai-storage/team/alice", "/data/team", True),
                                BindMount("/mnt/nfs/share", "/mnt/share", True)]
    with pytest.raises(Forbidden, match="'ckpt'"):
        resolve_for_job(None, DECLARED, frozenset({"team"}), asks=[StorageRequest(name="ckpt")], user="alice")
