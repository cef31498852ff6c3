"""Waiting for something to happen in another thread or process: poll with a deadline, never sleep for it.

One helper for every test and fake: a test that waits says what it waits for, and a wait that runs out fails with
that name instead of hanging or passing early.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class TimedOut(AssertionError):
    """A wait ran out: a failed check, as pytest reports it, that callers who expect a timeout can tell apart from an
    ``AssertionError`` the check itself raised."""


#: What a check may raise while the thing is not there yet: a refused connection, a half-written answer.
NOT_YET: tuple[type[Exception], ...] = (OSError, ValueError, KeyError)


def wait_for(
    check: Callable[[], T],
    what: str,
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    not_yet: tuple[type[Exception], ...] = NOT_YET,
) -> T:
    """Poll ``check`` until it returns something truthy, and return that; fail after ``timeout`` seconds with
    ``TimedOut``, an ``AssertionError`` that names ``what`` (and the last "not yet" error, if any).

    Exceptions in ``not_yet`` mean "not yet" and are retried; any other ends the wait at once. The pause between
    polls is the poll interval, not a guess at how long the thing takes.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = check()
        except not_yet as error:
            last_error = error
        else:
            if value:
                return value
        if time.monotonic() >= deadline:
            detail = f" (last: {last_error!r})" if last_error is not None else ""
            raise TimedOut(f"timed out after {timeout:g} s waiting for {what}{detail}")
        time.sleep(interval)


def in_a_row(check: Callable[[], bool], times: int) -> Callable[[], bool]:
    """A check for :func:`wait_for` that holds once ``check`` has held ``times`` polls in a row: for a change that
    reaches each worker of a server at its own pace, where one answer proves nothing about the next."""
    streak = 0

    def held() -> bool:
        nonlocal streak
        streak = streak + 1 if check() else 0
        return streak >= times

    return held
