"""The fork server's feed to a shim: what a shim gets whole, and what goes to
the next shim (local_forkserver.FedShim, local_shim.Shim._read_feed)."""

from __future__ import annotations

import fcntl
import os
import select
import time

import pytest

from services.launcher.backends import local_forkserver
from services.launcher.backends.local_forkserver import MAX_TASKS_PER_SHIM, FedShim
from services.launcher.backends.local_layout import (
    STALE_LINE_SECONDS,
    ShimSpec,
    decoder,
    encode,
    with_sent_at,
)
from services.launcher.backends.local_shim import Shim

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, Linux


def lines(count: int, size: int = 100) -> list[bytes]:
    return [f"{i:04d}".encode() + b"x" * (size - 4) for i in range(count)]


class FeedReader:
    """A shim's feed handling alone (no signals, no subreaper, no process name)."""

    def __init__(self, fd: int):
        self.shim = Shim.__new__(Shim)
        self.shim.poller = select.epoll()
        self.shim.feed = fd
        self.shim._feed_rest = b""
        os.set_blocking(fd, False)
        self.shim.poller.register(fd, select.EPOLLIN)
        self.taken: list[bytes] = []
        self.shim.take = self.taken.append  # type: ignore[method-assign]

    def read_all(self) -> list[bytes]:
        """Every line taken until EOF (the shim closes its end of the feed then)."""
        while self.shim.feed is not None:
            self.shim._read_feed()
        self.shim.poller.close()
        return self.taken


@pytest.fixture
def feed():
    """A pipe; each test closes both ends (FedShim.close, the reader at EOF, or
    itself): closing a number twice could close an fd opened since."""
    return os.pipe()


def test_a_fed_shim_gets_every_line_whole_while_there_is_room(feed):
    read_end, write_end = feed
    fed = FedShim(write_end, taken=1, seconds=1.0)
    sent = lines(3)
    assert fed.send(sent) == []
    assert fed.taken == 4
    fed.close()
    assert FeedReader(read_end).read_all() == sent


def test_a_shim_takes_at_most_its_share_and_the_rest_comes_back(feed):
    read_end, write_end = feed
    fed = FedShim(write_end, taken=MAX_TASKS_PER_SHIM - 2, seconds=1.0)
    sent = lines(5)
    assert fed.send(sent) == sent[2:]
    assert fed.taken == MAX_TASKS_PER_SHIM
    assert fed.send(lines(1)) == lines(1)  # full
    fed.close()
    assert FeedReader(read_end).read_all() == sent[:2]


def test_a_line_cut_short_by_a_full_pipe_goes_to_the_next_shim_and_not_to_this_one(feed):
    read_end, write_end = feed
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    fed = FedShim(write_end, taken=0, seconds=1.0)
    sent = lines(6, size=1000)  # 1001 bytes with the newline: four fit whole in 4096
    rest = fed.send(sent)
    assert rest == sent[4:]
    assert fed.taken == 4
    fed.close()  # the shim reads the cut fifth line up to EOF, and drops it
    assert FeedReader(read_end).read_all() == sent[:4]


def test_a_shim_that_is_gone_gets_nothing_and_everything_comes_back(feed):
    read_end, write_end = feed
    os.close(read_end)
    fed = FedShim(write_end, taken=1, seconds=1.0)
    sent = lines(2)
    assert fed.send(sent) == sent
    assert fed.taken == 1
    fed.close()


def test_a_spec_reader_waits_no_longer_than_asked(feed):
    read_end, write_end = feed
    reader = local_forkserver.SpecReader(read_end)
    assert reader.next_batch(busy=False, timeout=0.01) == []
    assert not reader.ended
    os.write(write_end, b"one\ntw")
    assert reader.next_batch(busy=False, timeout=0.01) == [b"one"]
    assert reader.next_batch(busy=False, timeout=0.01) == []  # half a line: not yet
    os.write(write_end, b"o\n")
    assert reader.next_batch(busy=False, timeout=0.01) == [b"two"]
    os.close(write_end)
    assert reader.next_batch(busy=False, timeout=0.01) == []
    assert reader.ended
    os.close(read_end)


def test_a_copy_of_a_task_sent_long_ago_is_not_taken(tmp_path):
    # The backend sent the task again meanwhile; this copy, had it been taken,
    # could run the task a second time once the first run's record is pruned.
    spec = ShimSpec(taskPath=str(tmp_path / "task"), slug="stale", commands=["true"], env={}, cpu=0, memoryMB=0)
    shim = Shim.__new__(Shim)  # nothing of it is used before the claim
    shim.take(with_sent_at(encode(spec), time.time() - STALE_LINE_SECONDS - 1))
    assert not (tmp_path / "task").exists()
    assert decoder(ShimSpec).decode(with_sent_at(encode(spec), 12.5)).sentAt == 12.5
