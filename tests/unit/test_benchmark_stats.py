"""What the throughput benchmarks say about the filesystem their data dir is on."""

from __future__ import annotations

import os

import pytest

from benchmarks.stats import _unescape, _within, filesystem_of


@pytest.mark.parametrize(
    ("path", "mount_point", "within"),
    [
        ("/tmp/x", "/", True),
        ("/dev/shm", "/dev/shm", True),
        ("/dev/shm/pai", "/dev/shm", True),
        ("/dev/shmem/pai", "/dev/shm", False),  # a prefix of the name, not of the path
        ("/mnt/j", "/mnt/j/", True),
        ("/var", "/var/tmp", False),
    ],
)
def test_a_path_is_within_a_mount_point_by_whole_components(path, mount_point, within):
    assert _within(path, mount_point) is within


@pytest.mark.parametrize(
    ("field", "path"),
    [
        ("/mnt/data", "/mnt/data"),
        (r"/mnt/my\040disk", "/mnt/my disk"),
        (r"/mnt/a\011b\134c", "/mnt/a\tb\\c"),
    ],
)
def test_a_mountinfo_field_is_read_back_as_the_path_it_escapes(field, path):
    assert _unescape(field) == path


def test_tmpfs_is_named_and_says_nothing_of_a_journal():
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat("/").st_dev:
        pytest.skip("no separate /dev/shm here")
    found = filesystem_of("/dev/shm")
    assert found["type"] == "tmpfs"
    assert found["mount_point"] == "/dev/shm"
    assert "journal" not in found


def test_the_deepest_mount_holding_the_path_is_the_one_named(tmp_path):
    found = filesystem_of(str(tmp_path))
    assert found["path"] == os.path.realpath(tmp_path)
    # No other mount between it and the path: the path's own device, and the longest prefix.
    assert os.stat(found["mount_point"]).st_dev == os.stat(tmp_path).st_dev
    assert _within(found["path"], found["mount_point"])
    if found["type"] in ("ext3", "ext4"):
        assert isinstance(found["journal"], bool)
