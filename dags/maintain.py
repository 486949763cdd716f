"""Maintenance DAGs: one ``maintain_<name>`` DAG per pipeline file, on the pipeline's maintenance schedule.

rewrite_data_files -> rewrite_manifests -> expire_snapshots -> remove_orphan_files (the enabled ones),
each an Iceberg Spark procedure on the pipeline's table, safe beside the ingest DAG (see
``tidewater.ops.maintenance``). Each task logs what it did and attaches it to the table's asset event.
"""

from __future__ import annotations

import logging
from pathlib import Path

from airflow.sdk import Asset, dag, task

from tidewater.config.parse import discover_pipelines, load_pipeline
from tidewater.config.spec import PipelineSpec

log = logging.getLogger(__name__)


def table_asset(spec: PipelineSpec) -> Asset:
    """The table maintained (routed pipelines: their checkpoint table stands for the pipeline's tables)."""
    from tidewater.runtime.airflow import table_asset as asset_of

    return asset_of(spec.catalog.name, spec.checkpoint_table())


def build_maintain_dag(path: Path, spec: PipelineSpec):  # noqa: ANN201 - returns an Airflow DAG
    pipeline_path = str(path)
    asset = table_asset(spec)
    m = spec.maintenance

    @dag(
        dag_id=f"maintain_{spec.name}",
        schedule=m.schedule,
        **spec.airflow.dag_kwargs("maintenance"),
        doc_md=(
            f"### maintenance of `{spec.describe_targets()}`\n\n"
            f"* compaction: {m.rewrite_data_files.strategy}, at least {m.rewrite_data_files.min_input_files} files per group\n"
            f"* expire snapshots older than {m.expire_snapshots.older_than_hours:g} h, keep {m.expire_snapshots.retain_last}; "
            "the snapshot holding the committed offsets and every later one are always kept\n"
            f"* remove orphan files older than {m.remove_orphan_files.older_than_hours:g} h; staged files of batches "
            "in flight are never removed\n* pipeline file: `" + pipeline_path + "`"
        ),
    )
    def maintain():
        previous = None
        for action in m.enabled_actions(spec.applies_changes):

            @task(task_id=action, outlets=[asset])
            def run(action: str = action, **context) -> dict:
                from tidewater.runtime.airflow import maintenance_task

                return maintenance_task(pipeline_path, action, context.get("outlet_events"), asset)

            current = run()
            if previous is not None:
                previous >> current
            previous = current

    return maintain()


for _path in discover_pipelines():
    try:
        _dag = build_maintain_dag(_path, load_pipeline(_path))
    except Exception:  # noqa: BLE001 - shown by the ingest_invalid_<file> DAG of dags/ingest.py
        continue
    globals()[_dag.dag_id] = _dag
