"""tests/fakes/polling.py, the one way tests wait: the value returned, "not yet" retried, the deadline named."""

from __future__ import annotations

import itertools

import pytest

from tests.fakes.polling import TimedOut, wait_for


def test_returns_the_first_truthy_value_and_retries_what_is_not_there_yet() -> None:
    answers = iter([ConnectionRefusedError(), None, 0, "up"])

    def check() -> str | None:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_for(check, "the server", interval=0) == "up"


def test_a_wait_that_runs_out_names_what_it_waited_for_and_the_last_error() -> None:
    def refused() -> bool:
        raise ConnectionRefusedError("refused")

    with pytest.raises(AssertionError, match=r"timed out after 0\.05 s waiting for the port .*refused"):
        wait_for(refused, "the port", timeout=0.05, interval=0.01)


def test_an_unexpected_error_ends_the_wait_at_once() -> None:
    calls = itertools.count()

    def broken() -> bool:
        next(calls)
        raise RuntimeError("the process exited")

    with pytest.raises(RuntimeError, match="exited"):
        wait_for(broken, "a broken thing", timeout=30)
    assert next(calls) == 1


def test_a_wait_that_runs_out_is_told_apart_from_a_check_that_fails() -> None:
    with pytest.raises(TimedOut, match="waiting for nothing"):
        wait_for(lambda: False, "nothing", timeout=0.05, interval=0.01)

    def failing() -> bool:
        raise AssertionError("the check's own")

    with pytest.raises(AssertionError, match="the check's own") as raised:
        wait_for(failing, "a failing check", timeout=30)
    assert not isinstance(raised.value, TimedOut)
