"""free_port, what every test platform and `NatsServer()` without a port take
their ports from."""

from __future__ import annotations

import socket

from libs.common.natsserver import free_port


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
