"""tests/fakes/ports.py: a port probed free, and a server's start tried again on another while its port was taken."""

from __future__ import annotations

import socket

import pytest

from tests.fakes.ports import ATTEMPTS, PortTaken, free_port, on_a_free_port


def test_a_probed_port_can_be_bound_on_loopback() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", free_port()))


def test_a_taken_port_is_followed_by_another_until_one_binds() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        tried: list[int] = []

        def start(port: int) -> int:
            tried.append(port)
            if len(tried) == 1:
                port = taken  # as if another process had taken the first port before the bind
            with socket.socket() as server:
                try:
                    server.bind(("127.0.0.1", port))
                except OSError:
                    raise PortTaken(port) from None
            return port

        bound = on_a_free_port(start)
    assert len(tried) == 2 and bound == tried[1] != taken


def test_the_last_attempt_s_port_taken_is_raised_and_other_errors_at_once() -> None:
    calls: list[int] = []

    def always_taken(port: int) -> None:
        calls.append(port)
        raise PortTaken(port)

    with pytest.raises(PortTaken):
        on_a_free_port(always_taken)
    assert len(calls) == ATTEMPTS

    def broken(port: int) -> None:
        calls.append(port)
        raise ValueError("not a port problem")

    calls.clear()
    with pytest.raises(ValueError, match="not a port problem"):
        on_a_free_port(broken)
    assert len(calls) == 1
