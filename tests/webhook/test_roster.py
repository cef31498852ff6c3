"""The roster the workers of one master share, and what a worker does about its share of the connections."""

from __future__ import annotations

import os

import pytest

from gpu_fence.webhook.roster import RETIRE_AT, STALE_SECONDS, Roster, Share, share


@pytest.mark.parametrize(
    ("mine", "others", "expected"),
    [
        (8, [], Share(accept=True, retire=0)),  # alone: nothing to even out
        (0, [8], Share(accept=True, retire=0)),  # a replacement, or the idle one
        (8, [0], Share(accept=False, retire=4)),  # the one holding everything: half go
        (4, [4], Share(accept=True, retire=0)),
        (5, [4], Share(accept=True, retire=0)),  # near even: both accept, both keep theirs
        (4 + RETIRE_AT - 1, [4], Share(accept=True, retire=0)),
        (4 + RETIRE_AT, [4], Share(accept=False, retire=RETIRE_AT // 2)),  # until even, the other takes new ones
        (9, [3, 0, 6], Share(accept=False, retire=4)),  # measured against the least-loaded sibling
        (0, [0, 0], Share(accept=True, retire=0)),
    ],
)
def test_share(mine, others, expected):
    assert share(mine, others) == expected


def test_the_least_loaded_worker_always_accepts():
    counts = [7, 2, 2, 9]
    for index, mine in enumerate(counts):
        others = counts[:index] + counts[index + 1 :]
        assert share(mine, others).accept is (mine < min(others) + RETIRE_AT)
    assert any(share(mine, counts[:i] + counts[i + 1 :]).accept for i, mine in enumerate(counts))


def test_a_worker_forked_later_sees_and_is_seen():
    roster = Roster(slots=4)
    first = roster.join(now=100.0)
    roster.publish(first, 8, now=100.0)

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a second worker, forked from the same master
        try:
            slot = roster.join(now=100.5)
            roster.publish(slot, 1, now=100.5)
            os.write(write, f"{slot} {roster.others(slot, now=100.5)}".encode())
        finally:
            os._exit(0)
    os.close(write)
    slot, seen = os.read(read, 64).decode().split(" ", 1)
    os.close(read)
    os.waitpid(child, 0)

    assert int(slot) != first and seen == "[8]"  # the child saw the parent's count
    assert roster.others(first, now=101.0) == [1]  # and the parent sees the child's: the pages are shared


def test_a_sibling_that_stopped_publishing_is_left_out_and_its_slot_taken():
    roster = Roster(slots=2)
    dead = roster.join(now=10.0)
    roster.publish(dead, 5, now=10.0)
    alive = roster.join(now=10.0)
    assert roster.others(alive, now=10.0 + STALE_SECONDS) == [5]
    assert roster.others(alive, now=10.0 + STALE_SECONDS + 0.1) == []  # killed or wedged: not waited on
    assert roster.join(now=10.0) is None  # every slot live
    assert roster.join(now=10.0 + STALE_SECONDS + 0.1) == dead  # a replacement takes the stale one


def test_a_stopping_worker_leaves_at_once():
    roster = Roster(slots=2)
    stopping, other = roster.join(now=1.0), roster.join(now=1.0)
    roster.publish(stopping, 3, now=1.0)
    assert roster.holds(stopping)
    roster.leave(stopping)
    assert roster.others(other, now=1.0) == [] and not roster.holds(stopping)


def test_each_master_has_its_own_roster():
    one, other = Roster(slots=2), Roster(slots=2)
    one.publish(one.join(now=1.0), 4, now=1.0)
    assert other.others(None, now=1.0) == []
