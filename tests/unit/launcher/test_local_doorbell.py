"""A shim's doorbell gathers what it rings and sends it as one datagram (local_doorbell)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from services.launcher.backends.local_doorbell import (
    BELL_DATAGRAM_BYTES,
    BELL_GATHER_SECONDS,
    BELL_SEPARATOR,
    FINISHED_BELL,
    RUNNING_BELL,
    Doorbell,
    doorbell_address,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def backend() -> Iterator[tuple[str, socket.socket]]:
    """The backend's end: an abstract datagram socket of a name of its own."""
    name = f"pai-test-bell-{os.getpid()}-{os.urandom(4).hex()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(doorbell_address(name))
    listener.setblocking(False)
    yield name, listener
    listener.close()


def received(listener: socket.socket) -> list[bytes]:
    datagrams = []
    while True:
        try:
            datagrams.append(listener.recv(65536))
        except BlockingIOError:
            return datagrams


def test_what_a_shim_rang_in_one_turn_reaches_the_backend_as_one_datagram(backend):
    name, listener = backend
    clock = Clock()
    bell = Doorbell(name, clock=clock)
    started = RUNNING_BELL + b"job.t1.0.main.0.0\nlimits: cgroup"
    ended = FINISHED_BELL + b'job.t0.0.main.0.0\n{"exitCode":0}'

    bell.ring(started)
    bell.ring(ended)
    assert received(listener) == []  # nothing sent before the flush

    bell.flush()
    bell.flush()  # nothing more to send

    assert received(listener) == [started + BELL_SEPARATOR + ended]
    assert received(listener) == []


def test_a_message_waits_for_the_flush_at_most_the_gather_time(backend):
    name, listener = backend
    clock = Clock()
    bell = Doorbell(name, clock=clock)

    bell.ring(RUNNING_BELL + b"a")
    clock.now += BELL_GATHER_SECONDS / 2
    bell.ring(RUNNING_BELL + b"b")
    assert received(listener) == []
    clock.now += BELL_GATHER_SECONDS / 2
    bell.ring(RUNNING_BELL + b"c")  # the first has waited long enough: all three go

    assert received(listener) == [BELL_SEPARATOR.join([b"Ra", b"Rb", b"Rc"])]


def test_a_datagram_never_grows_past_its_bound(backend):
    name, listener = backend
    bell = Doorbell(name, clock=Clock())
    record = FINISHED_BELL + b"x" * 10_000

    for _ in range(12):
        bell.ring(record)
    bell.flush()

    datagrams = received(listener)
    assert len(datagrams) > 1
    assert all(len(datagram) <= BELL_DATAGRAM_BYTES for datagram in datagrams)
    assert [part for datagram in datagrams for part in datagram.split(BELL_SEPARATOR)] == [record] * 12


def test_a_flush_with_no_backend_listening_loses_the_news_quietly():
    bell = Doorbell(f"pai-test-bell-nobody-{os.urandom(4).hex()}", clock=Clock())
    bell.ring(FINISHED_BELL + b"t")

    bell.flush()  # no error: the backend reads the task records when it comes back
