"""Where a batch becomes visible: the one commit of a batch, over the pipeline's target set.

Shaped after the Iceberg Kafka Connect sink's ``Coordinator``: one loop over the batch's target tables with the
same steps for every table, then the source offsets committed once, in the offsets holder
(``config/targets.py``). One table is N = 1, and a plain pipeline's table is its own holder (fused): its data
and its offsets land in ONE snapshot. Every commit goes through ``commit.primitive.commit``.

- Per target the change is chosen from ``KINDS``, keyed on what the batch carries for the table (appended rows,
  or changes by key) and the batch's mode (ingest, skip, replace, append-missing, reapply, retry), as the Coordinator
  picks an append or a row delta from the files. A target the quality gate quarantined
  (``validation.on_failure: quarantine``) gets its change on branch ``quarantine-<batch id>``, and main an empty
  snapshot with the batch id and the advanced offsets (``commit/quarantine.py``).
- Exactly-once: every change carries the committed offsets its batch was planned and written against
  (``OffsetsExpected``); the primitive checks them after every refresh and refuses to commit when another
  writer moved them (the batch must be re-planned). The catalog's compare-and-swap makes the check and the
  commit atomic; a conflict is retried after a refresh, which then finds the batch committed or the offsets moved.
- Idempotent: a table whose snapshots carry the batch id has it already, so a retried commit step skips the
  targets done. A separate holder is committed last: until it is, the batch is not committed, and a batch
  re-planned from the holder drops, per table, the records the table already holds (the writer compares with
  each table's own offsets).
- Replays and backfills keep every table's offsets and leave a separate holder alone; their ranges must be
  committed ones (checked against the holder).
- The targets of a separate holder commit on a bounded pool: as many at once as the catalog allows
  (``table.catalog.commit_slots``; SQLite one at a time).
- The batch's dead letters are committed after the holder, once (``commit/dead_letters.py``).

The holder's part (get ready before the targets, finish after them) is ``commit/holders.py``: the ``Holder``
Protocol, answered by ``OwnSnapshot`` for a plain pipeline and ``Checkpoint`` for a routed one. The job and its
targets as data (``BatchCommit``, ``Target``) are ``commit/job.py``, which both read.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tidewater.batch import (
    BatchManifest,
    BatchPlan,
    Mode,
    TableOutput,
    fused_output,
)
from tidewater.commit.attempt import remove_staged
from tidewater.commit.changes import APPLY, REAPPLY, RETRY, row_delta_attempt
from tidewater.commit.dead_letters import DeadLetterSink
from tidewater.commit.holders import Checkpoint, Holder, OwnSnapshot, checkpoint_change
from tidewater.commit.job import BatchCommit, TableKind, Target
from tidewater.commit.primitive import Change, Committed, commit
from tidewater.commit.quarantine import quarantine_change
from tidewater.commit.replay import refuse_rows_held_since_written, replay_change
from tidewater.commit.result import CommitResult, CommitStatus, TableCommit
from tidewater.commit.together import Part, commit_together, offers_transactions
from tidewater.config.parse import load_pipeline
from tidewater.config.spec import PipelineSpec
from tidewater.errors import TerminalError
from tidewater.table.catalog import commit_slots, create_table, load_table
from tidewater.table.provisional import confirm_keys
from tidewater.table.summary import (
    OFFSETS_TAG,
    QUARANTINED,
    find_batch_snapshot,
    quarantine_branch,
)
from tidewater.table.targets import target_role, target_view

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)


def outputs_of(spec: PipelineSpec, plan: BatchPlan, manifest: BatchManifest) -> tuple[TableOutput, ...]:
    """The manifest's per-table outputs. A manifest staged by the previous version (``batch.READABLE_MANIFESTS``)
    kept a plain batch's files at the top: as its table's output they were written against the offsets the plan
    started from."""
    if manifest.outputs or not spec.targets.fused:
        return manifest.outputs
    return (fused_output(plan, manifest.data_files, manifest.rows_expected, manifest.present, manifest.ignored_fields, spec.table.branch),)


# ---- the change of one target: chosen by what the batch carries for it and its mode ----------------------


def appended(table: Any, t: Target) -> Change:
    """Rows appended (or, quarantined, appended to the quarantine branch with main's empty snapshot moving the
    offsets); with no files, a snapshot that only moves the offsets (a batch of dead letters, a skip)."""
    props, batch_id = t.properties(table), t.job.plan.batch_id
    confirm = tuple(confirm_keys(table, batch_id))  # the batch's schema changes become permanent with it
    if t.held:
        to_branch = quarantine_change(batch_id, t.out.data_files, props)
        return Change(
            {**props, QUARANTINED: quarantine_branch(batch_id)}, (), branch=t.out.branch, also=(to_branch,), remove_properties=confirm
        )
    return Change(props, t.out.data_files, branch=t.out.branch, remove_properties=confirm)


def row_delta(table: Any, t: Target) -> Change:
    """A change table's batch: its changes by key as one row delta (``commit/changes.py``)."""
    if t.role.takes_one_topic and len(t.out.seen_offsets) > 1:  # a key's changes are ordered within one topic only
        raise TerminalError(
            f"change table {t.out.table} got changes of {len(t.out.seen_offsets)} topics in one batch "
            f"({', '.join(sorted(t.out.seen_offsets))}): a change table takes one topic's changes; route "
            "each topic to its own table (routing.table_template)",
            table=t.out.table,
            batch_id=t.job.plan.batch_id,
        )
    return row_delta_attempt(table, t.view, t.job.plan, t.out.data_files, t.attempt, t.properties, APPLY, quarantine=t.held)


def replayed(table: Any, t: Target) -> Change:
    """A replay of an append table: the range's rows replaced, or the missing ones appended (and a dead-letter
    retry's records that now pass): those must still be missing (``refuse_rows_held_since_written``)."""
    if t.mode in (Mode.APPEND_MISSING, Mode.RETRY):
        refuse_rows_held_since_written(table, t.view, t.job.plan, t.out.data_files)
    return replay_change(table, t.view, t.job.plan, t.out.data_files, t.properties(table), t.mode)


def retried(table: Any, t: Target) -> Change:
    """A dead-letter retry of a change table: the changes applied in source order where no later one of their key is
    applied (``commit/changes.py``: RETRY)."""
    return row_delta_attempt(table, t.view, t.job.plan, t.out.data_files, t.attempt, t.properties, RETRY)


def reapplied(table: Any, t: Target) -> Change:
    """A replay of a change table: each change applied again where it is still its key's latest."""
    return row_delta_attempt(table, t.view, t.job.plan, t.out.data_files, t.attempt, t.properties, REAPPLY)


KINDS: dict[tuple[TableKind, Mode], Callable[[Any, Target], Change]] = {
    (TableKind.APPEND, Mode.INGEST): appended,
    (TableKind.APPEND, Mode.SKIP): appended,
    (TableKind.CHANGE, Mode.INGEST): row_delta,
    (TableKind.CHANGE, Mode.SKIP): appended,  # nothing to apply: the snapshot moves the offsets past the skipped range
    (TableKind.APPEND, Mode.REPLACE): replayed,
    (TableKind.APPEND, Mode.APPEND_MISSING): replayed,
    (TableKind.CHANGE, Mode.REAPPLY): reapplied,
    (TableKind.APPEND, Mode.RETRY): replayed,  # the letters' records that now pass, appended (offsets already held left out)
    (TableKind.CHANGE, Mode.RETRY): retried,
}


def target_change(target: Target) -> Callable[[Any], Change]:
    """How one target's change is prepared on the table as loaded: the change ``KINDS`` gives it, with its offsets
    requirement and the offsets tag (every target's snapshot carries its offsets: the tag keeps the newest through
    other tools' expiry). The same for a commit of its own and for a multi-table one (``commit/together.py``)."""
    choose = KINDS.get((target.kind, target.mode))
    if choose is None:
        raise TerminalError(
            f"{target.job.what}: a {target.kind} table is not committed in mode {target.mode}",
            table=target.out.table,
            batch_id=target.job.plan.batch_id,
        )
    expect = target.expected()

    def prepare(table: Any) -> Change:
        change = choose(table, target)
        target.attempt.stamp(change.properties)
        return dataclasses.replace(change, expect=expect, tag=OFFSETS_TAG)

    return prepare


def on_missing_target(catalog: Catalog, target: Target) -> Callable[[], Any] | None:
    """What a target's commit does when its table does not exist (``missing_table``; None: that is terminal)."""
    created = target.role.created_at_commit and target.job.ingests
    return missing_table(catalog, target.job.plan, target.job.manifest) if created else None


def target_done(target: Target, done: Committed) -> CommitStatus:
    """After a target's commit (of its own or with the others): kept in its attempt, a change table's staged change
    files removed, the commit logged; returns its status."""
    out = target.out
    target.attempt.done = done
    if target.kind is TableKind.CHANGE:
        remove_staged(done.table, out.data_files)
    if done.status == "committed":
        counts = target.attempt.counts
        log.info(
            "%s (%s) committed to %s%s: %d rows%s",
            target.job.what,
            target.mode,
            out.table,
            f" (branch {out.branch})" if out.branch else "",
            out.rows,
            f" ({', '.join(f'{k} {v}' for k, v in counts.items() if isinstance(v, int))})" if counts else "",
        )
    return done.status


def commit_table_output(catalog: Catalog, plan: BatchPlan, out: TableOutput, target: Target) -> CommitStatus:
    """Commit one target table's part of the batch, once (by batch id), with the change ``KINDS`` gives it and its
    offsets requirement; returns the status (the commit itself is kept in ``target.attempt.done``). A change
    table's staged change files are removed after."""
    done = commit(
        catalog,
        out.table,
        target_change(target),
        marker=plan.batch_id,
        what=target.job.what,
        max_attempts=target.job.max_attempts,
        on_missing=on_missing_target(catalog, target),
    )
    return target_done(target, done)


# ---- the batch: every target, then the holder, then the dead letters ----------------------------------------


def commit_batch(
    catalog: Catalog,
    plan: BatchPlan,
    manifest: BatchManifest,
    *,
    spec: PipelineSpec | None = None,
    dag_run_id: str | None = None,
    max_attempts: int = 8,
    validation: Mapping[str, Any] | None = None,
    dead_letter_sink: DeadLetterSink | None = None,
    extra_properties: Mapping[str, str] | None = None,
) -> CommitResult:
    """Commit a batch over the pipeline's target set (``spec``, default the pipeline the plan names); see the
    module docstring. Raises ``OffsetsMovedError`` when another writer moved the offsets (terminal: re-plan),
    ``TransientError`` when the catalog kept failing (retrying the commit step is safe)."""
    job = BatchCommit(spec or load_pipeline(plan.pipeline_path), plan, manifest, dag_run_id, validation, extra_properties, max_attempts)
    outputs = outputs_of(job.spec, plan, manifest)
    check_manifest(job, outputs)
    held = set(job.quarantined(outputs)) if job.ingests else set()
    # the one place the commit asks where the offsets live (see commit/holders.py)
    holder: Holder = (OwnSnapshot if job.spec.targets.fused else Checkpoint)(catalog, job, dead_letter_sink)
    answered = holder.ready(outputs, held)
    if answered is not None:
        return answered
    todo = [
        Target(job, o, target_view(job.spec, catalog, o.table), o.table in held)
        for o in outputs
        if o.data_files or target_role(job.spec, o.table).committed_without_rows
    ]
    if commits_together(catalog, job):
        timings = commit_targets_together(catalog, job, todo, sorted(held))
        return holder.finish(outputs, todo, timings, held, holder_committed=True)
    timings = commit_targets(catalog, todo)
    return holder.finish(outputs, todo, timings, held)


def commits_together(catalog: Catalog, job: BatchCommit) -> bool:
    """Whether the batch's tables and its checkpoint commit in one catalog transaction (``commit/together.py``): a
    routed ingest (a replay leaves the checkpoint as it is) on a catalog that offers it, unless
    ``catalog.multi_table_commit`` is ``never``."""
    return job.ingests and not job.spec.targets.fused and job.spec.catalog.multi_table_commit == "auto" and offers_transactions(catalog)


def commit_targets_together(catalog: Catalog, job: BatchCommit, todo: list[Target], held: list[str]) -> list[TableCommit]:
    """Every target's change and the checkpoint's (``holders.checkpoint_change``), prepared as their own commits
    would be, in one catalog transaction; the outcomes read back from the tables, the checkpoint's last (a table that
    had the batch before, from a one-by-one commit cut short, is ``already-committed``). The transaction's attempts
    are the checkpoint's (``commit_retries`` counts a retried transaction once)."""
    plan, holder = job.plan, job.spec.targets.holder
    parts = [Part(t.out.table, target_change(t), on_missing_target(catalog, t)) for t in todo]
    t0 = time.monotonic()
    attempts, carried = commit_together(
        catalog,
        [*parts, Part(holder, checkpoint_change(job, held))],
        marker=plan.batch_id,
        what=f"{job.what} (one transaction)",
        max_attempts=job.max_attempts,
    )
    seconds = round(time.monotonic() - t0, 4)
    timings = []
    for t in todo:
        table = load_table(catalog, t.out.table)
        found = find_batch_snapshot(table, plan.batch_id) if table is not None else None
        status: CommitStatus = "nothing-to-commit" if not found else "already-committed" if t.out.table in carried else "committed"
        done = Committed(status, table, found.snapshot_id if found else None)
        timings.append(
            TableCommit(
                table=t.out.table,
                status=target_done(t, done),
                rows=t.out.rows,
                seconds=seconds,
                snapshot_id=done.snapshot_id,
            )
        )
    return [*timings, TableCommit(table=holder, status="checkpoint", rows=0, seconds=seconds, attempts=attempts)]


def commit_targets(catalog: Catalog, todo: list[Target]) -> list[TableCommit]:
    """Each target's commit (``commit_table_output``), on a pool of the catalog's commit slots; in the targets'
    order when one at a time. A failure is raised once the commits under way have ended; the targets committed
    stay committed (a retry skips them by batch id)."""

    def one(t: Target) -> TableCommit:
        t0 = time.monotonic()
        status = commit_table_output(catalog, t.job.plan, t.out, t)
        done = t.attempt.done
        return TableCommit(
            table=t.out.table,
            status=status,
            rows=t.out.rows,
            seconds=round(time.monotonic() - t0, 4),
            snapshot_id=done.snapshot_id if done else None,
            attempts=done.attempts if done else 1,
        )

    slots = min(commit_slots(catalog), len(todo))
    if slots <= 1:
        return [one(t) for t in todo]
    with ThreadPoolExecutor(max_workers=slots, thread_name_prefix="tidewater-commit") as pool:
        futures = [pool.submit(one, t) for t in todo]
    return [f.result() for f in futures]


# ---- checks and helpers -------------------------------------------------------------------------------------


def check_manifest(job: BatchCommit, outputs: tuple[TableOutput, ...]) -> None:
    """The manifest must be this plan's and cover every planned range completely; its files hold the rows the
    writer counted per table; the dead-letter files hold the dead letters; a routed batch's records read =
    records routed to at least one table + dead letters + skipped."""
    plan, manifest = job.plan, job.manifest
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
    routed = manifest.routed
    if manifest.dead_letters_in_files != manifest.dead_letters or (
        routed is not None and manifest.records != routed + manifest.dead_letters + manifest.skipped
    ):
        raise TerminalError(
            f"accounting does not add up: {manifest.records} records read, "
            + (f"{routed} routed to tables, " if routed is not None else "")
            + f"{manifest.dead_letters} dead letters ({manifest.dead_letters_in_files} in files), {manifest.skipped} "
            f"skipped, {manifest.present} already present",
            batch_id=plan.batch_id,
        )
    for o in outputs:
        in_files = sum(f.record_count for f in o.data_files)
        if in_files != o.rows:
            raise TerminalError(
                f"accounting does not add up: data files hold {in_files} rows but the writer counted "
                f"{o.rows} ({manifest.records} records read, {manifest.dead_letters} dead letters, "
                f"{manifest.skipped} skipped, {manifest.present} already present)",
                table=o.table,
                batch_id=plan.batch_id,
            )


def missing_table(catalog: Catalog, plan: BatchPlan, manifest: BatchManifest) -> Callable[[], Any]:
    """What a fused table's commit does when the table does not exist: refuse if files were written for it (it was
    dropped in between), create it empty if records were read (every one was a dead letter or skipped, and the
    offsets must move; its columns come with the first good record), else nothing."""

    def on_missing() -> Any:
        if manifest.data_files:
            raise TerminalError("table disappeared between write and commit", table=plan.table, batch_id=plan.batch_id)
        return create_table(catalog, plan.table, pa.schema([]), {"format-version": "2"}) if manifest.records else None

    return on_missing
