"""``airflow.freshness`` and ``airflow.on_late`` (runtime/deadlines.py): the setting as a duration or a terminal error
naming it, the ingest DAG's deadline alert, and what a missed deadline calls, run as Airflow's triggerer runs an
async callback (awaited with the pipeline's kwargs and the run's context). Airflow without deadline alerts (before
3.1) is stood in for by hiding the deadline module, since this machine has one Airflow."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from tests.conftest import write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.errors import ConfigError
from tidewater.runtime import deadlines

CALLS: list[dict] = []


def record_late(info: dict) -> None:
    """An ``airflow.on_late`` callable of this test."""
    CALLS.append(info)


class RecordingNotifier:
    """An ``airflow.on_late`` notifier class: made without arguments, called with the context."""

    def __call__(self, context: dict) -> None:
        CALLS.append({"notifier": True, **context})


def spec_with(tmp_path: Path, **airflow: object):
    return load_pipeline(write_pipeline(tmp_path, topics=["t"], airflow=airflow))


@pytest.mark.parametrize(("value", "seconds"), [("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), (" 5 m ", 300)])
def test_freshness_is_a_duration(tmp_path, value, seconds):
    assert spec_with(tmp_path, freshness=value).airflow.freshness_interval() == timedelta(seconds=seconds)


@pytest.mark.parametrize("value", ["15 minutes", "0m", "m", "-5m", "1.5h"])
def test_a_freshness_that_is_not_a_duration_is_refused_naming_the_setting(tmp_path, value):
    with pytest.raises(ConfigError, match=r"airflow\.freshness: .* is not a duration such as 90s, 15m, 2h or 1d"):
        spec_with(tmp_path, freshness=value)


def test_on_late_must_be_a_dotted_path(tmp_path):
    with pytest.raises(ConfigError, match=r"airflow\.on_late: 'page me' is not a dotted path"):
        spec_with(tmp_path, freshness="15m", on_late="page me")


def test_the_ingest_dag_gets_a_deadline_on_the_time_its_run_was_queued(tmp_path, monkeypatch):
    from airflow.sdk.definitions.deadline import DeadlineReference

    from tidewater.runtime.airflow_dags import build_ingest_dag

    path = write_pipeline(tmp_path, topics=["t"], airflow={"freshness": "15m", "on_late": f"{__name__}.record_late"})
    dag = build_ingest_dag(path, load_pipeline(path))
    (alert,) = dag.deadline if isinstance(dag.deadline, list) else [dag.deadline]
    assert alert.reference == DeadlineReference.DAGRUN_QUEUED_AT and alert.interval == timedelta(minutes=15)
    assert alert.callback.path == deadlines.CALLBACK
    assert alert.callback.kwargs == {"pipeline": "orders", "freshness": "15m", "on_late": f"{__name__}.record_late"}
    (tmp_path / "plain").mkdir()
    plain = write_pipeline(tmp_path / "plain", topics=["t"])  # no airflow.freshness: no deadline
    assert not build_ingest_dag(plain, load_pipeline(plain)).deadline


def test_a_missed_deadline_warns_counts_and_calls_on_late_with_the_run(caplog, monkeypatch):
    sent: list[str] = []
    monkeypatch.setattr("tidewater.runtime.metrics.late", lambda pipeline: sent.append(pipeline))
    CALLS.clear()
    context = {
        "dag_run": {"dag_id": "ingest_orders", "dag_run_id": "scheduled__1", "queued_at": "2026-11-27T04:00:00Z"},
        "deadline": {"id": "d1", "deadline_time": "2026-11-27T04:15:00Z"},
    }
    with caplog.at_level("WARNING", logger="tidewater.runtime.deadlines"):
        output = asyncio.run(deadlines.late_run("orders", "15m", f"{__name__}.record_late", context=context))
    message = (
        "pipeline orders: ingest run scheduled__1 is still unfinished 15m after it was queued at 2026-11-27T04:00:00Z (airflow.freshness)"
    )
    assert output == message and caplog.messages == [message] and sent == ["orders"]
    (info,) = CALLS
    assert info == {
        "pipeline": "orders",
        "freshness": "15m",
        "message": message,
        "dag_run": context["dag_run"],
        "deadline": context["deadline"],
    }
    asyncio.run(deadlines.late_run("orders", "15m", f"{__name__}.RecordingNotifier", context=context))
    assert CALLS[-1]["notifier"] and CALLS[-1]["pipeline"] == "orders"


def test_a_failing_on_late_is_logged_and_the_warning_and_metric_still_go_out(caplog, monkeypatch):
    sent: list[str] = []
    monkeypatch.setattr("tidewater.runtime.metrics.late", lambda pipeline: sent.append(pipeline))
    with caplog.at_level("WARNING", logger="tidewater.runtime.deadlines"):
        asyncio.run(deadlines.late_run("orders", "15m", "no_such_module.page", context={}))
    assert sent == ["orders"]
    assert any("airflow.on_late no_such_module.page failed" in m for m in caplog.messages)


def test_without_deadline_alerts_the_dag_has_none(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "airflow.sdk.definitions.deadline", None)  # import fails: Airflow before 3.1
    assert deadlines.freshness_alert(spec_with(tmp_path, freshness="15m")) is None
