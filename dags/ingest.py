"""Ingest DAGs: one ``ingest_<name>`` DAG per pipeline file in the pipelines directory.

plan -> write (spark-submit) -> validate (great-expectations) -> commit (one Iceberg append).
The plan task short-circuits the rest when every partition is caught up. Task bodies live in
``tidewater.airflow_tasks``; nothing heavy is imported and nothing is contacted at parse time.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path

from airflow.sdk import dag, task

from tidewater.config import PipelineSpec, discover_pipelines, load_pipeline
from tidewater.errors import ConfigError

log = logging.getLogger(__name__)
START = datetime(2024, 1, 1, tzinfo=timezone.utc)


def _doc(spec: PipelineSpec, path: Path) -> str:
    return (
        f"### {spec.name}\n\n{spec.description}\n\n"
        f"* topics: `{', '.join(spec.topics) or '-'}`"
        + (f" and every topic matching `{spec.topic_pattern}`" if spec.topic_pattern else "")
        + f"\n* table: `{spec.describe_targets()}` (catalog `{spec.catalog.name}`)\n"
        f"* batch cap: {spec.batch.max_records} records\n* pipeline file: `{path}`\n\n"
        "plan reads the committed offsets from the table's latest snapshot; write runs the Spark job; "
        "validate runs the data-quality suite on the staged files; commit makes one Iceberg append. "
        "Retrying any task is safe: commit is idempotent per batch id."
    )


def build_ingest_dag(path: Path, spec: PipelineSpec):  # noqa: ANN201 - returns an Airflow DAG
    pipeline_path = str(path)

    @dag(
        dag_id=spec.dag_id,
        schedule=spec.schedule,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=sorted({"tidewater", "ingest", *spec.airflow.tags}),
        doc_md=_doc(spec, path),
        default_args=spec.airflow.default_args(),
    )
    def ingest():
        @task.short_circuit(task_id="plan")
        def plan() -> dict | None:
            from tidewater.airflow_tasks import plan_task

            return plan_task(pipeline_path)

        from tidewater.airflow_tasks import IngestSparkSubmitOperator

        write = IngestSparkSubmitOperator(
            task_id="write", pipeline_path=pipeline_path, conn_id=spec.spark.conn_id, verbose=False
        )

        @task(task_id="validate")
        def validate(planned: dict) -> dict:
            from tidewater.airflow_tasks import validate_task

            return validate_task(pipeline_path, planned)

        @task(task_id="commit")
        def commit(planned: dict, **context) -> dict:
            from tidewater.airflow_tasks import commit_task

            return commit_task(pipeline_path, planned, dag_run_id=context["run_id"])

        planned = plan()
        checked = validate(planned)
        committed = commit(planned)
        planned >> write >> checked >> committed

    return ingest()


def build_invalid_dag(path: Path, error: ConfigError):  # noqa: ANN201
    """A DAG that shows a broken pipeline file in the UI instead of hiding it."""

    @dag(
        dag_id=f"ingest_invalid_{path.stem.replace('.', '_').replace('-', '_')}",
        schedule=None,
        start_date=START,
        catchup=False,
        tags=["tidewater", "invalid-config"],
        doc_md=f"Pipeline file `{path}` is invalid:\n\n```\n{error}\n```",
        default_args={"retries": 0},
    )
    def invalid():
        @task(task_id="config_error")
        def config_error() -> None:
            raise ConfigError(str(error))

        config_error()

    return invalid()


for _path in discover_pipelines():
    try:
        _spec = load_pipeline(_path)
    except ConfigError as _e:
        log.error("%s", _e)
        _dag = build_invalid_dag(_path, _e)
    else:
        _dag = build_ingest_dag(_path, _spec)
    globals()[_dag.dag_id] = _dag
