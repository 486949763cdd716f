"""The replay or backfill of a routed pipeline: one commit per target table the re-read records route to.

Each table's commit is idempotent by the replay's batch id (a retried commit step skips the tables done) and
keeps the table's own committed offsets; change tables reapply (``commit/changes.py: reapply_attempt``),
append tables replace or add missing rows (``commit/replay.py``). The checkpoint table is not touched.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tidewater.batch import BatchManifest, BatchPlan, TableOutput
from tidewater.commit.changes import reapply_attempt, remove_staged
from tidewater.commit.primitive import Change, commit
from tidewater.commit.replay import refuse_uncommitted_ranges, replay_change, replay_summary
from tidewater.commit.result import CommitResult, TableCommit
from tidewater.commit.routed import check_routed_manifest, table_view
from tidewater.config.spec import PipelineSpec
from tidewater.plan.replay import replay_mode
from tidewater.table.catalog import load_table
from tidewater.table.summary import committed_state

log = logging.getLogger(__name__)


def commit_routed_replay(catalog: Any, spec: PipelineSpec, plan: BatchPlan, manifest: BatchManifest,
                         dag_run_id: str | None = None, validation: dict[str, Any] | None = None,
                         max_attempts: int = 8) -> CommitResult:
    """A replay or backfill of a routed pipeline: each target table the re-read records route to gets one commit
    (once, by batch id; a retry skips the tables done): a change table reapplies its changes, an append table
    gets the request's mode (``replay_mode``). Each table keeps its committed offsets; the checkpoint is not
    touched. Ranges past the checkpoint's committed offsets are refused (the scheduled batches' records)."""
    check_routed_manifest(plan, manifest)
    checkpoint = load_table(catalog, plan.table)
    offsets = committed_state(checkpoint).offsets if checkpoint is not None else {}
    refuse_uncommitted_ranges(plan, offsets)
    timings = []
    for out in manifest.outputs:
        if out.data_files:
            t0 = time.monotonic()
            status = _replay_table(catalog, table_view(spec, catalog, out.table), plan, out, dag_run_id,
                                   (validation or {}).get("tables", {}).get(out.table), max_attempts)
            timings.append(TableCommit(out.table, status, out.rows, round(time.monotonic() - t0, 4)))  # type: ignore[arg-type]
    log.info("replay %s (%s): %s", plan.batch_id, plan.mode,
             ", ".join(f"{t.table}: {t.status}" for t in timings) or "no rows routed to any table")
    status = "committed" if any(t.status == "committed" for t in timings) or not timings else "already-committed"
    return CommitResult(status, plan.batch_id, plan.table, None, manifest.records,  # type: ignore[arg-type]
                        sum(len(o.data_files) for o in manifest.outputs), offsets, 0, tuple(timings))


def _replay_table(catalog: Any, view: PipelineSpec, plan: BatchPlan, out: TableOutput, dag_run_id: str | None,
                  validation: dict[str, Any] | None, max_attempts: int) -> str:
    """One target table's commit of a routed replay (see commit_routed_replay)."""
    mode = replay_mode(plan.mode, view)
    if mode == "reapply":
        state: dict[str, Any] = {}
        done = commit(catalog, out.table, lambda table: reapply_attempt(
            table, view, plan, out.data_files, state, lambda offsets: replay_summary(
                plan, offsets, out.rows, 0, dag_run_id, validation), check_ranges=False),
            marker=plan.batch_id, what=f"replay {plan.batch_id}", max_attempts=max_attempts)
        remove_staged(done.table, out.data_files)
        return done.status

    def prepare(table: Any) -> Change:
        props = replay_summary(plan, committed_state(table, view.table.branch).offsets, out.rows, 0, dag_run_id, validation)
        return replay_change(table, view, plan, out.data_files, props, mode)

    done = commit(catalog, out.table, prepare, marker=plan.batch_id, what=f"replay {plan.batch_id}", max_attempts=max_attempts)
    if done.status == "committed":
        log.info("replay %s (%s) committed to %s: %d rows", plan.batch_id, mode, out.table, out.rows)
    return done.status
