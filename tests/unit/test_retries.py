"""The retry policy every task of a pipeline carries (runtime/retries.py), asked as Airflow's task runner asks it;
and the fallback for an Airflow without retry policies (before 3.3), where a terminal error still fails at once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from airflow.sdk.definitions.retry_policy import RetryAction

from tidewater.config.sections.airflow import MAX_RETRY_DELAY, doubled_delay
from tidewater.errors import ConfigError, KafkaReadError, OffsetGapError, TransientError
from tidewater.runtime import retries
from tidewater.runtime.airflow import fail_fast


def policy():
    return retries.retry_policy(timedelta(seconds=10))


def test_a_terminal_error_fails_at_once_with_its_message_as_the_reason():
    decision = policy().evaluate(
        ConfigError("topics: topic 'ordres' is not available on the broker", topic="ordres"), try_number=1, max_tries=3
    )
    assert decision.action is RetryAction.FAIL
    assert decision.reason == ("ConfigError (retrying cannot help): topics: topic 'ordres' is not available on the broker [topic=ordres]")
    assert policy().evaluate(OffsetGapError("gone"), try_number=1, max_tries=3).action is RetryAction.FAIL


def test_a_transient_error_retries_with_a_delay_that_doubles_up_to_an_hour():
    p = policy()
    delays = [p.evaluate(KafkaReadError("broker down"), try_number=n, max_tries=12).retry_delay for n in range(1, 11)]
    assert delays[:4] == [timedelta(seconds=s) for s in (10, 20, 40, 80)]
    assert delays[-1] == MAX_RETRY_DELAY and max(delays) == MAX_RETRY_DELAY
    decision = p.evaluate(TransientError("catalog busy"), try_number=2, max_tries=2)
    assert decision.action is RetryAction.RETRY
    assert decision.reason == "TransientError (worth retrying; try 2 of at most 3, the next in 20 s): catalog busy"
    # a pipeline whose first delay is already above the cap keeps its own delay
    assert doubled_delay(timedelta(hours=2), 3) == timedelta(hours=2)


def test_an_error_raised_from_ours_is_judged_by_ours_and_any_other_keeps_airflows_default():
    try:
        try:
            raise TransientError("catalog locked")
        except TransientError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert policy().evaluate(outer, try_number=1, max_tries=2).action is RetryAction.RETRY
    assert policy().evaluate(RuntimeError("a bug"), try_number=1, max_tries=2).action is RetryAction.DEFAULT
    assert policy().evaluate(KeyboardInterrupt(), try_number=1, max_tries=2).action is RetryAction.DEFAULT


def test_the_policy_serializes_round_trip_and_compares_by_its_delay():
    p = policy()
    again = type(p).deserialize(p.serialize())
    assert again == p and again.base_delay == timedelta(seconds=10) and again != retries.retry_policy(timedelta(seconds=5))


def test_on_3_3_a_task_raises_our_error_itself_so_that_the_policy_decides():
    @fail_fast
    def body() -> None:
        raise ConfigError("kafka.settings: bad")

    with pytest.raises(ConfigError, match="kafka.settings: bad"):
        body()


def test_without_retry_policies_there_is_no_policy_and_a_terminal_error_still_fails_at_once(monkeypatch):
    """Airflow before 3.3 (no ``airflow.sdk.definitions.retry_policy``): stood in for by making the policy base
    unavailable, since this machine has one Airflow. The DAGs then carry no policy; a task turns a terminal error into
    AirflowFailException (no retry) and lets a transient one reach Airflow's retries."""
    from airflow.sdk.exceptions import AirflowFailException

    monkeypatch.setattr(retries, "_policy_base", lambda: None)
    assert retries.retry_policy(timedelta(seconds=10)) is None and not retries.supported()

    @fail_fast
    def terminal() -> None:
        raise ConfigError("kafka.settings: bad")

    @fail_fast
    def transient() -> None:
        raise KafkaReadError("broker down")

    with pytest.raises(AirflowFailException, match="ConfigError: kafka.settings: bad"):
        terminal()
    with pytest.raises(KafkaReadError):
        transient()
    from tests.conftest import REPO
    from tidewater.config.parse import load_pipeline
    from tidewater.runtime.airflow_dags import _dag_kwargs

    spec = load_pipeline(REPO / "include" / "pipelines" / "pizzas.yaml")
    assert "retry_policy" not in _dag_kwargs(spec, "ingest")["default_args"]
