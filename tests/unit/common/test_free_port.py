"""free_port, what every test platform and `NatsServer()` without a port take
their ports from; check_port_free, what `NatsServer.start` asks first."""

from __future__ import annotations

import socket

import pytest

from libs.common.natsserver import check_port_free, free_port


def test_free_port_never_hands_out_a_port_twice():
    # The kernel picks at random from ~14,000 ports: a thousand picks would
    # repeat one almost surely, and a platform given one port twice fails to start.
    ports = [free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)


def test_a_port_from_free_port_can_be_listened_on():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()


def test_a_port_something_listens_on_is_refused_naming_it_and_what_to_do():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"NATS's port 127.0.0.1:{port} is in use .*nats_url"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # closed: free again


def test_a_port_left_in_time_wait_counts_as_free():
    # A server stopped a moment ago leaves its connections in TIME_WAIT; the next
    # nats-server binds with SO_REUSEADDR and starts, so the check must not refuse it.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the listening side closes first: its end goes to TIME_WAIT
        client.close()
    check_port_free("127.0.0.1", port)
