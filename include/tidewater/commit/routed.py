"""routed (moved from committing.py)."""


from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from tidewater.batch import BatchManifest, BatchPlan, Offsets
from tidewater.commit.batch import _offsets_moved, batch_properties, check_manifest
from tidewater.commit.dead_letters import commit_dead_letters
from tidewater.commit.primitive import failed_attempt, fast_append, without_commit_retries
from tidewater.commit.result import CommitResult
from tidewater.errors import OffsetsMovedError, TerminalError, TransientError
from tidewater.table.catalog import load_table
from tidewater.table.summary import (
    committed_state,
    find_batch_snapshot,
    summary_properties,
)

# ---- routed pipelines: one commit per target table, then the checkpoint ----------------------------

def checkpoint_row(plan: BatchPlan, manifest: BatchManifest, offsets: Offsets) -> Any:
    """The checkpoint table's row for a batch (its schema is this row's: see ensure_checkpoint_table)."""
    import json
    from datetime import datetime, timezone

    import pyarrow as pa

    from tidewater.batch import offsets_to_json

    tables = [o["table"] for o in manifest.outputs if o["data_files"]]
    return pa.table({
        "batch_id": [plan.batch_id], "pipeline": [plan.pipeline],
        "committed_at": pa.array([datetime.now(timezone.utc)], pa.timestamp("us", tz="UTC")),
        "records": pa.array([manifest.records], pa.int64()), "dead_letters": pa.array([manifest.dead_letters], pa.int64()),
        "skipped": pa.array([manifest.skipped], pa.int64()), "tables": [json.dumps(tables)],
        "offsets": [json.dumps(offsets_to_json(offsets), separators=(",", ":"))],
    })

log = logging.getLogger(__name__)


def check_routed_manifest(plan: BatchPlan, manifest: BatchManifest) -> None:
    """Routed batches: every range covered; per table, files hold the rows the writer counted; records
    read = records routed to at least one table + dead letters + skipped."""
    check_manifest(plan, manifest, routed=True)
    for o in manifest.outputs:
        in_files = sum(int(f["record_count"]) for f in o["data_files"])
        if in_files != o["rows"]:
            raise TerminalError(f"data files hold {in_files} rows but the writer counted {o['rows']}", table=o["table"],
                                batch_id=plan.batch_id)


def commit_table_output(catalog: Any, plan: BatchPlan, out: dict[str, Any], dag_run_id: str | None,
                   validation: dict[str, Any] | None, max_attempts: int) -> str:
    """Commit one table's files of a routed batch, once (by batch id), stamped with that table's offsets."""

    ident, branch = out["table"], out.get("branch")
    for attempt in range(1, max_attempts + 1):
        table = load_table(catalog, ident)
        if table is None:
            raise TerminalError("table disappeared between write and commit", table=ident, batch_id=plan.batch_id)
        if find_batch_snapshot(table, plan.batch_id) is not None:
            return "already-committed"
        state = committed_state(table, branch)
        moved = []
        for topic, parts in out["seen_offsets"].items():
            for p, seen in parts.items():
                now = state.offsets.get(topic, {}).get(int(p))
                if any(s != now for s in seen):
                    moved.append(f"{topic}[{p}] written against {seen}, table now at {now}")
        if moved:
            raise OffsetsMovedError("the table's offsets moved since this batch was written (another writer committed); "
                                    "refusing to commit to avoid duplicates. Re-plan the batch: " + "; ".join(moved),
                                    table=ident, batch_id=plan.batch_id)
        offsets: Offsets = {t: dict(ps) for t, ps in state.offsets.items()}
        for r in plan.ranges:  # never backwards
            cur = offsets.setdefault(r.topic, {}).get(r.partition)
            offsets[r.topic][r.partition] = r.end if cur is None else max(cur, r.end)
        props = summary_properties(offsets=offsets, batch_id=plan.batch_id, pipeline=plan.pipeline, records=out["rows"],
                                   valid_through_ms=None, dag_run_id=dag_run_id, ignored_fields=tuple(out["ignored_fields"]),
                                   validation=(validation or {}).get("tables", {}).get(ident))
        try:
            fast_append(without_commit_retries(table), out["data_files"], props, branch)
            log.info("batch %s: %d rows committed to %s%s", plan.batch_id, out["rows"], ident, f" (branch {branch})" if branch else "")
            return "committed"
        except Exception as e:
            failed_attempt(catalog, e, f"batch {plan.batch_id}", ident, attempt)
    raise TransientError(f"commit did not succeed after {max_attempts} attempts", table=ident, batch_id=plan.batch_id)


def ensure_checkpoint_table(catalog: Any, plan: BatchPlan, manifest: BatchManifest) -> Any:
    from tidewater.table.catalog import create_table

    schema = checkpoint_row(plan, manifest, {}).schema
    return load_table(catalog, plan.table) or create_table(catalog, plan.table, schema, {"format-version": "2"})


def commit_routed(
    catalog: Any,
    plan: BatchPlan,
    manifest: BatchManifest,
    *,
    dag_run_id: str | None = None,
    max_attempts: int = 8,
    validation: dict[str, Any] | None = None,
    dead_letter_sink: Callable[[Any, list[dict[str, Any]]], str] | None = None,
) -> CommitResult:
    """Commit a routed batch: each target table once (its own snapshot, batch id and offsets), then the
    pipeline's checkpoint (one row and the batch's offsets), then the dead letters.

    A failure part-way leaves some tables committed: retrying the commit step skips them (batch id),
    and a batch re-planned from the checkpoint drops, per table, records the table already holds.
    """

    check_routed_manifest(plan, manifest)
    ident = plan.table
    checkpoint = ensure_checkpoint_table(catalog, plan, manifest)
    if find_batch_snapshot(checkpoint, plan.batch_id) is not None:
        commit_dead_letters(catalog, plan, manifest, dead_letter_sink)
        return CommitResult("already-committed", plan.batch_id, ident, None, manifest.records,
                            sum(len(o["data_files"]) for o in manifest.outputs), plan.end_offsets(), manifest.dead_letters)
    moved = _offsets_moved(plan, committed_state(checkpoint).offsets)
    if moved:
        raise OffsetsMovedError("the pipeline's checkpoint moved since this batch was planned (another writer "
                                "committed); refusing to commit. Re-plan the batch: " + "; ".join(moved),
                                table=ident, batch_id=plan.batch_id)
    committed = {}
    timings = []
    for out in manifest.outputs:
        if out["data_files"]:
            t0 = time.monotonic()
            committed[out["table"]] = commit_table_output(catalog, plan, out, dag_run_id, validation, max_attempts)
            timings.append({"table": out["table"], "status": committed[out["table"]], "rows": out["rows"],
                            "seconds": round(time.monotonic() - t0, 4)})
    t0 = time.monotonic()
    offsets = plan.end_offsets()
    for attempt in range(1, max_attempts + 1):
        checkpoint = load_table(catalog, ident)
        if find_batch_snapshot(checkpoint, plan.batch_id) is not None:
            break
        if _offsets_moved(plan, committed_state(checkpoint).offsets):
            raise OffsetsMovedError("the pipeline's checkpoint moved while this batch committed its tables; re-plan",
                                    table=ident, batch_id=plan.batch_id)
        props = summary_properties(offsets=offsets, batch_id=plan.batch_id, pipeline=plan.pipeline, records=manifest.records,
                                   valid_through_ms=manifest.valid_through_ms(), dag_run_id=dag_run_id,
                                   dead_letters=manifest.dead_letters, skipped=manifest.skipped, validation=validation)
        props.update(batch_properties(plan))
        try:
            without_commit_retries(checkpoint).append(checkpoint_row(plan, manifest, offsets), snapshot_properties=props)
            break
        except Exception as e:
            failed_attempt(catalog, e, f"batch {plan.batch_id} (checkpoint)", ident, attempt)
    else:
        raise TransientError("the tables are committed but the checkpoint is not yet; retry the commit step",
                             table=ident, batch_id=plan.batch_id)
    timings.append({"table": ident, "status": "checkpoint", "rows": 1, "seconds": round(time.monotonic() - t0, 4)})
    log.info("batch %s: committed %d table(s) (%s) and the checkpoint %s", plan.batch_id, len(committed),
             ", ".join(f"{t}: {s}" for t, s in committed.items()) or "none", ident)
    commit_dead_letters(catalog, plan, manifest, dead_letter_sink)
    return CommitResult("committed", plan.batch_id, ident, None, manifest.records,
                        sum(len(o["data_files"]) for o in manifest.outputs), offsets, manifest.dead_letters, tuple(timings))
