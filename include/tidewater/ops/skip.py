"""Stepping past records that block a partition: an operator dead-letters a named offset range.

A record that fails every retry (and is not a dead letter by itself: a batch-level failure, a check
with the ``fail`` policy) stops its partition. ``tidewater skip`` (or the ``skip_<name>`` DAG) takes the
range that starts at the partition's committed offset, writes its records to the dead-letter table as
``OperatorSkip`` with the reason and who asked, and advances the committed offset past it: one batch of
its own (batch id ``skip-...``), committed like any batch (offsets and dead letters, idempotent, finished
by the next run if interrupted between the two commits). The table's snapshot records
``tidewater.operator-skip`` (range, reason, who), so the history shows every skip. A routed pipeline's skip
moves its checkpoint table's offsets (no target table gets a commit; their offsets catch up with the next
batch that has rows for them).

The range starts at or after the partition's committed offset. When it starts after it, the records
between the committed offset and the range are ingested first as a normal batch of their own (written
by the same task code, validated and committed like any batch), so the skip never takes good records
with it. Records after the range are the next batches' to ingest.

The same command steps past records that retention deleted before they were ingested (the partition's log start
passed its committed offset: the plan refuses the batch with ``OffsetGapError``). The part of the range below the
log start cannot be read: it is not dead-lettered, and the request recorded in the snapshot says how many offsets
it held (``deleted_unread``), so the audit explains it as a known loss.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from tidewater.batch import (
    MANIFEST_NAME,
    PLAN_NAME,
    BatchManifest,
    BatchPlan,
    Mode,
    PartitionRange,
    PartitionStats,
    StagedFile,
    batch_dir,
    fused_output,
    utc_now_iso,
    write_json_atomic,
)
from tidewater.commit.batch import commit_batch
from tidewater.commit.dead_letters import dead_letter_sink
from tidewater.config.spec import PipelineSpec
from tidewater.decode.records import BadRecord
from tidewater.errors import ConfigError
from tidewater.source.kafka import kafka_settings, read_range, watermarks
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.table.catalog import load_catalog
from tidewater.table.own_tables import ensure_dead_letter_table
from tidewater.table.summary import OPERATOR_SKIP
from tidewater.table.targets import holder_state
from tidewater.write.dead_letters import dead_letter_rows
from tidewater.write.job import run_inline
from tidewater.write.parquet import DataFileWriter, to_table_schema

log = logging.getLogger(__name__)

ERROR_CLASS = "OperatorSkip"


@dataclass(frozen=True)
class SkipRequest:
    topic: str
    partition: int
    start_offset: int
    end_offset: int  # exclusive
    reason: str
    by: str
    dry_run: bool = False


def check_request(spec: PipelineSpec, req: SkipRequest, committed: int | None, low: int, high: int) -> int:
    """The partition's next offset to ingest (the range starts there or later); raises ConfigError naming
    the parameter."""
    if not req.reason.strip():
        raise ConfigError("reason: required (it is recorded with the dead letters and in the table's history)")
    expected = committed if committed is not None else low
    if req.start_offset < expected:
        raise ConfigError(
            f"start_offset: {req.start_offset} is before the next offset to ingest of "
            f"{req.topic}[{req.partition}], {expected}: records before it are committed already"
        )
    if not req.start_offset < req.end_offset <= high:
        raise ConfigError(
            f"end_offset: {req.end_offset} must be after start_offset {req.start_offset} and at most the "
            f"end offset {high} of {req.topic}[{req.partition}]"
        )
    return expected


def _dead_letter_files(
    spec: PipelineSpec, settings: dict[str, str], plan: BatchPlan, req: SkipRequest, low: int
) -> tuple[list[StagedFile], PartitionStats]:
    """The range's records as dead-letter rows (OperatorSkip, with the reason), written as staged files. Offsets
    below the log start ``low`` were deleted by retention: they are not read."""
    table = ensure_dead_letter_table(load_catalog(spec), spec)
    writer = DataFileWriter(table, f"{plan.batch_id}-skip")
    message = f"skipped by {req.by}: {req.reason}"
    count, first, last = 0, None, None
    rng = plan.ranges[0]
    readable = PartitionRange(rng.topic, rng.partition, max(rng.start, low), rng.end)
    for chunk in read_range(
        settings,
        readable,
        chunk_records=spec.batch.chunk_records,
        read_timeout=spec.kafka.read_timeout_seconds,
        client_id=f"{spec.name}-skip",
        keys=True,
        headers=True,
    ):
        bad = [BadRecord(i, ERROR_CLASS, message) for i in range(len(chunk))]
        writer.write(to_table_schema(table, dead_letter_rows(chunk, bad, plan.batch_id, spec.name)))
        count += len(chunk)
        first = chunk.offsets[0] if first is None else first
        last = chunk.offsets[-1]
    stats = PartitionStats(
        rng.topic,
        rng.partition,
        rng.start,
        rng.end,
        count,
        first,
        last,
        None,
        None,
        dead_letters=count,
        routed=None if spec.targets.fused else 0,
    )
    return [StagedFile.from_json(f) for f in writer.close()], stats


def skip(spec: PipelineSpec, req: SkipRequest) -> dict[str, Any]:
    """Dead-letter ``req``'s range and advance the committed offset past it (see the module docstring)."""
    catalog = load_catalog(spec)
    table, state = holder_state(catalog, spec)
    offsets = state.offsets if state is not None else {}
    settings = kafka_settings(spec)
    low, high = watermarks(settings, [(req.topic, req.partition)])[(req.topic, req.partition)]
    nxt = check_request(spec, req, offsets.get(req.topic, {}).get(req.partition), low, high)
    preview: dict[str, Any] = {
        "topic": req.topic,
        "partition": req.partition,
        "start": req.start_offset,
        "end": req.end_offset,
        "reason": req.reason,
        "by": req.by,
    }
    deleted = max(0, min(req.end_offset, low) - req.start_offset)  # offsets retention removed before ingestion
    if deleted:
        preview["deleted_unread"] = deleted
    if req.dry_run:
        log.info(
            "skip (dry run): would ingest %s[%d] [%d, %d) first, then dead-letter [%d, %d) and move the offset to %d",
            req.topic,
            req.partition,
            nxt,
            req.start_offset,
            req.start_offset,
            req.end_offset,
            req.end_offset,
        )
        return {"status": "dry-run", "ingested_first": req.start_offset - nxt, **preview}
    ingested = 0
    if req.start_offset > nxt:
        ingested = _ingest_before(
            spec,
            settings,
            PartitionRange(req.topic, req.partition, nxt, req.start_offset),
            offsets,
            state.snapshot_id if state is not None else None,
        )
        table, state = holder_state(catalog, spec)
        offsets = state.offsets if state is not None else {}
    rng = PartitionRange(req.topic, req.partition, req.start_offset, req.end_offset)
    plan = BatchPlan.new(spec, (rng,), offsets, state.snapshot_id if state is not None else None, Mode.SKIP)
    directory = batch_dir(spec.staging_dir(), spec.name, plan.batch_id)
    write_json_atomic(directory / PLAN_NAME, plan.to_json())
    files, stats = _dead_letter_files(spec, settings, plan, req, low)
    count = stats.records
    # no rows for any table: a plain pipeline's one table gets an empty output (its offsets move past the range)
    own = (fused_output(plan, (), 0, 0, (), spec.table.branch),) if spec.targets.fused else ()
    manifest = BatchManifest(
        batch_id=plan.batch_id,
        table=plan.table,
        data_files=(),
        partitions=(stats,),
        schema_id=table.schema().schema_id if table is not None else -1,
        written_at=utc_now_iso(),
        dead_letter_table=spec.dead_letter_table(),
        dead_letter_files=tuple(files),
        outputs=own,
    )
    write_json_atomic(directory / MANIFEST_NAME, manifest.to_json())
    extra = {OPERATOR_SKIP: json.dumps(preview, separators=(",", ":"))}
    # the holder moves on (a routed pipeline's target tables get no commit: no rows)
    result = commit_batch(
        catalog, plan, manifest, spec=spec, dead_letter_sink=dead_letter_sink(spec, plan.batch_id), extra_properties=extra
    )
    log.info(
        "skip %s: %d records of %s[%d] [%d, %d) dead-lettered by %s (%s), %d deleted by retention unread; offset now %d",
        plan.batch_id,
        count,
        req.topic,
        req.partition,
        req.start_offset,
        req.end_offset,
        req.by,
        req.reason,
        deleted,
        req.end_offset,
    )
    return {
        "status": result.status,
        "batch_id": plan.batch_id,
        "dead_letters": count,
        "ingested_first": ingested,
        "deleted_unread": deleted,
        **preview,
    }


def _ingest_before(spec: PipelineSpec, settings: dict[str, str], rng: PartitionRange, offsets: Any, snapshot_id: int | None) -> int:
    """Ingest the records before the skipped range as a batch of their own (same task code as Spark runs,
    validated and committed like any batch). Returns the records read."""
    plan = BatchPlan.new(spec, (rng,), offsets, snapshot_id)
    directory = batch_dir(spec.staging_dir(), spec.name, plan.batch_id)
    write_json_atomic(directory / PLAN_NAME, plan.to_json())
    manifest = run_inline(plan, spec, settings)
    write_json_atomic(directory / MANIFEST_NAME, manifest.to_json())
    validate_step(spec, plan, manifest)
    commit_step(spec, plan, manifest)
    log.info(
        "skip: ingested %s[%d] [%d, %d) first (%d records) as batch %s",
        rng.topic,
        rng.partition,
        rng.start,
        rng.end,
        manifest.records,
        plan.batch_id,
    )
    return manifest.records
