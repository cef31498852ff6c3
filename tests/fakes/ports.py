"""Loopback ports for the servers the tests start: one probed free, and a start retried when it was taken.

A probed port is free only when probed: between closing the probe and the server's own bind, another process (a
client's ephemeral port, another test's server) may take it. Each server started on one says so in its own way
(``serve`` and the auditor print that they cannot listen, Prometheus exits); its starter raises
:class:`PortTaken` and :func:`on_a_free_port` starts it again on another.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
ATTEMPTS = 3


class PortTaken(Exception):
    """The server could not bind the port it was given: another port may do."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def on_a_free_port(start: Callable[[int], T], attempts: int = ATTEMPTS) -> T:
    """``start(port)`` on a port probed free, again on another while it raises :class:`PortTaken`; the last
    attempt's :class:`PortTaken` is raised."""
    for _ in range(attempts - 1):
        try:
            return start(free_port())
        except PortTaken:
            continue
    return start(free_port())
