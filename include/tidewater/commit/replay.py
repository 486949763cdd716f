"""replay (moved from replay.py)."""


from __future__ import annotations

import json
import logging
from typing import Any

from tidewater.batch import BatchPlan
from tidewater.config.spec import PipelineSpec
from tidewater.errors import TerminalError
from tidewater.plan.replay import rows_filter

log = logging.getLogger(__name__)


def commit_replay(catalog: Any, spec: PipelineSpec, plan: BatchPlan, manifest: Any, dag_run_id: str | None = None,
                  validation: dict[str, Any] | None = None, max_attempts: int = 8) -> Any:
    """One atomic commit: (replace) delete the rows from the plan's ranges, append the re-read rows.

    The snapshots carry the table's committed offsets unchanged and the replay's batch id, so a
    retry after success is a no-op and the offsets never move backwards (or forwards).
    """
    from tidewater.commit.batch import check_manifest
    from tidewater.commit.primitive import failed_attempt
    from tidewater.commit.primitive import fast_append_tx as _fast_append_tx
    from tidewater.commit.primitive import without_commit_retries as _without_commit_retries
    from tidewater.commit.result import CommitResult
    from tidewater.errors import TransientError
    from tidewater.table.catalog import load_table
    from tidewater.table.summary import BATCH_ID, REPLAY, committed_state, find_batch_snapshot, summary_properties

    check_manifest(plan, manifest)
    ident = plan.table
    branch = spec.table.branch
    for attempt in range(1, max_attempts + 1):
        table = load_table(catalog, ident)
        if table is None:
            raise TerminalError("table disappeared", table=ident, batch_id=plan.batch_id)
        existing = find_batch_snapshot(table, plan.batch_id)
        if existing is not None:
            return CommitResult("already-committed", plan.batch_id, ident, existing.snapshot_id, manifest.records,
                                len(manifest.data_files), committed_state(table, branch).offsets)
        offsets = committed_state(table, branch).offsets
        for r in plan.ranges:
            if r.end > offsets.get(r.topic, {}).get(r.partition, -1):
                raise TerminalError(f"replay range [{r.start}, {r.end}) is beyond the committed offset", table=ident,
                                    topic=r.topic, partition=r.partition, batch_id=plan.batch_id)
        props = summary_properties(offsets=offsets, batch_id=plan.batch_id, pipeline=plan.pipeline, records=manifest.records,
                                   valid_through_ms=None, dag_run_id=dag_run_id, dead_letters=0, skipped=manifest.skipped,
                                   validation=validation)
        props[REPLAY] = json.dumps({"mode": plan.mode, "ranges": [[r.topic, r.partition, r.start, r.end] for r in plan.ranges],
                                    **({"data_interval": list(plan.data_interval)} if plan.data_interval else {})},
                                   separators=(",", ":"))
        view = _without_commit_retries(table)
        try:
            with view.transaction() as tx:
                if plan.mode == "replace":
                    marker = {k: v for k, v in props.items() if k != BATCH_ID} if manifest.data_files else props
                    tx.delete(delete_filter=rows_filter(spec, plan.ranges), snapshot_properties=marker,
                              branch=branch or "main")
                if manifest.data_files or plan.mode != "replace":
                    _fast_append_tx(tx, view, manifest.data_files, props, branch)
            log.info("replay %s (%s) committed to %s: %d rows from %d range(s)", plan.batch_id, plan.mode, ident,
                     manifest.rows_in_files, len(plan.ranges))
            snap = load_table(catalog, ident)
            found = find_batch_snapshot(snap, plan.batch_id)
            return CommitResult("committed", plan.batch_id, ident, found.snapshot_id if found else None, manifest.records,
                                len(manifest.data_files), offsets)
        except Exception as e:
            failed_attempt(catalog, e, f"replay {plan.batch_id}", ident, attempt)
    raise TransientError(f"replay commit did not succeed after {max_attempts} attempts", table=ident, batch_id=plan.batch_id)
