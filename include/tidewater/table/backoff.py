"""Retrying a step that another writer or a busy catalog fails for a moment: tenacity's ``Retrying``, set up once.

The commit primitive keeps its own loop (``commit/primitive.py``): each attempt reloads the table, asks its change
again and tells a conflict from an unknown outcome, and counts what it did. Every other retry of the package goes
through ``tries``: a busy or locked catalog (``table/catalog.py: retry_busy``), concurrent first loads of a new SQL
catalog, a schema change that meets another writer's (``table/evolution.py``), the compaction's check of what
landed (``ops/maintenance.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from tenacity import Retrying, retry_if_exception, retry_if_exception_type, stop_after_attempt, wait_incrementing, wait_random


def tries(
    retry_on: type[BaseException] | Callable[[BaseException], bool], *, attempts: int, wait: float, grows: bool = True, jitter: float = 0.0
) -> Retrying:
    """Up to ``attempts`` tries of a block (``for attempt in tries(...): with attempt: ...``) while it fails with
    ``retry_on`` (an exception class, or a test of the exception). Between tries it waits ``wait`` seconds, times the
    try's number when the wait ``grows``, plus up to ``jitter``; the last failure is raised as it was, and any other
    failure at once. ``attempt.retry_state.attempt_number`` counts the tries from 1."""
    retry = retry_if_exception_type(retry_on) if isinstance(retry_on, type) else retry_if_exception(retry_on)
    return Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_incrementing(start=wait, increment=wait if grows else 0.0) + wait_random(0, jitter),
        retry=retry,
        reraise=True,
    )
