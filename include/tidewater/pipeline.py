"""The steps of one batch (plan, write, validate, commit), shared by the Airflow DAG and the CLI.

Each step reads what the previous one staged (plan.json, manifest.json) so that any step can be
retried on its own: write never commits, validate never changes anything, and commit is idempotent.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tidewater.batch import (
    BatchManifest,
    BatchPlan,
    batch_dir,
    new_batch_id,
    read_json,
    utc_now_iso,
    write_json_atomic,
)
from tidewater.catalog import load_catalog, load_table
from tidewater.committing import CommitResult, commit_batch
from tidewater.config import PipelineSpec, load_pipeline
from tidewater.errors import TerminalError, TransientError
from tidewater.offsets import DEAD_LETTERS, SKIPPED, committed_state, summary_dict
from tidewater.planning import plan_ranges
from tidewater.validating import ValidationReport, require_valid, validate_batch

log = logging.getLogger(__name__)

PLAN_NAME = "plan.json"


def spark_app_path() -> Path:
    """spark_apps/ingest_batch.py of this checkout (the package lives in include/)."""
    env = os.environ.get("TIDEWATER_SPARK_APP")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "spark_apps" / "ingest_batch.py"


# ---- plan ------------------------------------------------------------------------------------------


def plan_batch(spec: PipelineSpec, data_interval: tuple[str, str] | None = None) -> tuple[BatchPlan, Path | None]:
    """Plan the next batch from the table's committed offsets and the brokers' end offsets.

    An empty plan is not staged (returns path None): nothing to do, no Spark start.
    """
    from tidewater.kafka_source import kafka_settings, list_partitions, resolve_topics, watermarks

    catalog = load_catalog(spec)
    table = load_table(catalog, spec.checkpoint_table())
    state = committed_state(table, None if spec.routed else spec.table.branch) if table is not None else None
    committed = state.offsets if state else {}
    settings = kafka_settings(spec)
    parts = list_partitions(settings, resolve_topics(settings, spec))
    wm = watermarks(settings, parts)
    ranges = plan_ranges(committed, wm, spec.batch.max_records)
    plan = BatchPlan(
        batch_id=new_batch_id(),
        pipeline=spec.name,
        table=spec.checkpoint_table(),
        pipeline_path=str(spec.source_path),
        ranges=tuple(ranges),
        base_offsets=committed,
        created_at=utc_now_iso(),
        base_snapshot_id=state.snapshot_id if state else None,
        data_interval=data_interval,
    )
    if plan.is_empty:
        log.info("pipeline %s: nothing to ingest (%d partitions caught up)", spec.name, len(parts))
        return plan, None
    path = batch_dir(spec.staging_dir(), spec.name, plan.batch_id) / PLAN_NAME
    write_json_atomic(path, plan.to_json())
    log.info(
        "pipeline %s: planned batch %s: %d offsets over %d partitions -> %s",
        spec.name, plan.batch_id, plan.record_span, len(plan.ranges), spec.describe_targets(),
    )
    for r in plan.ranges:
        log.info("  %s[%d] [%d, %d) %d", r.topic, r.partition, r.start, r.end, r.size)
    return plan, path


def load_plan(plan_path: str | Path) -> BatchPlan:
    return BatchPlan.from_json(read_json(plan_path))


# ---- write -----------------------------------------------------------------------------------------


def manifest_path(plan_path: str | Path) -> Path:
    from tidewater.spark_job import MANIFEST_NAME

    return Path(plan_path).parent / MANIFEST_NAME


def load_manifest(plan_path: str | Path) -> BatchManifest:
    """The write step's manifest; raises the write step's own error if it failed."""
    from tidewater.spark_job import read_error

    mpath = manifest_path(plan_path)
    if not mpath.is_file():
        err = read_error(Path(plan_path).parent)
        if err is not None:
            raise err
        raise TerminalError(f"no manifest at {mpath}: the write step has not completed")
    return BatchManifest.from_json(read_json(mpath))


def run_write_step(spec: PipelineSpec, plan_path: Path, master: str | None = None, progress: Any = None) -> BatchManifest:
    """Run the Spark job with spark-submit (as the DAG does) and return its manifest."""
    from tidewater.spark_job import ERROR_NAME, read_error
    from tidewater.spark_session import spark_submit_command

    (plan_path.parent / ERROR_NAME).unlink(missing_ok=True)
    manifest_path(plan_path).unlink(missing_ok=True)
    cmd = spark_submit_command(spec, str(spark_app_path()), ["--plan", str(plan_path)], master=master)
    log_path = plan_path.parent / "spark-submit.log"
    started = time.monotonic()
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=_spark_env())
        while proc.poll() is None:
            time.sleep(0.5)
            if progress is not None:
                progress(time.monotonic() - started)
    if proc.returncode != 0:
        err = read_error(plan_path.parent)
        if err is not None:
            raise err
        tail = log_path.read_text()[-3000:]
        raise TransientError(f"spark-submit exited with {proc.returncode}; log {log_path}:\n{tail}")
    return load_manifest(plan_path)


def _spark_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return env


# ---- validate and commit ---------------------------------------------------------------------------


def validate_step(spec: PipelineSpec, plan: BatchPlan, manifest: BatchManifest) -> ValidationReport:
    """Run the quality gate; raises ValidationFailedError (nothing committed) when it fails."""
    from tidewater.data_docs import write_page

    catalog = load_catalog(spec)
    table = None if spec.routed else load_table(catalog, spec.table.identifier)
    if spec.routed:
        from tidewater.validating import validate_routed

        report = validate_routed(spec, catalog, manifest)
    elif table is None:
        if manifest.data_files:
            raise TerminalError("staged files exist but the table does not", table=spec.table.identifier)
        if manifest.records:  # every record dead-lettered or skipped: only the accounting to check
            from tidewater.validating import builtin_checks

            checks = tuple(builtin_checks(spec, None, manifest))
            report = ValidationReport(plan.batch_id, "builtin", all(c.success for c in checks), 0, checks)
        else:
            from tidewater.validating import CheckResult

            report = ValidationReport(plan.batch_id, "builtin", True, 0, (CheckResult("no records", {}, True),))
    else:
        report = validate_batch(spec, table, manifest)
    page = write_page(spec, report, plan.table)
    if page is not None:
        log.info("batch %s: Data Docs %s", plan.batch_id, page.as_uri())
    require_valid(report, spec.validation.on_failure)
    # What the gate decided travels to the commit (stamped in the snapshot summary).
    verdict = report.summary()
    if not report.success and spec.validation.on_failure == "quarantine":
        verdict["quarantine"] = True
    write_json_atomic(_batch_path(spec, plan) / VALIDATION_NAME, verdict)
    return report


VALIDATION_NAME = "validation.json"


def _batch_path(spec: PipelineSpec, plan: BatchPlan) -> Path:
    return batch_dir(spec.staging_dir(), spec.name, plan.batch_id)


def commit_step(spec: PipelineSpec, plan: BatchPlan, manifest: BatchManifest, dag_run_id: str | None = None) -> CommitResult:
    path = _batch_path(spec, plan) / VALIDATION_NAME
    validation = read_json(path) if path.is_file() else None
    sink: Any = None
    if spec.dead_letter.topic:
        from tidewater.dead_letters import produce_to_topic
        from tidewater.kafka_source import kafka_settings

        topic = spec.dead_letter.topic

        def send(table: Any, files: list[dict[str, Any]]) -> str:
            sent = produce_to_topic(kafka_settings(spec), topic, table, files)
            log.info("batch %s: %d dead letters sent to topic %s", plan.batch_id, sent, topic)
            return topic

        sink = send

    if plan.mode != "ingest":
        from tidewater.replay import commit_replay

        return commit_replay(load_catalog(spec), spec, plan, manifest, dag_run_id=dag_run_id, validation=validation)
    if spec.routed:
        from tidewater.committing import commit_routed

        return commit_routed(load_catalog(spec), plan, manifest, dag_run_id=dag_run_id, validation=validation,
                             dead_letter_sink=sink)
    quarantine = bool(validation and validation.get("quarantine"))
    result = commit_batch(load_catalog(spec), plan, manifest, dag_run_id=dag_run_id, validation=validation,
                          dead_letter_sink=sink, branch=spec.table.branch, quarantine=quarantine)
    if quarantine:
        from tidewater.quarantine import quarantined_error

        raise quarantined_error(plan.batch_id, plan.table, validation, str(spec.source_path))
    return result


# ---- status ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    committed: int | None
    log_start: int
    end: int

    @property
    def lag(self) -> int:
        return self.end - (self.committed if self.committed is not None else self.log_start)


def status(spec: PipelineSpec) -> dict[str, Any]:
    """Committed offset, end offset and lag per partition; last snapshot; valid-through."""
    from tidewater.kafka_source import kafka_settings, list_partitions, resolve_topics, watermarks

    catalog = load_catalog(spec)
    table = load_table(catalog, spec.checkpoint_table())
    state = committed_state(table, None if spec.routed else spec.table.branch) if table is not None else None
    settings = kafka_settings(spec)
    wm = watermarks(settings, list_partitions(settings, resolve_topics(settings, spec)))
    parts = [
        PartitionStatus(t, p, (state.offsets.get(t, {}).get(p) if state else None), lo, hi)
        for (t, p), (lo, hi) in sorted(wm.items())
    ]
    snap = table.current_snapshot() if table is not None else None
    dlq = load_table(catalog, spec.dead_letter_table())
    dlq_snap = dlq.current_snapshot() if dlq is not None else None
    last_props = summary_dict(table.metadata.snapshot_by_id(state.tidewater_snapshot_id)) if state and state.tidewater_snapshot_id else {}

    def iso(ms: int | None) -> str | None:
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat() if ms is not None else None

    out: dict[str, Any] = {
        "pipeline": spec.name,
        "table": spec.checkpoint_table(),
        "table_exists": table is not None,
        "last_snapshot_id": snap.snapshot_id if snap else None,
        "last_snapshot_at": iso(snap.timestamp_ms) if snap else None,
        "last_batch_id": state.batch_id if state else None,
        "valid_through": iso(state.valid_through_ms) if state else None,
        "total_lag": sum(p.lag for p in parts),
        "dead_letter_table": spec.dead_letter_table(),
        "dead_letters": int(dlq_snap.summary.get("total-records", 0)) if dlq_snap and dlq_snap.summary else 0,
        "last_batch_dead_letters": int(last_props.get(DEAD_LETTERS, 0)),
        "last_batch_skipped": int(last_props.get(SKIPPED, 0)),
        "partitions": [
            {"topic": p.topic, "partition": p.partition, "committed": p.committed, "log_start": p.log_start,
             "end": p.end, "lag": p.lag}
            for p in parts
        ],
    }
    if spec.routed:
        out["tables"] = _table_status(spec, catalog, wm, iso)
    return out


def target_tables(spec: PipelineSpec, catalog: Any) -> list[str]:
    """Routed pipelines: the listed tables and every table a committed batch wrote to (dynamic ones)."""
    import json

    names = {t.identifier for t in spec.tables}
    checkpoint = load_table(catalog, spec.checkpoint_table())
    if checkpoint is not None and checkpoint.current_snapshot() is not None:
        for cell in checkpoint.scan(selected_fields=("tables",)).to_arrow().column("tables").to_pylist():
            names.update(json.loads(cell or "[]"))
    return sorted(names)


def _table_status(spec: PipelineSpec, catalog: Any, wm: dict[Any, Any], iso: Any) -> list[dict[str, Any]]:
    """Routed pipelines: each target table's last batch and lag (its own offsets against the log end)."""
    rows = []
    for ident in target_tables(spec, catalog):
        t = load_table(catalog, ident)
        st = committed_state(t, spec.table_spec(ident).branch) if t is not None else None
        lag = sum(hi - (st.offsets.get(tp, {}).get(p, lo) if st else lo) for (tp, p), (lo, hi) in wm.items())
        rows.append({"table": ident, "exists": t is not None, "last_batch_id": st.batch_id if st else None,
                     "committed_at": iso(st.committed_at_ms) if st else None, "lag": lag})
    return rows


def history(spec: PipelineSpec) -> list[dict[str, Any]]:
    """The table's snapshots, oldest first, with the Tidewater properties of each."""
    from tidewater.offsets import BATCH_ID, OFFSETS, RECORDS, VALID_THROUGH, summary_dict

    table = load_table(load_catalog(spec), spec.table.identifier)
    if table is None:
        return []
    out = []
    for s in sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0):
        props = summary_dict(s)
        out.append(
            {
                "snapshot_id": s.snapshot_id,
                "at": datetime.fromtimestamp(s.timestamp_ms / 1000, tz=timezone.utc).isoformat(timespec="seconds"),
                "operation": str(s.summary.operation.value) if s.summary else None,
                "batch_id": props.get(BATCH_ID),
                "records": props.get(RECORDS),
                "added_files": props.get("added-data-files"),
                "valid_through": props.get(VALID_THROUGH),
                "offsets": props.get(OFFSETS),
            }
        )
    return out


def run_once(spec_path: str | Path, master: str | None = None, out: Any = None) -> dict[str, Any]:
    """One batch through plan, write (spark-submit), validate and commit, with a progress display."""
    say = out or (lambda s: print(s, flush=True))
    spec = load_pipeline(spec_path)
    t0 = time.monotonic()
    say(f"[1/4] plan     {spec.name}: reading committed offsets from {spec.checkpoint_table()} and end offsets from Kafka")
    plan, plan_path = plan_batch(spec)
    if plan_path is None:
        say(f"      nothing to ingest: every partition is caught up ({time.monotonic() - t0:.1f}s)")
        return {"status": "empty", "batch_id": None, "records": 0}
    say(f"      batch {plan.batch_id}: {plan.record_span} offsets over {len(plan.ranges)} partition(s)")
    t1 = time.monotonic()

    next_tick = [10.0]

    def tick(elapsed: float) -> None:
        if elapsed >= next_tick[0]:
            say(f"      ... spark job running, {elapsed:.0f}s")
            next_tick[0] += 10.0

    say("[2/4] write    spark-submit " + str(spark_app_path().name))
    manifest = run_write_step(spec, plan_path, master=master, progress=tick)
    extra = f", {manifest.dead_letters} dead letter(s)" if manifest.dead_letters else ""
    extra += f", {manifest.skipped} skipped" if manifest.skipped else ""
    if manifest.ignored_fields:
        say(f"      fields not added (table.evolve_schema is off): {', '.join(manifest.ignored_fields)}")
    if manifest.outputs:
        files = sum(len(o["data_files"]) for o in manifest.outputs)
        say(f"      {manifest.records} records -> {files} data file(s) in {len(manifest.outputs)} table(s){extra} "
            f"({time.monotonic() - t1:.1f}s)")
    else:
        say(f"      {manifest.records} records -> {len(manifest.data_files)} data file(s){extra} ({time.monotonic() - t1:.1f}s)")
    t2 = time.monotonic()
    say("[3/4] validate great-expectations on the staged files")
    report = validate_step(spec, plan, manifest)
    say(f"      {sum(c.success for c in report.checks)}/{len(report.checks)} expectations passed ({time.monotonic() - t2:.1f}s)")
    say("[4/4] commit   one Iceberg append with offsets in the snapshot summary")
    result = commit_step(spec, plan, manifest)
    say(f"      {result.status}: snapshot {result.snapshot_id}, {result.records} records ({time.monotonic() - t0:.1f}s total)")
    return {**result.summary(), "seconds": round(time.monotonic() - t0, 3)}
