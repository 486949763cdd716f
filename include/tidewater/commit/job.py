"""One batch's commit as data: the job (``BatchCommit``: what was planned and written, the gate's verdict, who asked)
and its targets (``Target``: one table's part, its view of the pipeline, its offsets requirement and snapshot
properties). Both the commit loop (``commit/batch.py``) and the offsets holders (``commit/holders.py``) read them;
neither is imported by this module, so the two stay apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tidewater.batch import BatchManifest, BatchPlan, Mode, Offsets, PartitionRange, TableOutput
from tidewater.commit.attempt import TargetAttempt
from tidewater.commit.primitive import OffsetsExpected
from tidewater.commit.replay import replay_summary
from tidewater.config.spec import PipelineSpec
from tidewater.table.summary import DATA_INTERVAL, RANGES, committed_state, summary_properties
from tidewater.table.targets import TargetRole, target_role


class TableKind(StrEnum):
    """What a target table does with a batch's rows: appends them, or applies them by key as changes (upserts,
    deletes, a change stream's operations). With the batch's ``Mode`` it picks the table's change
    (``commit/batch.py: KINDS``)."""

    APPEND = "append"
    CHANGE = "change"


@dataclass(frozen=True)
class BatchCommit:
    """One batch's commit: what was planned and written, the gate's verdict, and who asked. ``extra``: more
    properties for the holder's snapshot (an operator's skip records its request)."""

    spec: PipelineSpec
    plan: BatchPlan
    manifest: BatchManifest
    dag_run_id: str | None = None
    validation: Mapping[str, Any] | None = None
    extra: Mapping[str, str] | None = None
    max_attempts: int = 8

    @property
    def ingests(self) -> bool:
        """The batch moves offsets (ingest, skip); otherwise it is a replay, which keeps them."""
        return self.plan.mode.moves_offsets

    @property
    def what(self) -> str:
        return f"{'batch' if self.ingests else 'replay'} {self.plan.batch_id}"

    def verdict(self, ident: str) -> dict[str, Any] | None:
        """The gate's verdict on one target: a fused table's is the batch's, others have their own."""
        if target_role(self.spec, ident).carries_totals:
            return dict(self.validation) if self.validation is not None else None
        return (self.validation or {}).get("tables", {}).get(ident)

    def quarantined(self, outputs: tuple[TableOutput, ...]) -> list[str]:
        """The targets whose part of the batch the gate quarantined: a fused table whole, other tables those with
        files whose own checks failed."""
        if not (self.validation or {}).get("quarantine"):
            return []
        return [
            o.table
            for o in outputs
            if target_role(self.spec, o.table).carries_totals or (o.data_files and not (self.verdict(o.table) or {}).get("success", True))
        ]

    def holder_expected(self) -> OffsetsExpected:
        """A separate holder's requirement: its offsets are those the plan started from (checked before the targets
        commit, and again on the holder's own commit)."""
        return OffsetsExpected(written_against(self.plan), None, self.plan.batch_id, "the pipeline's checkpoint")

    def holder_properties(self, offsets: Offsets, ignored: tuple[str, ...] = ()) -> dict[str, str]:
        """The holder's snapshot properties: the batch's offsets and its accounting, as a whole."""
        m = self.manifest
        props = summary_properties(
            offsets=offsets,
            batch_id=self.plan.batch_id,
            pipeline=self.plan.pipeline,
            records=m.records,
            valid_through_ms=m.valid_through_ms(),
            dag_run_id=self.dag_run_id,
            dead_letters=m.dead_letters,
            skipped=m.skipped,
            ignored_fields=ignored,
            validation=dict(self.validation) if self.validation is not None else None,
        )
        props.update(batch_properties(self.plan))
        props.update(self.extra or {})
        return props


def written_against(plan: BatchPlan) -> dict[str, dict[int, tuple[int | None, ...]]]:
    """The holder's committed offsets the plan started from, for each planned partition."""
    return {t: {int(p): s for p, s in ps.items()} for t, ps in plan.seen_offsets().items()}


@dataclass
class Target:
    """One table of a batch's commit: what the write step left for it, its view of the pipeline, and whether the
    gate quarantined it. ``attempt`` keeps what its commit attempts know (``commit/attempt.py``)."""

    job: BatchCommit
    out: TableOutput
    view: PipelineSpec
    held: bool = False
    attempt: TargetAttempt = field(default_factory=TargetAttempt)

    @property
    def role(self) -> TargetRole:
        """The table's part in the batch (``table/targets.py``): holder of the offsets, carrier of the totals."""
        return target_role(self.job.spec, self.out.table)

    @property
    def kind(self) -> TableKind:
        """What the table does with the batch's rows (its settings for it: ``table.upsert`` or ``op_field``)."""
        return TableKind.CHANGE if self.view.applies_changes else TableKind.APPEND

    @property
    def mode(self) -> Mode:
        """The batch's mode for this table: replays reapply change tables, whatever the request's mode."""
        return self.job.plan.mode.for_table(self.view.applies_changes)

    def expected(self) -> OffsetsExpected | None:
        """The offsets requirement of this table's change (replays keep offsets and have none)."""
        if not self.job.ingests:
            return None
        seen = {t: {int(p): tuple(s) for p, s in ps.items()} for t, ps in self.out.seen_offsets.items()}
        return OffsetsExpected(seen, self.view.table.branch, self.job.plan.batch_id, f"table {self.out.table}")

    def properties(self, table: Any) -> dict[str, str]:
        """The snapshot's properties on ``table`` as loaded now: its offsets (advanced by an ingest, kept by a
        replay), the batch id and the counts (a fused table's: the whole batch's). Pure: the offsets it stamps are
        kept from the prepared change (``TargetAttempt.stamp``)."""
        job, out, plan = self.job, self.out, self.job.plan
        offsets = committed_state(table, self.view.table.branch).offsets
        m = job.manifest
        records, skipped = (m.records, m.skipped) if self.role.carries_totals else (out.rows, 0)
        if not job.ingests:
            return replay_summary(plan, offsets, records, skipped, job.dag_run_id, job.verdict(out.table))
        offsets = advanced(offsets, plan.ranges)
        if self.role.carries_totals:
            return job.holder_properties(offsets, out.ignored_fields)
        props = summary_properties(
            offsets=offsets,
            batch_id=plan.batch_id,
            pipeline=plan.pipeline,
            records=records,
            valid_through_ms=None,
            dag_run_id=job.dag_run_id,
            ignored_fields=out.ignored_fields,
            validation=job.verdict(out.table),
        )
        props.update(batch_properties(plan))  # the batch's ranges, for the pipeline's ledger
        return props


def advanced(current: Offsets, ranges: tuple[PartitionRange, ...]) -> Offsets:
    """The table's offsets advanced to the end of the batch's ranges, never moved back (a table that a later batch
    already advanced keeps its own)."""
    offsets: Offsets = {t: dict(ps) for t, ps in current.items()}
    for r in ranges:
        cur = offsets.setdefault(r.topic, {}).get(r.partition)
        offsets[r.topic][r.partition] = r.end if cur is None else max(cur, r.end)
    return offsets


def batch_properties(plan: BatchPlan) -> dict[str, str]:
    """The batch's ranges and the Airflow run's data interval, for backfills to find later."""
    props = {RANGES: json.dumps([[r.topic, r.partition, r.start, r.end] for r in plan.ranges], separators=(",", ":"))}
    if len(props[RANGES]) > 50_000:  # thousands of partitions: keep the summary small
        del props[RANGES]
    if plan.data_interval:
        props[DATA_INTERVAL] = "/".join(plan.data_interval)
    return props
