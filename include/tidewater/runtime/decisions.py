"""Quarantine decisions in Airflow's inbox (Airflow 3.1+ human-in-the-loop tasks).

A batch the gate quarantines fails its ingest run, as it always has (on-failure callbacks and alerts still fire),
and its commit task opens a decision: a run ``decide__<batch id>`` of the pipeline's ``quarantine_<name>`` DAG
whose ``decide`` task waits in Airflow's "Required actions" with Publish and Drop (and a reason for Drop). The
person's answer runs the existing publish or drop once and records who decided.

Why the waiting task lives in a quarantine run and not in the ingest run: an ingest run that waited for a
person would hold the pipeline's one active run (``max_active_runs: 1``) and stop every later batch, where the
quarantine exists so that ingestion goes on. The quarantine DAG allows many runs at once, so several
undecided batches (and the form's list/publish/drop runs) wait side by side.

Why the commit task starts the run itself instead of a ``TriggerDagRunOperator`` task after it: that operator
is a task of its own that ends in success, which would change the ingest DAG's shape (plan, write, validate,
commit) and turn a quarantined run's failure into a success. The task sends the same request the operator
sends (``TriggerDagRun`` to its supervisor, which asks the API server); where that is not available (Airflow
3.0, or the task run outside Airflow) the run fails as before and the form path decides.
"""

from __future__ import annotations

import logging
from typing import Any

from tidewater.config.spec import PipelineSpec

log = logging.getLogger(__name__)

PUBLISH, DROP = "Publish", "Drop"


def supported() -> bool:
    """Airflow has human-in-the-loop tasks (3.1+) and the task runs under Airflow's supervisor."""
    try:
        from airflow.providers.standard.operators.hitl import HITLOperator  # noqa: F401
        from airflow.sdk.execution_time import task_runner
    except ImportError:
        return False
    return getattr(task_runner, "SUPERVISOR_COMMS", None) is not None


def open_decision(spec: PipelineSpec, batch_id: str, tables: tuple[str, ...], body: str) -> str | None:
    """Start the decision run of a quarantined batch; its run id, or None where Airflow cannot (logged). A run that
    exists already (the commit task retried) is left as it is."""
    if not supported():
        log.info(
            "batch %s is quarantined; decide with the %s DAG's form (publish or drop) or `tidewater quarantine`",
            batch_id,
            spec.dag_ids()["quarantine"],
        )
        return None
    from airflow.sdk.execution_time.comms import ErrorResponse, TriggerDagRun
    from airflow.sdk.execution_time.task_runner import SUPERVISOR_COMMS

    from tidewater.ops.quarantine import decision_run_id

    dag_id, rid = spec.dag_ids()["quarantine"], decision_run_id(batch_id)
    conf = {"decision": True, "batch_id": batch_id, "tables": list(tables), "body": body}
    reply = SUPERVISOR_COMMS.send(TriggerDagRun(dag_id=dag_id, run_id=rid, conf=conf))
    if isinstance(reply, ErrorResponse):
        if "ALREADY_EXISTS" in str(getattr(reply, "error", "")).upper():
            log.info("the decision on batch %s is open already: run %s of %s", batch_id, rid, dag_id)
            return rid
        log.warning("could not open the decision on batch %s (%s); decide with the %s DAG's form", batch_id, reply, dag_id)
        return None
    log.info("batch %s waits for a decision in Airflow's Required actions: run %s of %s", batch_id, rid, dag_id)
    return rid


def body_for(spec: PipelineSpec, plan: Any, tables: tuple[str, ...]) -> str:
    """The decision's Markdown body from what the validate step left in the batch's staging folder."""
    from tidewater.ops.quarantine import decision_body
    from tidewater.runtime.links import data_docs_url
    from tidewater.staging import read_json
    from tidewater.steps.lifecycle import GATE_REPORT_NAME, batch_path

    report_file = batch_path(spec, plan) / GATE_REPORT_NAME
    report = read_json(report_file) if report_file.is_file() else None
    ranges = [(r.topic, r.partition, r.start, r.end) for r in plan.ranges]
    return decision_body(spec, plan.batch_id, tables, report, ranges, data_docs_url(spec, plan.batch_id))


def apply_decision(pipeline_path: str, conf: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """Publish or drop the batch of a decision run as the person chose (``answer``: the ``decide`` task's result),
    on each quarantined table, recording who decided. Publish and drop are done once each, so a retry of this task
    finds them done."""
    from tidewater.config.parse import load_pipeline
    from tidewater.errors import ConfigError
    from tidewater.ops import quarantine

    spec = load_pipeline(pipeline_path)
    chosen = list(answer.get("chosen_options") or [])
    if chosen not in ([PUBLISH], [DROP]):
        raise ConfigError(f"decision on batch {conf.get('batch_id')}: expected {PUBLISH} or {DROP}, got {chosen}")
    user = answer.get("responded_by_user") or {}
    by = str(user.get("name") or user.get("id") or "airflow")
    reason = str((answer.get("params_input") or {}).get("reason") or "")
    batch_id, results = str(conf["batch_id"]), []
    for table in conf.get("tables") or [None]:
        view = quarantine.view_for(spec, table)  # a plain pipeline's one table is its own
        done = quarantine.publish(view, batch_id, by=by) if chosen == [PUBLISH] else quarantine.drop(view, batch_id, reason=reason, by=by)
        log.info("%s decided: %s batch %s of %s (%d rows)", by, done["status"], batch_id, view.table.identifier, done["rows"])
        results.append({"table": view.table.identifier, **done})
    return {"batch_id": batch_id, "decision": chosen[0], "by": by, "reason": reason, "tables": results}
