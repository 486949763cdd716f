"""Where a batch's offsets live: the offsets holder's part of a commit (``config/targets.py``: the target set).

The commit loop (``commit/batch.py: commit_batch``) is one shape for N tables: the holder gets ready, the target
tables commit, the holder finishes. Two holders answer those two steps:

- ``OwnSnapshot``: a plain pipeline's one table holds its own offsets, so its data and its offsets land in ONE
  snapshot (the table's own commit stamps them). Nothing commits before or after it but the batch's dead letters.
- ``Checkpoint``: a routed pipeline's checkpoint table holds the offsets, committed last, with a row per batch: until
  it is, the batch is not committed (a retried or re-planned batch finds each table's own offsets). It is created
  by the first batch, and a batch it already carries is answered without committing anything.

A replay keeps every offset, wherever it lives: its ranges must be committed ones (checked against the holder).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from tidewater.batch import BatchManifest, BatchPlan, Offsets, TableOutput, offsets_to_json
from tidewater.commit.dead_letters import DeadLetterSink, commit_dead_letters
from tidewater.commit.job import TableKind
from tidewater.commit.primitive import Change, Committed, commit
from tidewater.commit.replay import refuse_uncommitted_ranges
from tidewater.commit.result import CommitResult, TableCommit
from tidewater.errors import TransientError
from tidewater.table.catalog import create_table, load_table
from tidewater.table.own_tables import CHECKPOINT_SCHEMA
from tidewater.table.summary import OFFSETS_TAG, QUARANTINED_TABLES, ROUTED, committed_state, find_batch_snapshot

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from tidewater.commit.job import BatchCommit, Target

log = logging.getLogger(__name__)


class Holder(Protocol):
    """What the commit loop (``commit/batch.py: commit_batch``) asks of an offsets holder, before and after the target
    tables commit: ``OwnSnapshot`` and ``Checkpoint`` answer it."""

    def ready(self, outputs: tuple[TableOutput, ...], held: set[str]) -> CommitResult | None:
        """Before the tables: checks, and the outcome when there is nothing left to commit (None: go on)."""
        ...

    def finish(
        self,
        outputs: tuple[TableOutput, ...],
        todo: list[Target],
        timings: list[TableCommit],
        held: set[str],
        holder_committed: bool = False,
    ) -> CommitResult:
        """After the tables (``holder_committed``: the holder's change went with theirs, in one transaction)."""
        ...


def files_of(outputs: tuple[TableOutput, ...]) -> int:
    return sum(len(o.data_files) for o in outputs)


class OwnSnapshot:
    """A plain pipeline's holder: its one target table, whose own snapshot carries the offsets."""

    def __init__(self, catalog: Catalog, job: BatchCommit, sink: DeadLetterSink | None) -> None:
        self.catalog, self.job, self.sink = catalog, job, sink

    def ready(self, outputs: tuple[TableOutput, ...], held: set[str]) -> CommitResult | None:
        """Before the table commits: a replay's ranges must be committed ones. An ingest checks its offsets in the
        table's own commit (``Target.expected``)."""
        if not self.job.ingests:
            ident = self.job.spec.targets.holder
            _replay_of_committed_ranges(self.job, load_table(self.catalog, ident), ident)
        return None

    def finish(
        self,
        outputs: tuple[TableOutput, ...],
        todo: list[Target],
        timings: list[TableCommit],
        held: set[str],
        holder_committed: bool = False,
    ) -> CommitResult:
        """The outcome: the table's one snapshot (data and offsets), then the batch's dead letters."""
        job, target = self.job, todo[0]
        plan, manifest = job.plan, job.manifest
        done: Committed | None = target.attempt.done
        if done is None or done.status == "nothing-to-commit":
            return CommitResult(status="nothing-to-commit", batch_id=plan.batch_id, table=plan.table, records=0, data_files=0, offsets={})
        found = find_batch_snapshot(done.table, plan.batch_id) if done.status == "committed" else None
        offsets = target.attempt.stamped
        if offsets is None:
            offsets = plan.end_offsets() if job.ingests else committed_state(done.table, target.view.table.branch).offsets
        files = len(target.attempt.files) if target.kind is TableKind.CHANGE else len(target.out.data_files)
        if job.ingests:
            commit_dead_letters(self.catalog, plan, manifest, self.sink)
        own = dataclasses.replace(timings[0], rows=manifest.rows_in_files, snapshot_id=found.snapshot_id if found else done.snapshot_id)
        return CommitResult(
            status=done.status,
            batch_id=plan.batch_id,
            table=plan.table,
            records=manifest.records,
            data_files=files,
            offsets=offsets,
            dead_letters=manifest.dead_letters if job.ingests else 0,
            tables=(own,),
            quarantined=(plan.table,) if target.held else (),
        )


class Checkpoint:
    """A routed pipeline's holder: its checkpoint table, committed after every target table."""

    def __init__(self, catalog: Catalog, job: BatchCommit, sink: DeadLetterSink | None) -> None:
        self.catalog, self.job, self.sink = catalog, job, sink
        self.ident = job.spec.targets.holder
        self.table: Any = load_table(catalog, self.ident)

    def ready(self, outputs: tuple[TableOutput, ...], held: set[str]) -> CommitResult | None:
        """Before the tables commit. A replay: its ranges must be committed ones. An ingest: the checkpoint exists (the
        first batch creates it); a batch it carries already is answered as committed (its dead letters committed if
        they were not); its offsets must still be those the plan started from."""
        job, plan, manifest = self.job, self.job.plan, self.job.manifest
        if not job.ingests:
            _replay_of_committed_ranges(job, self.table, self.ident)
            return None
        self.table = self.table or create_table(self.catalog, self.ident, CHECKPOINT_SCHEMA, {"format-version": "2"})
        if find_batch_snapshot(self.table, plan.batch_id) is not None:
            commit_dead_letters(self.catalog, plan, manifest, self.sink)
            return CommitResult(
                status="already-committed",
                batch_id=plan.batch_id,
                table=self.ident,
                records=manifest.records,
                data_files=files_of(outputs),
                offsets=plan.end_offsets(),
                dead_letters=manifest.dead_letters,
                quarantined=tuple(sorted(held)),
            )
        job.holder_expected().check(self.table, self.ident)
        return None

    def finish(
        self,
        outputs: tuple[TableOutput, ...],
        todo: list[Target],
        timings: list[TableCommit],
        held: set[str],
        holder_committed: bool = False,
    ) -> CommitResult:
        """After the tables: an ingest commits the checkpoint (unless it was ``holder_committed`` with them, in one
        transaction), then the dead letters. The outcome lists every table."""
        job, plan, manifest = self.job, self.job.plan, self.job.manifest
        if job.ingests:
            if not holder_committed:
                t0 = time.monotonic()
                commit_checkpoint(self.catalog, job, sorted(held))
                timings.append(TableCommit(table=self.ident, status="checkpoint", rows=0, seconds=round(time.monotonic() - t0, 4)))
            commit_dead_letters(self.catalog, plan, manifest, self.sink)
        log.info(
            "%s: %s%s",
            job.what,
            ", ".join(f"{t.table}: {t.status}" for t in timings) or "no rows for any table",
            f"; the checkpoint {self.ident}" if job.ingests else "",
        )
        done = job.ingests or any(t.status == "committed" for t in timings) or not timings
        offsets = plan.end_offsets() if job.ingests else committed_state(self.table).offsets if self.table is not None else {}
        return CommitResult(
            status="committed" if done else "already-committed",
            batch_id=plan.batch_id,
            table=self.ident,
            records=manifest.records,
            data_files=files_of(outputs),
            offsets=offsets,
            dead_letters=manifest.dead_letters if job.ingests else 0,
            tables=tuple(timings),
            quarantined=tuple(sorted(held)),
        )


def _replay_of_committed_ranges(job: BatchCommit, holder: Any, ident: str) -> None:
    """A replay re-reads committed records only: its ranges against the holder's committed offsets (none when the
    holder does not exist)."""
    offsets = committed_state(holder, job.spec.targets.branch).offsets if holder is not None else {}
    refuse_uncommitted_ranges(job.plan, offsets, ident)


def checkpoint_row(plan: BatchPlan, manifest: BatchManifest, offsets: Offsets) -> Any:
    """The checkpoint table's row for a batch (``table/own_tables.py``: CHECKPOINT_SCHEMA)."""
    tables = [o.table for o in manifest.outputs if o.data_files]
    return pa.table(
        {
            "batch_id": [plan.batch_id],
            "pipeline": [plan.pipeline],
            "committed_at": pa.array([datetime.now(timezone.utc)], pa.timestamp("us", tz="UTC")),
            "records": pa.array([manifest.records], pa.int64()),
            "dead_letters": pa.array([manifest.dead_letters], pa.int64()),
            "skipped": pa.array([manifest.skipped], pa.int64()),
            "tables": [json.dumps(tables)],
            "offsets": [json.dumps(offsets_to_json(offsets), separators=(",", ":"))],
        },
        schema=CHECKPOINT_SCHEMA,
    )


def checkpoint_change(job: BatchCommit, held: list[str]) -> Callable[[Any], Change]:
    """How the checkpoint's change is prepared: its row and snapshot with the batch's offsets and accounting
    (records read = records routed to at least one table + dead letters + skipped), and the tables the gate
    quarantined (where the planner looks for change tables waiting on a quarantined batch). The same for its commit
    of its own and for a multi-table one (``commit/together.py``)."""
    plan, manifest = job.plan, job.manifest
    offsets = plan.end_offsets()
    expect = job.holder_expected()

    def prepare(checkpoint: Any) -> Change:
        props = job.holder_properties(offsets)
        props[ROUTED] = str(manifest.routed)
        if held:
            props[QUARANTINED_TABLES] = json.dumps(held, separators=(",", ":"))
        return Change(props, rows=checkpoint_row(plan, manifest, offsets), expect=expect, tag=OFFSETS_TAG)

    return prepare


def commit_checkpoint(catalog: Catalog, job: BatchCommit, held: list[str]) -> None:
    """The checkpoint's commit of its own, last (``checkpoint_change``)."""
    plan = job.plan
    try:
        commit(
            catalog,
            plan.table,
            checkpoint_change(job, held),
            marker=plan.batch_id,
            what=f"batch {plan.batch_id} (checkpoint)",
            max_attempts=job.max_attempts,
        )
    except TransientError:
        raise TransientError(
            "the tables are committed but the checkpoint is not yet; retry the commit step", table=plan.table, batch_id=plan.batch_id
        ) from None
