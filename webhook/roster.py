"""How many connections each worker of this master holds, in memory the master and every worker it forks share, and
what a worker does about its share.

The workers accept from one listening socket, and whichever is first in ``accept`` wins: often the one already
running, so one worker can end up holding every kept-alive connection of the API server while another idles. The
same happens when a worker is killed and replaced: the API server reconnects at once, before the replacement
accepts, and Go's HTTP client then keeps a connection for as long as it is used. A connection's age limit
(``Limits.connection_seconds``) would even this out only as fast as connections age. Instead, every loop turn a
worker publishes how many connections it holds (those open for a second or more: shorter-lived ones go by
themselves), and reads what its live siblings publish (:func:`share`):

* a worker holding ``RETIRE_AT`` or more connections over its least-loaded sibling retires half the difference:
  those connections answer their next request with ``Connection: close``;
* and until it is even again it does not accept, so that the API server's reconnections land on the workers
  with room. Nearer even, every worker accepts: short-lived connections come and go faster than counts are
  published, and a worker that waits on a stale count only delays a connection.

A slot whose worker has not published for ``STALE_SECONDS`` (killed, stopping, or wedged until gunicorn kills it)
is not counted, so no worker waits on a dead sibling, and a new worker may take it.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
from dataclasses import dataclass

#: a sibling that has not published for this long is left out (a worker's loop turns at least once a second)
STALE_SECONDS = 3.0
#: a worker holding this many connections over the least-loaded sibling retires some, and accepts no more
RETIRE_AT = 3


@dataclass(frozen=True)
class Share:
    """What a worker does this turn: whether it accepts, and how many more of its connections it retires."""

    accept: bool
    retire: int


def share(mine: int, others: list[int]) -> Share:
    """For a worker holding ``mine`` connections (less those already retiring), beside live siblings holding
    ``others``. Pure. The least-loaded worker always accepts, so some worker always does."""
    if not others:
        return Share(accept=True, retire=0)
    over = mine - min(others)
    if over < RETIRE_AT:
        return Share(accept=True, retire=0)
    return Share(accept=False, retire=over // 2)


class Roster:
    """One slot a worker: its pid, when it last published, and how many connections it held then.

    Made in the master before it forks, so every worker, a replacement included, maps the same shared pages. A slot
    is written only by the worker that holds it, and taken under a lock.
    """

    def __init__(self, slots: int = 64) -> None:
        context = multiprocessing.get_context("fork")  # gunicorn forks its workers; the pages are inherited
        self._pids = context.RawArray(ctypes.c_int, slots)
        self._published = context.RawArray(ctypes.c_double, slots)
        self._counts = context.RawArray(ctypes.c_int, slots)
        self._lock = context.Lock()

    def join(self, now: float) -> int | None:
        """Take a free or stale slot for the calling process; None when every slot is live (the worker then
        accepts as if alone). ``now`` is ``time.monotonic()``: CLOCK_MONOTONIC, one clock for the whole machine."""
        with self._lock:
            for slot in range(len(self._pids)):
                if self._pids[slot] == 0 or now - self._published[slot] > STALE_SECONDS:
                    self._pids[slot] = os.getpid()
                    self._counts[slot] = 0
                    self._published[slot] = now
                    return slot
        return None

    def holds(self, slot: int) -> bool:
        """Whether the slot is still the calling process's (a worker wedged past ``STALE_SECONDS`` may lose it)."""
        return self._pids[slot] == os.getpid()

    def publish(self, slot: int, count: int, now: float) -> None:
        self._counts[slot] = count
        self._published[slot] = now

    def others(self, slot: int | None, now: float) -> list[int]:
        """The counts of the live siblings (those that published within ``STALE_SECONDS``)."""
        return [
            self._counts[other]
            for other in range(len(self._pids))
            if other != slot and self._pids[other] != 0 and now - self._published[other] <= STALE_SECONDS
        ]

    def leave(self, slot: int) -> None:
        """Give the slot up (a stopping worker): siblings stop counting it at once."""
        with self._lock:
            if self._pids[slot] == os.getpid():
                self._pids[slot] = 0
                self._published[slot] = 0.0
