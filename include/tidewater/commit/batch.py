"""Where a batch becomes visible: the single Iceberg commit per table per batch.

Semantics (all through ``commit.primitive.commit``):
- Idempotent: if a snapshot already carries this batch id, the commit is a no-op.
- Exactly-once: the append is made only if the table's committed offsets for every planned partition
  are still those the plan started from; otherwise another writer moved them and committing would
  duplicate or skip records, so the commit is refused (OffsetsMovedError) and the batch must be re-planned.
- The catalog's compare-and-swap on the table's current snapshot makes the check and the append
  atomic: a commit that lost a race fails with CommitFailedException and is retried after a refresh
  (which then finds the batch committed, or the offsets moved).
- Unknown outcome (the catalog call failed without saying whether it applied): refresh, look for the
  batch id, and retry only if it is not there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from tidewater.batch import BatchManifest, BatchPlan, Offsets, merge_offsets
from tidewater.commit.dead_letters import DeadLetterSink, commit_dead_letters
from tidewater.commit.primitive import Change, commit
from tidewater.commit.quarantine import branch_name, quarantine_change
from tidewater.commit.result import CommitResult
from tidewater.errors import OffsetsMovedError, TerminalError
from tidewater.table.provisional import confirm_keys
from tidewater.table.summary import DATA_INTERVAL, QUARANTINED, RANGES, committed_state, summary_properties

log = logging.getLogger(__name__)


def check_manifest(plan: BatchPlan, manifest: BatchManifest, routed: bool = False) -> None:
    """The manifest must be this plan's and cover every planned range completely."""
    if manifest.batch_id != plan.batch_id:
        raise TerminalError(f"manifest is for batch {manifest.batch_id}, not {plan.batch_id}", batch_id=plan.batch_id)
    got = manifest.next_offsets()
    for r in plan.ranges:
        reached = got.get(r.topic, {}).get(r.partition)
        if reached != r.end:
            raise TerminalError(
                f"manifest does not cover the planned range [{r.start}, {r.end}) (reached {reached})",
                batch_id=plan.batch_id,
                topic=r.topic,
                partition=r.partition,
            )
    if routed:
        if manifest.routed is None or manifest.records != manifest.routed + manifest.dead_letters + manifest.skipped \
                or manifest.dead_letters_in_files != manifest.dead_letters:
            raise TerminalError(
                f"accounting does not add up: {manifest.records} records read, {manifest.routed} routed to tables, "
                f"{manifest.dead_letters} dead letters ({manifest.dead_letters_in_files} in files), {manifest.skipped} skipped",
                batch_id=plan.batch_id,
            )
        return
    if manifest.rows_in_files != manifest.rows_expected or manifest.dead_letters_in_files != manifest.dead_letters:
        raise TerminalError(
            f"accounting does not add up: {manifest.records} records read, but data files hold {manifest.rows_in_files} "
            f"rows and dead-letter files {manifest.dead_letters_in_files} records ({manifest.dead_letters} dead letters, "
            f"{manifest.skipped} skipped, {manifest.present} already present)",
            batch_id=plan.batch_id,
        )


def batch_properties(plan: BatchPlan) -> dict[str, str]:
    """The batch's ranges and the Airflow run's data interval, for backfills to find later."""
    props = {RANGES: json.dumps([[r.topic, r.partition, r.start, r.end] for r in plan.ranges], separators=(",", ":"))}
    if len(props[RANGES]) > 50_000:  # thousands of partitions: keep the summary small
        del props[RANGES]
    if plan.data_interval:
        props[DATA_INTERVAL] = "/".join(plan.data_interval)
    return props


def offsets_moved(plan: BatchPlan, current: Offsets) -> list[str]:
    """The planned partitions whose committed offsets are no longer those the plan started from."""
    moved = []
    for r in plan.ranges:
        was = plan.base_offsets.get(r.topic, {}).get(r.partition)
        now = current.get(r.topic, {}).get(r.partition)
        if was != now:
            moved.append(f"{r.topic}[{r.partition}] planned from {was if was is not None else r.start}, table now at {now}")
    return moved


def refuse_moved_offsets(plan: BatchPlan, current: Offsets, what: str = "the table's offsets") -> None:
    """Raise OffsetsMovedError when ``current`` is not what the plan started from: another writer committed,
    and committing would duplicate or skip records."""
    moved = offsets_moved(plan, current)
    if moved:
        raise OffsetsMovedError(f"{what} moved since this batch was planned (another writer committed); refusing to "
                                "commit to avoid duplicates. Re-plan the batch: " + "; ".join(moved),
                                table=plan.table, batch_id=plan.batch_id)


def batch_summary(plan: BatchPlan, manifest: BatchManifest, offsets: Offsets, dag_run_id: str | None,
                   validation: dict[str, Any] | None, extra: dict[str, str] | None) -> dict[str, str]:
    """The snapshot summary properties of a batch's commit."""
    props = summary_properties(
        offsets=offsets, batch_id=plan.batch_id, pipeline=plan.pipeline, records=manifest.records,
        valid_through_ms=manifest.valid_through_ms(), dag_run_id=dag_run_id, dead_letters=manifest.dead_letters,
        skipped=manifest.skipped, ignored_fields=manifest.ignored_fields, validation=validation,
    )
    props.update(batch_properties(plan))
    props.update(extra or {})
    return props


def create_empty_table(catalog: Any, ident: str) -> Any:
    """Every record of the first batch was dead-lettered or skipped: the offsets still have to move, so
    the table is created without columns (they come with the first good record)."""
    import pyarrow as pa

    from tidewater.table.catalog import create_table

    return create_table(catalog, ident, pa.schema([]), {"format-version": "2"})


def missing_table(catalog: Any, plan: BatchPlan, manifest: BatchManifest) -> Callable[[], Any]:
    """What a batch's commit does when its table does not exist: refuse if files were written for it (it was
    dropped in between), create it empty if records were read (the offsets must move), else nothing."""
    def on_missing() -> Any:
        if manifest.data_files:
            raise TerminalError("table disappeared between write and commit", table=plan.table, batch_id=plan.batch_id)
        return create_empty_table(catalog, plan.table) if manifest.records else None
    return on_missing


def commit_batch(
    catalog: Any,
    plan: BatchPlan,
    manifest: BatchManifest,
    *,
    dag_run_id: str | None = None,
    max_attempts: int = 8,
    validation: dict[str, Any] | None = None,
    dead_letter_sink: DeadLetterSink | None = None,
    branch: str | None = None,
    quarantine: bool = False,
    extra_properties: dict[str, str] | None = None,
) -> CommitResult:
    """Append the manifest's files in one snapshot (on ``branch``, default main) stamped with offsets and
    the batch id, then the batch's dead letters. ``quarantine``: the files go to the batch's quarantine
    branch instead and main gets an empty snapshot with the offsets (see commit/quarantine.py).
    ``extra_properties``: more snapshot summary properties (an operator's skip records its reason)."""

    check_manifest(plan, manifest)
    ident = plan.table
    stamped: dict[str, Offsets] = {}

    def prepare(table: Any) -> Change:
        state = committed_state(table, branch)
        refuse_moved_offsets(plan, state.offsets)
        stamped["offsets"] = merge_offsets(state.offsets, plan.ranges)
        props = batch_summary(plan, manifest, stamped["offsets"], dag_run_id, validation, extra_properties)
        confirm = tuple(confirm_keys(table, plan.batch_id))  # the batch's schema changes become permanent with it
        if quarantine:
            to_branch = quarantine_change(plan.batch_id, manifest.data_files, props)
            return Change({**props, QUARANTINED: branch_name(plan.batch_id)}, (), branch=branch, also=(to_branch,),
                          remove_properties=confirm)
        return Change(props, manifest.data_files, branch=branch, remove_properties=confirm)

    done = commit(catalog, ident, prepare, marker=plan.batch_id, what=f"batch {plan.batch_id}", max_attempts=max_attempts,
                  on_missing=missing_table(catalog, plan, manifest))
    if done.status == "committed":
        log.info("batch %s committed to %s: snapshot %s, %d records, %d files%s", plan.batch_id, ident, done.snapshot_id,
                 manifest.records, len(manifest.data_files),
                 f", {manifest.dead_letters} dead letters" if manifest.dead_letters else "")
    if done.status == "nothing-to-commit":
        return CommitResult("nothing-to-commit", plan.batch_id, ident, None, 0, 0, {})
    commit_dead_letters(catalog, plan, manifest, dead_letter_sink)
    return CommitResult(done.status, plan.batch_id, ident, done.snapshot_id, manifest.records, len(manifest.data_files),
                        stamped.get("offsets", plan.end_offsets()), manifest.dead_letters)
