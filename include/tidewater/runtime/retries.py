"""Airflow retry policies from Tidewater's error classes (Airflow 3.3's ``retry_policy``).

Every error of ours says whether retrying can help (``tidewater.errors``). Each task of a pipeline's DAGs carries a
:class:`ErrorClassRetryPolicy`, which Airflow's task runner asks when the task fails:

- a terminal error (a bad setting, a refused schema, a record that cannot be read under ``policy: fail``) fails the
  task at once, with the error as the decision's reason: no retry can help, and the operator learns of it now, not
  ``retries x retry_delay`` later;
- a transient error (an unreachable broker or catalog, a commit conflict) is retried after a growing delay:
  ``airflow.retry_delay_seconds`` doubled at every try, at most an hour (``config.sections.airflow.doubled_delay``),
  within ``airflow.retries``;
- anything else (a bug, a killed process, spark-submit's own failure) keeps Airflow's default.

The error is found on the exception or its causes, so a wrapper raised ``from`` one of ours is judged by ours.
Airflow before 3.3 has no retry policies: :func:`retry_policy` returns None there and the task bodies turn a
terminal error into ``AirflowFailException`` themselves (``runtime/airflow.fail_fast``), as before.
Importing this module is cheap (no heavy library): DAG files are parsed at every task's start.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

from tidewater.config.sections.airflow import doubled_delay
from tidewater.errors import TidewaterError


def tidewater_error(exc: BaseException | None) -> TidewaterError | None:
    """The first of our errors on ``exc`` and the exceptions it was raised from (``__cause__``, then
    ``__context__``), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, TidewaterError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _policy_base() -> type | None:
    try:
        from airflow.sdk.definitions.retry_policy import RetryPolicy
    except ImportError:  # Airflow before 3.3
        return None
    return RetryPolicy


def retry_policy(base_delay: timedelta) -> Any | None:
    """The policy for a pipeline's tasks (``base_delay``: its ``airflow.retry_delay_seconds``), or None where this
    Airflow has no retry policies."""
    base = _policy_base()
    if base is None:
        return None
    return _policy_class(base)(base_delay)


def supported() -> bool:
    """Whether this Airflow asks tasks' retry policies (3.3 and later)."""
    return _policy_base() is not None


@functools.cache
def _policy_class(base: type) -> type:
    """The policy class on this Airflow's ``RetryPolicy`` (made once: Airflow's base class is imported only when it
    exists, so this module also loads on older Airflow)."""
    from airflow.sdk.definitions.retry_policy import RetryDecision

    class ErrorClassRetryPolicy(base):
        """Terminal errors fail at once; transient ones retry with a growing delay; others keep the default."""

        def __init__(self, base_delay: timedelta) -> None:
            self.base_delay = base_delay

        def evaluate(self, exception: BaseException, try_number: int, max_tries: int, context: Any = None) -> Any:
            err = tidewater_error(exception)
            if err is None:
                return RetryDecision.default()
            name = type(err).__name__
            if not err.transient:
                return RetryDecision.fail(reason=f"{name} (retrying cannot help): {err}")
            delay = doubled_delay(self.base_delay, try_number)
            return RetryDecision.retry(
                delay=delay,
                reason=f"{name} (worth retrying; try {try_number} of at most "
                f"{max_tries + 1}, the next in {int(delay.total_seconds())} s): "
                f"{err}",
            )

        def serialize(self) -> dict[str, Any]:
            return {"__type": "tidewater.ErrorClassRetryPolicy", "base_delay": self.base_delay.total_seconds()}

        @classmethod
        def deserialize(cls, data: dict[str, Any]) -> Any:
            return cls(timedelta(seconds=float(data["base_delay"])))

        def __eq__(self, other: object) -> bool:  # DAG-version comparisons: equal settings, same policy
            return type(other) is type(self) and other.base_delay == self.base_delay

        def __hash__(self) -> int:
            return hash(self.base_delay)

    return ErrorClassRetryPolicy
