"""The one retry helper outside the commit primitive (table/backoff.py): how many tries, which failures, what is raised."""

from __future__ import annotations

import pytest

from tidewater.table.backoff import tries


class Busy(Exception):
    pass


def run(block, **kw):
    calls = []
    for attempt in tries(Busy, attempts=4, wait=0.0, **kw):
        with attempt:
            calls.append(attempt.retry_state.attempt_number)
            block(len(calls))
    return calls


def test_a_failure_it_retries_is_tried_again_until_the_block_passes():
    def block(n):
        if n < 3:
            raise Busy(n)

    assert run(block) == [1, 2, 3]


def test_the_last_failure_is_raised_as_it_was_after_the_last_try():
    def block(n):
        raise Busy(n)

    with pytest.raises(Busy) as e:
        run(block)
    assert e.value.args == (4,)


def test_another_failure_is_raised_at_once():
    def block(n):
        raise ValueError(n)

    with pytest.raises(ValueError) as e:
        run(block)
    assert e.value.args == (1,)


def test_a_test_of_the_exception_chooses_what_is_retried():
    seen = []
    with pytest.raises(RuntimeError, match="locked"):
        for attempt in tries(lambda e: "locked" in str(e), attempts=3, wait=0.0):
            with attempt:
                seen.append(attempt.retry_state.attempt_number)
                raise RuntimeError("database is locked")
    assert seen == [1, 2, 3]


def test_the_wait_grows_with_the_try_unless_told_otherwise():
    grows = tries(Busy, attempts=5, wait=0.2).wait
    fixed = tries(Busy, attempts=5, wait=0.5, grows=False).wait

    class State:
        def __init__(self, n):
            self.attempt_number = n

    assert [round(grows(State(n)), 3) for n in (1, 2, 3)] == [0.2, 0.4, 0.6]
    assert [round(fixed(State(n)), 3) for n in (1, 2, 3)] == [0.5, 0.5, 0.5]
