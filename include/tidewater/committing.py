"""Where the one commit happens: a single Iceberg fast append per table per batch.

Semantics:
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

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidewater.batch import BatchManifest, BatchPlan, Offsets
from tidewater.catalog import load_table
from tidewater.errors import OffsetsMovedError, TerminalError, TransientError
from tidewater.offsets import (
    BATCH_ID, BRANCH_BASE, DATA_INTERVAL, DEAD_LETTER_TOPIC, PIPELINE, RANGES, RECORDS, committed_state, find_batch_snapshot,
    summary_properties,
)
from tidewater.planning import merge_offsets
from tidewater.writing import deserialize_data_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitResult:
    status: str  # "committed" | "already-committed" | "nothing-to-commit"
    batch_id: str
    table: str
    snapshot_id: int | None
    records: int
    data_files: int
    offsets: Offsets
    dead_letters: int = 0
    tables: tuple[dict[str, Any], ...] = ()  # routed batches: per table {table, status, rows, seconds}

    def summary(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "batch_id": self.batch_id,
            "table": self.table,
            "snapshot_id": self.snapshot_id,
            "records": self.records,
            "data_files": self.data_files,
            "dead_letters": self.dead_letters,
        }


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


def _without_commit_retries(table: Any) -> Any:
    """A view of ``table`` whose commits are not retried by pyiceberg itself.

    pyiceberg rebases a conflicting append onto the new snapshot and retries it (table property
    ``commit.retry.num-retries``). For us a conflict means the offsets may have moved: the retry must
    come back here, re-read the offsets and look for the batch id. The property is changed in this
    local view only; nothing is written to the table's properties.
    """
    from pyiceberg.table import Table, TableProperties

    props = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    meta = table.metadata.model_copy(update={"properties": props})
    return Table(table.name(), metadata=meta, metadata_location=table.metadata_location, io=table.io, catalog=table.catalog)


def _fast_append(table: Any, data_files: Any, props: dict[str, str], branch: str | None = None) -> None:
    """One fast-append snapshot of the staged (serialized) data files, with these summary properties."""
    files = [deserialize_data_file(d, table.format_version) for d in data_files]
    if branch and branch != "main" and table.metadata.current_snapshot_id is None and not table.metadata.snapshots:
        # A table without any snapshot accepts writes to main only: an empty snapshot on main comes first
        # (no files, no offsets), then the branch starts with this batch.
        with table.transaction() as tx:
            with tx.update_snapshot(snapshot_properties={BRANCH_BASE: branch}).fast_append():
                pass
    with table.transaction() as tx:
        _fast_append_tx(tx, table, data_files, props, branch, files)


def _fast_append_tx(tx: Any, table: Any, data_files: Any, props: dict[str, str], branch: str | None = None,
                    files: list[Any] | None = None) -> None:
    """The fast append of staged data files inside an open transaction."""
    if files is None:
        files = [deserialize_data_file(d, table.format_version) for d in data_files]
    with tx.update_snapshot(snapshot_properties=props, branch=branch or "main").fast_append() as append:
        for f in files:
            append.append_data_file(f)


def batch_properties(plan: BatchPlan) -> dict[str, str]:
    """The batch's ranges and the Airflow run's data interval, for backfills to find later."""
    import json

    props = {RANGES: json.dumps([[r.topic, r.partition, r.start, r.end] for r in plan.ranges], separators=(",", ":"))}
    if len(props[RANGES]) > 50_000:  # thousands of partitions: keep the summary small
        del props[RANGES]
    if plan.data_interval:
        props[DATA_INTERVAL] = "/".join(plan.data_interval)
    return props


def failed_attempt(catalog: Any, e: BaseException, what: str, ident: str, attempt: int) -> None:
    """After a commit attempt raised: log it, and back off before the next attempt refreshes and checks.

    A conflict (CommitFailedException) means another writer committed first. Anything else leaves the
    outcome unknown: the next attempt looks for the batch id first, on fresh connections (a SQLite
    COMMIT refused with "database is locked" leaves its transaction open, and that connection would see
    its own uncommitted pointer update).
    """
    from pyiceberg.exceptions import CommitFailedException

    if isinstance(e, CommitFailedException):
        log.warning("%s: commit conflict on %s (attempt %d): %s; refreshing", what, ident, attempt, e)
    else:
        log.warning("%s: commit outcome unknown on %s (attempt %d): %r; checking", what, ident, attempt, e)
        _drop_connections(catalog)
    time.sleep(min(0.1 * 2**attempt, 5))


def _drop_connections(catalog: Any) -> None:
    """Close a SQL catalog's pooled connections (rolling back whatever they left open)."""
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()


def _offsets_moved(plan: BatchPlan, current: Offsets) -> list[str]:
    moved = []
    for r in plan.ranges:
        was = plan.base_offsets.get(r.topic, {}).get(r.partition)
        now = current.get(r.topic, {}).get(r.partition)
        if was != now:
            moved.append(f"{r.topic}[{r.partition}] planned from {was if was is not None else r.start}, table now at {now}")
    return moved


def commit_batch(
    catalog: Any,
    plan: BatchPlan,
    manifest: BatchManifest,
    *,
    dag_run_id: str | None = None,
    max_attempts: int = 8,
    validation: dict[str, Any] | None = None,
    dead_letter_sink: Callable[[Any, list[dict[str, Any]]], str] | None = None,
    branch: str | None = None,
    quarantine: bool = False,
) -> CommitResult:
    """Append the manifest's files in one snapshot (on ``branch``, default main) stamped with offsets and
    the batch id. ``quarantine``: the files go to the batch's quarantine branch instead and main gets an
    empty snapshot with the offsets (see quarantine.py)."""

    check_manifest(plan, manifest)
    ident = plan.table
    for attempt in range(1, max_attempts + 1):
        table = load_table(catalog, ident)
        if table is None:
            if manifest.data_files:
                raise TerminalError("table disappeared between write and commit", table=ident, batch_id=plan.batch_id)
            if not manifest.records:
                return CommitResult("nothing-to-commit", plan.batch_id, ident, None, 0, 0, {})
            # Every record of the first batch was dead-lettered or skipped: the offsets still have to move,
            # so the table is created without columns (they come with the first good record).
            import pyarrow as pa

            from tidewater.catalog import create_table

            table = create_table(catalog, ident, pa.schema([]), {"format-version": "2"})
        existing = find_batch_snapshot(table, plan.batch_id)
        if existing is not None:
            log.info("batch %s already committed to %s as snapshot %s: nothing to do", plan.batch_id, ident, existing.snapshot_id)
            commit_dead_letters(catalog, plan, manifest, dead_letter_sink)
            return CommitResult(
                "already-committed", plan.batch_id, ident, existing.snapshot_id, manifest.records, len(manifest.data_files),
                plan.end_offsets(), manifest.dead_letters,
            )
        state = committed_state(table, branch)
        moved = _offsets_moved(plan, state.offsets)
        if moved:
            raise OffsetsMovedError(
                "the table's offsets moved since this batch was planned (another writer committed); refusing to "
                "commit to avoid duplicates. Re-plan the batch: " + "; ".join(moved),
                table=ident,
                batch_id=plan.batch_id,
            )
        offsets = merge_offsets(state.offsets, plan.ranges)
        props = summary_properties(
            offsets=offsets,
            batch_id=plan.batch_id,
            pipeline=plan.pipeline,
            records=manifest.records,
            valid_through_ms=manifest.valid_through_ms(),
            dag_run_id=dag_run_id,
            dead_letters=manifest.dead_letters,
            skipped=manifest.skipped,
            ignored_fields=manifest.ignored_fields,
            validation=validation,
        )
        props.update(batch_properties(plan))
        files = manifest.data_files
        if quarantine:
            from tidewater.offsets import QUARANTINED
            from tidewater.quarantine import branch_name, commit_to_branch

            commit_to_branch(table, plan.batch_id, files, props)
            table = load_table(catalog, ident)
            props[QUARANTINED] = branch_name(plan.batch_id)
            files = ()
        table = _without_commit_retries(table)
        try:
            _fast_append(table, files, props, branch)
        except Exception as e:  # a conflict or an unknown outcome: the next attempt refreshes and checks
            failed_attempt(catalog, e, f"batch {plan.batch_id}", ident, attempt)
            continue
        snap = table.snapshot_by_name(branch) if branch else table.current_snapshot()
        log.info(
            "batch %s committed to %s: snapshot %s, %d records, %d files%s",
            plan.batch_id, ident, snap.snapshot_id if snap else None, manifest.records, len(manifest.data_files),
            f", {manifest.dead_letters} dead letters" if manifest.dead_letters else "",
        )
        commit_dead_letters(catalog, plan, manifest, dead_letter_sink)
        return CommitResult(
            "committed", plan.batch_id, ident, snap.snapshot_id if snap else None, manifest.records, len(manifest.data_files),
            offsets,
            manifest.dead_letters,
        )
    raise TransientError(f"commit did not succeed after {max_attempts} attempts", table=ident, batch_id=plan.batch_id)


def commit_dead_letters(catalog: Any, plan: BatchPlan, manifest: BatchManifest,
                        sink: Callable[[Any, list[dict[str, Any]]], str] | None = None, max_attempts: int = 8) -> None:
    """Append the batch's dead-letter files, once: after the batch's own commit, idempotent by batch id.

    Called on every commit attempt of the batch (also when the batch was already committed), so a
    failure between the two commits is repaired by retrying the commit step. ``sink`` (the Kafka
    dead-letter topic) gets the files before the dead-letter commit, which records that it did: a retry
    after that commit never sends them again; a failure between the two sends them again (at least once).
    """

    if not manifest.dead_letter_files:
        return
    ident = manifest.dead_letter_table
    props_sent: dict[str, str] = {}  # sent once per call, whatever the commit attempts
    for attempt in range(1, max_attempts + 1):
        table = load_table(catalog, ident)
        if table is None:
            raise TerminalError("dead-letter table disappeared between write and commit", table=ident, batch_id=plan.batch_id)
        if find_batch_snapshot(table, plan.batch_id) is not None:
            return
        props = {BATCH_ID: plan.batch_id, PIPELINE: plan.pipeline, RECORDS: str(manifest.dead_letters)}
        if sink is not None and DEAD_LETTER_TOPIC not in props_sent:
            props_sent[DEAD_LETTER_TOPIC] = sink(table, list(manifest.dead_letter_files))
        props.update(props_sent)
        try:
            _fast_append(_without_commit_retries(table), manifest.dead_letter_files, props)
            log.info("batch %s: %d dead letters committed to %s", plan.batch_id, manifest.dead_letters, ident)
            return
        except Exception as e:
            failed_attempt(catalog, e, f"batch {plan.batch_id} (dead letters)", ident, attempt)
    raise TransientError(
        "the batch is committed but its dead letters are not yet; retry the commit step", table=ident, batch_id=plan.batch_id
    )


# ---- routed pipelines: one commit per target table, then the checkpoint ----------------------------

def _checkpoint_row(plan: BatchPlan, manifest: BatchManifest, offsets: Offsets) -> Any:
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


def check_routed_manifest(plan: BatchPlan, manifest: BatchManifest) -> None:
    """Routed batches: every range covered; per table, files hold the rows the writer counted; records
    read = records routed to at least one table + dead letters + skipped."""
    check_manifest(plan, manifest, routed=True)
    for o in manifest.outputs:
        in_files = sum(int(f["record_count"]) for f in o["data_files"])
        if in_files != o["rows"]:
            raise TerminalError(f"data files hold {in_files} rows but the writer counted {o['rows']}", table=o["table"],
                                batch_id=plan.batch_id)


def _commit_output(catalog: Any, plan: BatchPlan, out: dict[str, Any], dag_run_id: str | None,
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
            _fast_append(_without_commit_retries(table), out["data_files"], props, branch)
            log.info("batch %s: %d rows committed to %s%s", plan.batch_id, out["rows"], ident, f" (branch {branch})" if branch else "")
            return "committed"
        except Exception as e:
            failed_attempt(catalog, e, f"batch {plan.batch_id}", ident, attempt)
    raise TransientError(f"commit did not succeed after {max_attempts} attempts", table=ident, batch_id=plan.batch_id)


def ensure_checkpoint_table(catalog: Any, plan: BatchPlan, manifest: BatchManifest) -> Any:
    from tidewater.catalog import create_table

    schema = _checkpoint_row(plan, manifest, {}).schema
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
            committed[out["table"]] = _commit_output(catalog, plan, out, dag_run_id, validation, max_attempts)
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
            _without_commit_retries(checkpoint).append(_checkpoint_row(plan, manifest, offsets), snapshot_properties=props)
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
