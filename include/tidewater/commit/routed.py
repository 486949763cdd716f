"""Routed pipelines: one commit per target table, then the pipeline's checkpoint, then dead letters.

Each table's commit is its own snapshot with that table's offsets and the batch id (once, by batch id);
the checkpoint table (``<namespace>.<name>_checkpoints``) gets one row and the batch's offsets last, and
the next batch is planned from it. A failure part-way leaves some tables committed: retrying the commit
step skips them (batch id), and a batch re-planned from the checkpoint drops, per table, records the
table already holds (the writer compares with each table's own offsets).
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone
from typing import Any

from tidewater.batch import BatchManifest, BatchPlan, Offsets, TableOutput, offsets_to_json
from tidewater.commit.batch import batch_properties, check_manifest, offsets_moved, refuse_moved_offsets
from tidewater.commit.dead_letters import DeadLetterSink, commit_dead_letters
from tidewater.commit.primitive import Change, commit
from tidewater.commit.quarantine import branch_name, quarantine_change
from tidewater.commit.result import CommitResult, TableCommit
from tidewater.errors import OffsetsMovedError, TerminalError, TransientError
from tidewater.table.catalog import create_table, load_table
from tidewater.table.provisional import confirm_keys
from tidewater.table.summary import (
    QUARANTINED,
    QUARANTINED_TABLES,
    ROUTED,
    committed_state,
    find_batch_snapshot,
    summary_properties,
)

log = logging.getLogger(__name__)


def checkpoint_row(plan: BatchPlan, manifest: BatchManifest, offsets: Offsets) -> Any:
    """The checkpoint table's row for a batch (its schema is this row's: see ensure_checkpoint_table)."""
    import pyarrow as pa

    tables = [o.table for o in manifest.outputs if o.data_files]
    return pa.table({
        "batch_id": [plan.batch_id], "pipeline": [plan.pipeline],
        "committed_at": pa.array([datetime.now(timezone.utc)], pa.timestamp("us", tz="UTC")),
        "records": pa.array([manifest.records], pa.int64()), "dead_letters": pa.array([manifest.dead_letters], pa.int64()),
        "skipped": pa.array([manifest.skipped], pa.int64()), "tables": [json.dumps(tables)],
        "offsets": [json.dumps(offsets_to_json(offsets), separators=(",", ":"))],
    })


def check_routed_manifest(plan: BatchPlan, manifest: BatchManifest) -> None:
    """Routed batches: every range covered; per table, files hold the rows the writer counted; records
    read = records routed to at least one table + dead letters + skipped."""
    check_manifest(plan, manifest, routed=True)
    for o in manifest.outputs:
        in_files = sum(f.record_count for f in o.data_files)
        if in_files != o.rows:
            raise TerminalError(f"data files hold {in_files} rows but the writer counted {o.rows}", table=o.table,
                                batch_id=plan.batch_id)


def _never_backwards(current: Offsets, plan: BatchPlan) -> Offsets:
    """The table's offsets advanced to the end of the batch's ranges, never moved back (a table that a
    later batch already advanced keeps its own)."""
    offsets: Offsets = {t: dict(ps) for t, ps in current.items()}
    for r in plan.ranges:
        cur = offsets.setdefault(r.topic, {}).get(r.partition)
        offsets[r.topic][r.partition] = r.end if cur is None else max(cur, r.end)
    return offsets


def _refuse_moved(table: Any, plan: BatchPlan, out: TableOutput) -> Offsets:
    """The table's offsets as this batch's writer saw them, else OffsetsMovedError; returns the offsets to stamp:
    advanced to the end of the batch's ranges, never moved back."""
    state = committed_state(table, out.branch)
    moved = [f"{topic}[{p}] written against {list(seen)}, table now at {state.offsets.get(topic, {}).get(int(p))}"
             for topic, parts in out.seen_offsets.items() for p, seen in parts.items()
             if any(s != state.offsets.get(topic, {}).get(int(p)) for s in seen)]
    if moved:
        raise OffsetsMovedError("the table's offsets moved since this batch was written (another writer committed); "
                                "refusing to commit to avoid duplicates. Re-plan the batch: " + "; ".join(moved),
                                table=out.table, batch_id=plan.batch_id)
    return _never_backwards(state.offsets, plan)


def _table_summary(plan: BatchPlan, out: TableOutput, offsets: Offsets, dag_run_id: str | None,
                   validation: dict[str, Any] | None) -> dict[str, str]:
    props = summary_properties(offsets=offsets, batch_id=plan.batch_id, pipeline=plan.pipeline, records=out.rows,
                               valid_through_ms=None, dag_run_id=dag_run_id, ignored_fields=out.ignored_fields,
                               validation=(validation or {}).get("tables", {}).get(out.table))
    props.update(batch_properties(plan))  # the batch's ranges, for the pipeline's ledger
    return props


def commit_table_output(catalog: Any, plan: BatchPlan, out: TableOutput, dag_run_id: str | None,
                        validation: dict[str, Any] | None, max_attempts: int, view: Any = None,
                        quarantine: bool = False) -> str:
    """Commit one table's files of a routed batch, once (by batch id), stamped with that table's offsets. A change
    table (``view``: the pipeline's single-table view of it applies changes) gets the batch's changes to it as one
    row delta (``commit/changes.py``), and its staged change files are removed after. ``quarantine`` (the table
    failed the gate, ``validation.on_failure: quarantine``): its files or row delta go to the batch's quarantine
    branch of the table, and the table's main gets an empty snapshot with its offsets (``commit/quarantine.py``)."""
    if view is not None and view.applies_changes:
        return _commit_table_changes(catalog, view, plan, out, dag_run_id, validation, max_attempts, quarantine)

    def prepare(table: Any) -> Change:
        props = _table_summary(plan, out, _refuse_moved(table, plan, out), dag_run_id, validation)
        confirm = tuple(confirm_keys(table, plan.batch_id))
        if quarantine:
            to_branch = quarantine_change(plan.batch_id, out.data_files, props)
            return Change({**props, QUARANTINED: branch_name(plan.batch_id)}, (), branch=out.branch, also=(to_branch,),
                          remove_properties=confirm)
        return Change(props, out.data_files, branch=out.branch, remove_properties=confirm)

    done = commit(catalog, out.table, prepare, marker=plan.batch_id, what=f"batch {plan.batch_id}", max_attempts=max_attempts)
    if done.status == "committed":
        log.info("batch %s: %d rows committed to %s%s", plan.batch_id, out.rows, out.table,
                 f" (branch {out.branch})" if out.branch else "")
    return done.status


def _commit_table_changes(catalog: Any, view: Any, plan: BatchPlan, out: TableOutput, dag_run_id: str | None,
                          validation: dict[str, Any] | None, max_attempts: int, quarantine: bool) -> str:
    from tidewater.commit.changes import change_attempt, remove_staged

    if len(out.seen_offsets) > 1:  # a key's changes are ordered within one topic only
        raise TerminalError(f"change table {out.table} got changes of {len(out.seen_offsets)} topics in one batch "
                            f"({', '.join(sorted(out.seen_offsets))}): a change table takes one topic's changes; route "
                            "each topic to its own table (routing.table_template)", table=out.table, batch_id=plan.batch_id)
    state: dict[str, Any] = {}
    done = commit(catalog, out.table, lambda table: change_attempt(
        table, view, plan, out.data_files, state, lambda t: _refuse_moved(t, plan, out),
        lambda offsets: _table_summary(plan, out, offsets, dag_run_id, validation), quarantine=quarantine),
        marker=plan.batch_id, what=f"batch {plan.batch_id}", max_attempts=max_attempts)
    if done.status == "committed":
        log.info("batch %s: %d changes applied to %s (%s)", plan.batch_id, out.rows, out.table,
                 ", ".join(f"{k} {v}" for k, v in state.get("counts", {}).items() if isinstance(v, int)))
    remove_staged(done.table, out.data_files)
    return done.status


def table_view(spec: Any, catalog: Any, ident: str) -> Any:
    """The pipeline's single-table view of one target table (``PipelineSpec.for_table``); a change table whose id
    columns come from the message keys gets them from the table's identifier fields."""
    view = spec.for_table(ident)
    if view.applies_changes and not view.table.id_columns:
        view = spec.for_table(ident, load_table(catalog, ident))
        if not view.table.id_columns:
            raise TerminalError(f"table {ident} has no id columns: id_columns is empty and the table has no identifier "
                                "fields; set its id_columns", table=ident)
    return view


def ensure_checkpoint_table(catalog: Any, plan: BatchPlan, manifest: BatchManifest) -> Any:
    schema = checkpoint_row(plan, manifest, {}).schema
    return load_table(catalog, plan.table) or create_table(catalog, plan.table, schema, {"format-version": "2"})


def quarantined_tables(validation: dict[str, Any] | None, manifest: BatchManifest) -> list[str]:
    """The target tables whose part of the batch the gate quarantined (``validation.on_failure: quarantine``): those
    with files whose own checks failed."""
    if not (validation or {}).get("quarantine"):
        return []
    verdicts = (validation or {}).get("tables", {})
    return [o.table for o in manifest.outputs if o.data_files and not verdicts.get(o.table, {}).get("success", True)]


def _commit_checkpoint(catalog: Any, plan: BatchPlan, manifest: BatchManifest, dag_run_id: str | None,
                       validation: dict[str, Any] | None, max_attempts: int,
                       extra_properties: dict[str, str] | None = None) -> Offsets:
    offsets = plan.end_offsets()

    def prepare(checkpoint: Any) -> Change:
        if offsets_moved(plan, committed_state(checkpoint).offsets):
            raise OffsetsMovedError("the pipeline's checkpoint moved while this batch committed its tables; re-plan",
                                    table=plan.table, batch_id=plan.batch_id)
        props = summary_properties(offsets=offsets, batch_id=plan.batch_id, pipeline=plan.pipeline, records=manifest.records,
                                   valid_through_ms=manifest.valid_through_ms(), dag_run_id=dag_run_id,
                                   dead_letters=manifest.dead_letters, skipped=manifest.skipped, validation=validation)
        props.update(batch_properties(plan))
        props[ROUTED] = str(manifest.routed)  # the ledger's accounting: read = routed + dead letters + skipped
        props.update(extra_properties or {})
        held = quarantined_tables(validation, manifest)
        if held:  # where the planner looks for change tables waiting on a quarantined batch
            props[QUARANTINED_TABLES] = json.dumps(held, separators=(",", ":"))
        return Change(props, rows=checkpoint_row(plan, manifest, offsets))

    try:
        commit(catalog, plan.table, prepare, marker=plan.batch_id, what=f"batch {plan.batch_id} (checkpoint)",
               max_attempts=max_attempts)
    except TransientError:
        raise TransientError("the tables are committed but the checkpoint is not yet; retry the commit step",
                             table=plan.table, batch_id=plan.batch_id) from None
    return offsets


def commit_routed(
    catalog: Any,
    plan: BatchPlan,
    manifest: BatchManifest,
    *,
    dag_run_id: str | None = None,
    max_attempts: int = 8,
    validation: dict[str, Any] | None = None,
    dead_letter_sink: DeadLetterSink | None = None,
    spec: Any = None,
    extra_properties: dict[str, str] | None = None,
) -> CommitResult:
    """Commit a routed batch: each target table once, then the checkpoint, then the dead letters. ``spec`` (the
    pipeline) says which tables are change tables; ``extra_properties``: more for the checkpoint's snapshot
    (an operator's skip records its request)."""
    check_routed_manifest(plan, manifest)
    ident = plan.table
    files = sum(len(o.data_files) for o in manifest.outputs)
    checkpoint = ensure_checkpoint_table(catalog, plan, manifest)
    if find_batch_snapshot(checkpoint, plan.batch_id) is not None:
        commit_dead_letters(catalog, plan, manifest, dead_letter_sink)
        return CommitResult("already-committed", plan.batch_id, ident, None, manifest.records, files, plan.end_offsets(),
                            manifest.dead_letters)
    refuse_moved_offsets(plan, committed_state(checkpoint).offsets, "the pipeline's checkpoint")
    timings = []
    held = set(quarantined_tables(validation, manifest))
    for out in manifest.outputs:
        if out.data_files:
            t0 = time.monotonic()
            view = table_view(spec, catalog, out.table) if spec is not None else None
            status = commit_table_output(catalog, plan, out, dag_run_id, validation, max_attempts, view,
                                         quarantine=out.table in held)
            timings.append(TableCommit(out.table, status, out.rows, round(time.monotonic() - t0, 4)))  # type: ignore[arg-type]
    t0 = time.monotonic()
    offsets = _commit_checkpoint(catalog, plan, manifest, dag_run_id, validation, max_attempts, extra_properties)
    timings.append(TableCommit(ident, "checkpoint", 1, round(time.monotonic() - t0, 4)))
    log.info("batch %s: committed %d table(s) (%s) and the checkpoint %s", plan.batch_id, len(timings) - 1,
             ", ".join(f"{t.table}: {t.status}" for t in timings[:-1]) or "none", ident)
    commit_dead_letters(catalog, plan, manifest, dead_letter_sink)
    return CommitResult("committed", plan.batch_id, ident, None, manifest.records, files, offsets, manifest.dead_letters,
                        tuple(timings))
