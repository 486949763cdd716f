"""Freshness deadlines: ``airflow.freshness`` as an Airflow deadline alert on the ingest DAG.

Airflow 3.1+ deadline alerts (``airflow.sdk.definitions.deadline``; Airflow marks them experimental): when an
ingest run is still unfinished ``freshness`` after it was queued (``DeadlineReference.DAGRUN_QUEUED_AT``), Airflow's
scheduler marks the deadline missed and its triggerer calls :func:`late_run` once for that run. It logs a warning,
sends the metric ``tidewater.<name>.late`` and calls ``airflow.on_late`` when set (a callable or a notifier class).

What a deadline cannot see: a pipeline whose runs are never queued (the DAG paused, the scheduler down, a trigger
that never fires) has no run to be late. The lag trigger (``trigger.pending_records``) starts runs when data waits,
and the audit DAG's verdict and the view's freshness show a table that has not moved (docs: From the Airflow UI).
Nothing here is imported at parse time beyond Airflow's light deadline classes.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

log = logging.getLogger(__name__)

CALLBACK = "tidewater.runtime.deadlines.late_run"


def freshness_alert(spec: Any) -> Any | None:
    """The ingest DAG's deadline alert for ``airflow.freshness``; None when unset or where Airflow has no deadline
    alerts (before 3.1)."""
    interval = spec.airflow.freshness_interval()
    if interval is None:
        return None
    try:
        from airflow.sdk.definitions.callback import AsyncCallback
        from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference
    except ImportError:  # Airflow before 3.1: the view still shows freshness
        log.info("pipeline %s: airflow.freshness needs Airflow 3.1 or later (deadline alerts); no deadline set", spec.name)
        return None
    kwargs = {"pipeline": spec.name, "freshness": spec.airflow.freshness, "on_late": spec.airflow.on_late}
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=interval,
        callback=AsyncCallback(CALLBACK, kwargs=kwargs),
        name=f"tidewater_{spec.name}_freshness",
    )


async def late_run(pipeline: str, freshness: str, on_late: str | None = None, context: dict | None = None, **_: Any) -> str:
    """A missed freshness deadline, in Airflow's triggerer: warn, count, then ``on_late``. Returns the warning, which
    Airflow keeps as the callback's output (a string: Airflow stores it as text). A failing ``on_late`` is logged
    with its error, never raised: the warning and the metric were already sent."""
    run = dict((context or {}).get("dag_run") or {})
    run_id = run.get("dag_run_id") or run.get("run_id")  # Airflow's API model of the run names it dag_run_id
    message = (
        f"pipeline {pipeline}: ingest run {run_id} is still unfinished {freshness} after it was "
        f"queued at {run.get('queued_at')} (airflow.freshness)"
    )
    log.warning(message)
    from tidewater.runtime.metrics import late

    late(pipeline)
    info = {"pipeline": pipeline, "freshness": freshness, "message": message, "dag_run": run, "deadline": (context or {}).get("deadline")}
    if on_late:
        try:
            await _call(on_late, info)
        except Exception:
            log.exception("pipeline %s: airflow.on_late %s failed", pipeline, on_late)
    return message


async def _call(path: str, info: dict[str, Any]) -> None:
    """``path``: a callable (sync ones run in a thread, off the triggerer's loop) or a notifier class, made without
    arguments and called with ``info`` as its context (Airflow's ``BaseNotifier.__call__``)."""
    from airflow.sdk.module_loading import import_string

    target = import_string(path)
    if inspect.isclass(target):
        target = target()
    result = await asyncio.to_thread(target, info) if not inspect.iscoroutinefunction(target) else await target(info)
    if inspect.isawaitable(result):
        await result
