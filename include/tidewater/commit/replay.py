"""The commit of a replay or backfill (see ``plan/replay.py``): one atomic transaction.

``replace``: the rows that came from the plan's ranges are deleted (copy-on-write) and the re-read rows
appended, both snapshots in one transaction. ``append-missing``: only the append. The snapshots carry
the table's committed offsets unchanged and the replay's batch id, so a retry after success is a no-op
and the offsets never move (backwards or forwards). A routed pipeline's replay commits each target table
once the same way (``commit/routed_replay.py``); change tables reapply (``commit/changes.py``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from tidewater.batch import BatchManifest, BatchPlan, Offsets
from tidewater.commit.batch import check_manifest
from tidewater.commit.primitive import Change, commit
from tidewater.commit.result import CommitResult
from tidewater.config.spec import PipelineSpec
from tidewater.errors import TerminalError
from tidewater.plan.replay import rows_filter
from tidewater.table.provisional import confirm_keys
from tidewater.table.summary import BATCH_ID, REPLAY, committed_state, find_batch_snapshot, summary_properties

log = logging.getLogger(__name__)


def refuse_uncommitted_ranges(plan: BatchPlan, offsets: Offsets) -> None:
    """A replay re-reads committed records only: a range past the committed offset is the scheduled batches'."""
    for r in plan.ranges:
        if r.end > offsets.get(r.topic, {}).get(r.partition, -1):
            raise TerminalError(f"replay range [{r.start}, {r.end}) is beyond the committed offset", table=plan.table,
                                topic=r.topic, partition=r.partition, batch_id=plan.batch_id)


def replay_summary(plan: BatchPlan, offsets: Offsets, records: int, skipped: int, dag_run_id: str | None,
                   validation: dict[str, Any] | None) -> dict[str, str]:
    """A replay snapshot's properties: the table's committed offsets unchanged, the batch id, the ranges."""
    props = summary_properties(offsets=offsets, batch_id=plan.batch_id, pipeline=plan.pipeline, records=records,
                               valid_through_ms=None, dag_run_id=dag_run_id, dead_letters=0, skipped=skipped,
                               validation=validation)
    props[REPLAY] = json.dumps({"mode": plan.mode, "ranges": [[r.topic, r.partition, r.start, r.end] for r in plan.ranges],
                                **({"data_interval": list(plan.data_interval)} if plan.data_interval else {}),
                                **({"tables": list(plan.tables)} if plan.tables else {})},
                               separators=(",", ":"))
    return props


def replay_change(table: Any, spec: PipelineSpec, plan: BatchPlan, files: Any, props: dict[str, str], mode: str) -> Change:
    """``replace``: delete the range's rows and append ``files`` (one transaction); ``append-missing``: append."""
    append = bool(files) or mode != "replace"
    confirm = tuple(confirm_keys(table, plan.batch_id))
    if mode != "replace":
        return Change(props, files, branch=spec.table.branch, remove_properties=confirm)
    # With nothing to append the delete's snapshot carries the batch id (the idempotency marker).
    marker = {k: v for k, v in props.items() if k != BATCH_ID} if append else props
    return Change(props, files, branch=spec.table.branch, delete_filter=rows_filter(spec, plan.ranges),
                  delete_properties=marker, append=append, remove_properties=confirm)


def commit_replay(catalog: Any, spec: PipelineSpec, plan: BatchPlan, manifest: BatchManifest, dag_run_id: str | None = None,
                  validation: dict[str, Any] | None = None, max_attempts: int = 8) -> CommitResult:
    """Commit a replay once; refuses a range beyond the table's committed offsets."""
    check_manifest(plan, manifest)
    ident, branch = plan.table, spec.table.branch
    seen: dict[str, Any] = {}

    def prepare(table: Any) -> Change:
        offsets = committed_state(table, branch).offsets
        seen["offsets"] = offsets
        refuse_uncommitted_ranges(plan, offsets)
        props = replay_summary(plan, offsets, manifest.records, manifest.skipped, dag_run_id, validation)
        return replay_change(table, spec, plan, manifest.data_files, props, plan.mode)

    done = commit(catalog, ident, prepare, marker=plan.batch_id, what=f"replay {plan.batch_id}", max_attempts=max_attempts)
    offsets = seen.get("offsets")
    if offsets is None or done.status != "committed":
        offsets = committed_state(done.table, branch).offsets
    else:
        log.info("replay %s (%s) committed to %s: %d rows from %d range(s)", plan.batch_id, plan.mode, ident,
                 manifest.rows_in_files, len(plan.ranges))
    snap_id = done.snapshot_id
    if done.status == "committed":
        found = find_batch_snapshot(done.table, plan.batch_id)
        snap_id = found.snapshot_id if found else None
    return CommitResult(done.status, plan.batch_id, ident, snap_id, manifest.records, len(manifest.data_files), offsets)
