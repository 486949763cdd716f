"""Manual replay of offset ranges and backfills of past intervals.

A replay re-reads an offset range that the table has already committed and lands it again:

- ``replace`` (default): in one atomic commit the rows that came from the range are deleted and the
  re-read rows appended, so replaying twice leaves the table identical;
- ``append-missing``: only records whose offsets are absent from the table are added.

Rows are matched to offsets through the Kafka metadata columns (``format.metadata: prefixed`` or
``struct``), which a replayable pipeline must write. A replay never moves the committed offsets (its
snapshots carry them unchanged) and commits with the same optimistic checks as a batch, so it can run
beside the scheduled batches. Records that cannot be decoded during a replay are counted as skipped:
their dead letters were recorded when the range was first ingested.

Backfills of the ingest DAG go through the same machinery: an interval a committed batch recorded is a
no-op (or, with ``reprocess``, a ``replace`` replay of that batch's ranges); an interval never ingested
is mapped to offsets with Kafka's timestamp lookup and replayed with ``append-missing``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from tidewater.batch import BatchPlan, Offsets, PartitionRange, batch_dir, new_batch_id, utc_now_iso, write_json_atomic
from tidewater.config import PipelineSpec
from tidewater.errors import ConfigError, TerminalError

log = logging.getLogger(__name__)

MODES = ("replace", "append-missing")
PRESENT_NAME = "present.parquet"


@dataclass(frozen=True)
class ReplayRequest:
    """What a person asks to replay (the replay DAG's form, or `tidewater replay`)."""

    topic: str
    partitions: tuple[int, ...] = ()  # empty: every partition of the topic
    start_offset: int | None = None
    end_offset: int | None = None  # exclusive
    start_time: str | None = None  # ISO-8601; naive times are UTC
    end_time: str | None = None  # exclusive
    mode: str = "replace"
    dry_run: bool = False

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ReplayRequest:
        """From the DAG's parameter form; every problem names the parameter."""

        def opt_int(name: str) -> int | None:
            v = params.get(name)
            if v in (None, ""):
                return None
            try:
                return int(v)
            except (TypeError, ValueError):
                raise ConfigError(f"{name}: {v!r} is not a whole number") from None

        parts = params.get("partitions") or []
        if isinstance(parts, str):
            parts = [p for p in parts.replace(" ", "").split(",") if p]
        try:
            partitions = tuple(sorted({int(p) for p in parts}))
        except (TypeError, ValueError):
            raise ConfigError(f"partitions: {parts!r} must be partition numbers") from None
        return cls(
            topic=str(params.get("topic") or ""),
            partitions=partitions,
            start_offset=opt_int("start_offset"),
            end_offset=opt_int("end_offset"),
            start_time=params.get("start_time") or None,
            end_time=params.get("end_time") or None,
            mode=str(params.get("mode") or "replace"),
            dry_run=bool(params.get("dry_run")),
        )


def parse_time(value: str, name: str) -> int:
    """Epoch milliseconds of an ISO-8601 time (naive: UTC)."""
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{name}: {value!r} is not an ISO-8601 time (e.g. 2024-01-04T12:00:00Z)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return int(t.timestamp() * 1000)


def check_request(spec: PipelineSpec, req: ReplayRequest) -> None:
    """Checks that need no broker. Raises ConfigError naming the parameter or setting."""
    if spec.routed:
        raise ConfigError("replay: pipelines that route to several tables cannot be replayed yet")
    if spec.format.metadata == "none":
        raise ConfigError("format.metadata: replay needs the source of every row: set format.metadata to prefixed or "
                          "struct (rows written before that cannot be matched to their offsets)")
    if req.mode not in MODES:
        raise ConfigError(f"mode: {req.mode!r} is not one of {', '.join(MODES)}")
    if not req.topic:
        raise ConfigError("topic: required")
    by_offset = req.start_offset is not None or req.end_offset is not None
    by_time = req.start_time is not None or req.end_time is not None
    if by_offset == by_time:
        raise ConfigError("start_offset/end_offset or start_time/end_time: give one pair, not both or neither")
    if by_offset:
        if req.start_offset is None or req.end_offset is None:
            raise ConfigError("start_offset and end_offset: give both")
        if req.start_offset < 0 or req.end_offset <= req.start_offset:
            raise ConfigError(f"end_offset: {req.end_offset} must be greater than start_offset {req.start_offset} (>= 0)")
    else:
        if req.start_time is None or req.end_time is None:
            raise ConfigError("start_time and end_time: give both")
        if parse_time(req.end_time, "end_time") <= parse_time(req.start_time, "start_time"):
            raise ConfigError("end_time: must be after start_time")


class OffsetLookup(Protocol):
    """Kafka's ListOffsets by time (librdkafka ``offsets_for_times``), as replay needs it."""

    def offsets_for_times(self, topic: str, partitions: list[int], ms: int) -> dict[int, int]: ...


class KafkaOffsetLookup:
    """The real lookup: the earliest offset whose timestamp is at or after ``ms`` (the end offset when
    there is none)."""

    def __init__(self, settings: dict[str, str]) -> None:
        self.settings = settings

    def offsets_for_times(self, topic: str, partitions: list[int], ms: int) -> dict[int, int]:
        from confluent_kafka import TopicPartition as KTP

        from tidewater.errors import TransientError
        from tidewater.kafka_source import _consumer, watermarks

        consumer = _consumer(self.settings, "offsets-for-times")
        try:
            found = consumer.offsets_for_times([KTP(topic, p, ms) for p in partitions], timeout=15)
        except Exception as e:
            raise TransientError(f"offsets_for_times failed: {e}", topic=topic) from None
        finally:
            consumer.close()
        ends = watermarks(self.settings, [(topic, p) for p in partitions])
        return {tp.partition: (tp.offset if tp.offset >= 0 else ends[(topic, tp.partition)][1]) for tp in found}


def interval_offsets(lookup: OffsetLookup, topic: str, partitions: list[int], start_ms: int, end_ms: int) -> dict[int, tuple[int, int]]:
    """[first offset at or after start, first offset at or after end) per partition."""
    lo = lookup.offsets_for_times(topic, partitions, start_ms)
    hi = lookup.offsets_for_times(topic, partitions, end_ms)
    return {p: (lo[p], max(lo[p], hi[p])) for p in partitions}


def resolve_ranges(spec: PipelineSpec, req: ReplayRequest, committed: Offsets, settings: dict[str, str],
                   lookup: OffsetLookup | None = None) -> list[PartitionRange]:
    """The offset ranges of a request, checked against the log and the committed offsets.

    By offset: a range beyond the committed offset is an error (those records are the scheduled
    batches' to ingest). By time: the ranges are clipped to the committed offsets.
    """
    from tidewater.kafka_source import list_partitions, resolve_topics, watermarks

    if req.topic not in resolve_topics(settings, spec):
        raise ConfigError(f"topic: {req.topic!r} is not one of the pipeline's topics")
    available = [p for t, p in list_partitions(settings, [req.topic])]
    partitions = list(req.partitions) or available
    unknown = sorted(set(partitions) - set(available))
    if unknown:
        raise ConfigError(f"partitions: {unknown} do not exist in topic {req.topic} (it has {len(available)})")
    marks = watermarks(settings, [(req.topic, p) for p in partitions])
    done = committed.get(req.topic, {})
    if req.start_offset is not None:
        bounds = {p: (req.start_offset, req.end_offset) for p in partitions}
    else:
        lookup = lookup or KafkaOffsetLookup(settings)
        bounds = interval_offsets(lookup, req.topic, partitions, parse_time(req.start_time or "", "start_time"),
                                  parse_time(req.end_time or "", "end_time"))
    out = []
    for p in partitions:
        start, end = bounds[p]
        low = marks[(req.topic, p)][0]
        upto = done.get(p)
        if upto is None:
            raise ConfigError(f"partitions: {req.topic}[{p}] has nothing committed yet; the scheduled batches ingest it")
        if req.start_offset is not None:
            if start < low:
                raise ConfigError(f"start_offset: {start} is below the log start {low} of {req.topic}[{p}] (deleted by retention)")
            if end > upto:
                raise ConfigError(f"end_offset: {end} is beyond the committed offset {upto} of {req.topic}[{p}]; "
                                  "the scheduled batches ingest records from there")
        start, end = max(start, low), min(end, upto)
        if end > start:
            out.append(PartitionRange(req.topic, p, start, end))
    return out


def metadata_columns(spec: PipelineSpec) -> tuple[str, str, str]:
    """Names of the topic, partition and offset columns (dotted for the struct form)."""
    if spec.format.metadata == "struct":
        return "_kafka.topic", "_kafka.partition", "_kafka.offset"
    return "_kafka_topic", "_kafka_partition", "_kafka_offset"


def rows_filter(spec: PipelineSpec, ranges: list[PartitionRange] | tuple[PartitionRange, ...]) -> Any:
    """An Iceberg row filter selecting the rows that came from ``ranges``."""
    from functools import reduce

    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan, Or

    topic, partition, offset = metadata_columns(spec)
    terms = [And(EqualTo(topic, r.topic), And(EqualTo(partition, r.partition),
                                              And(GreaterThanOrEqual(offset, r.start), LessThan(offset, r.end))))
             for r in ranges]
    return reduce(Or, terms)


def present_offsets(spec: PipelineSpec, table: Any, ranges: list[PartitionRange] | tuple[PartitionRange, ...]) -> Any:
    """(topic, partition, offset) of the rows the table holds from ``ranges`` (Arrow table)."""
    import pyarrow as pa

    if table is None or not ranges or table.current_snapshot() is None:
        return pa.table({"topic": pa.array([], pa.string()), "partition": pa.array([], pa.int32()),
                         "offset": pa.array([], pa.int64())})
    cols = metadata_columns(spec)
    top = cols[0].split(".")[0]
    data = table.scan(row_filter=rows_filter(spec, ranges), selected_fields=tuple({c.split(".")[0] for c in cols} | {top})).to_arrow()
    if spec.format.metadata == "struct":
        s = data.column("_kafka").combine_chunks()
        return pa.table({"topic": s.field("topic"), "partition": s.field("partition").cast(pa.int32()), "offset": s.field("offset")})
    return pa.table({"topic": data.column("_kafka_topic"), "partition": data.column("_kafka_partition").cast(pa.int32()),
                     "offset": data.column("_kafka_offset")})


def check_rows_carry_offsets(spec: PipelineSpec, table: Any) -> None:
    """Refuse when some rows lack their source offset (written before ``format.metadata`` was set): a
    replay could not find them and would add their records a second time. Uses file metrics only."""
    if table.current_snapshot() is None:
        return
    offset_col = metadata_columns(spec)[2]
    try:
        field_id = table.schema().find_field(offset_col).field_id
    except ValueError:
        raise ConfigError(f"format.metadata: the table has no {offset_col} column yet: its rows cannot be matched "
                          "to offsets") from None
    missing = 0
    for task in table.scan(selected_fields=(offset_col.split(".")[0],)).plan_files():
        counts = task.file.null_value_counts or {}
        missing += int(counts.get(field_id, 0)) if field_id in counts else task.file.record_count
    if missing:
        raise ConfigError(f"format.metadata: {missing} rows of {spec.table.identifier} have no {offset_col} (written "
                          "before format.metadata was set); a replay cannot match them to offsets and would add their "
                          "records again")


def preview(spec: PipelineSpec, table: Any, ranges: list[PartitionRange], mode: str) -> list[dict[str, Any]]:
    """Per partition: offsets in the range, rows now from it, rows to delete and (at most) to add."""
    import pyarrow.compute as pc

    present = present_offsets(spec, table, ranges)
    out = []
    for r in ranges:
        mask = pc.and_(pc.equal(present.column("topic"), r.topic), pc.equal(present.column("partition"), r.partition))
        now = int(pc.sum(mask.cast("int64")).as_py() or 0)
        distinct = len(pc.unique(present.column("offset").filter(mask))) if now else 0
        out.append({"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end, "offsets": r.size,
                    "rows_now": now, "rows_to_delete": now if mode == "replace" else 0,
                    "rows_to_add_at_most": r.size if mode == "replace" else r.size - distinct})
    return out


def describe(row: dict[str, Any]) -> str:
    """One preview row as people read it (logs, the CLI, the replay DAG)."""
    return (f"{row['topic']}[{row['partition']}] [{row['start']}, {row['end']}): {row['offsets']} offsets; rows now "
            f"{row['rows_now']}, to delete {row['rows_to_delete']}, to add at most {row['rows_to_add_at_most']}")


def stage_replay_plan(spec: PipelineSpec, ranges: list[PartitionRange], mode: str, committed: Offsets,
                      snapshot_id: int | None, table: Any, data_interval: tuple[str, str] | None = None,
                      batch_id: str | None = None) -> tuple[BatchPlan, Path]:
    """Write a replay plan (and, for append-missing, the offsets already present) to the staging dir."""
    import pyarrow.parquet as pq

    bid = batch_id or "replay-" + new_batch_id()
    directory = batch_dir(spec.staging_dir(), spec.name, bid)
    exclude = None
    if mode == "append-missing":
        directory.mkdir(parents=True, exist_ok=True)
        exclude = str(directory / PRESENT_NAME)
        pq.write_table(present_offsets(spec, table, ranges), exclude)
    plan = BatchPlan(batch_id=bid, pipeline=spec.name, table=spec.table.identifier, pipeline_path=str(spec.source_path),
                     ranges=tuple(ranges), base_offsets=committed, created_at=utc_now_iso(), base_snapshot_id=snapshot_id,
                     mode=mode, exclude_path=exclude, data_interval=data_interval)
    from tidewater.pipeline import PLAN_NAME

    path = directory / PLAN_NAME
    write_json_atomic(path, plan.to_json())
    return plan, path


def plan_replay(spec: PipelineSpec, req: ReplayRequest, lookup: OffsetLookup | None = None
                ) -> tuple[BatchPlan | None, Path | None, list[dict[str, Any]]]:
    """Check and plan a replay. Returns (plan, path, preview); plan and path are None for a dry run or
    when the request selects no committed records."""
    from tidewater.catalog import load_catalog, load_table
    from tidewater.kafka_source import kafka_settings
    from tidewater.offsets import committed_state

    check_request(spec, req)
    table = load_table(load_catalog(spec), spec.table.identifier)
    if table is None:
        raise ConfigError(f"table {spec.table.identifier} does not exist yet: nothing to replay")
    check_rows_carry_offsets(spec, table)
    state = committed_state(table, spec.table.branch)
    ranges = resolve_ranges(spec, req, state.offsets, kafka_settings(spec), lookup)
    shown = preview(spec, table, ranges, req.mode)
    for row in shown:
        log.info("replay %s: %s", req.mode, describe(row))
    if req.dry_run or not ranges:
        return None, None, shown
    plan, path = stage_replay_plan(spec, ranges, req.mode, state.offsets, state.snapshot_id, table)
    return plan, path, shown


def commit_replay(catalog: Any, spec: PipelineSpec, plan: BatchPlan, manifest: Any, dag_run_id: str | None = None,
                  validation: dict[str, Any] | None = None, max_attempts: int = 8) -> Any:
    """One atomic commit: (replace) delete the rows from the plan's ranges, append the re-read rows.

    The snapshots carry the table's committed offsets unchanged and the replay's batch id, so a
    retry after success is a no-op and the offsets never move backwards (or forwards).
    """
    from tidewater.catalog import load_table
    from tidewater.committing import CommitResult, _fast_append_tx, _without_commit_retries, check_manifest, failed_attempt
    from tidewater.errors import TransientError
    from tidewater.offsets import BATCH_ID, REPLAY, committed_state, find_batch_snapshot, summary_properties

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


def run_replay(spec: PipelineSpec, req: ReplayRequest, master: str | None = None, out: Any = print,
               lookup: OffsetLookup | None = None, inline: bool = False) -> dict[str, Any]:
    """Plan, write (spark-submit, or in this process with ``inline``), validate and commit a replay."""
    from tidewater.pipeline import commit_step, manifest_path, run_write_step, validate_step

    say = out or (lambda _s: None)
    plan, path, shown = plan_replay(spec, req, lookup)
    for row in shown:
        say(describe(row))
    if plan is None or path is None:
        say("dry run: nothing changed" if req.dry_run else "nothing to replay: the request selects no committed records")
        return {"status": "dry-run" if req.dry_run else "empty", "preview": shown}
    if inline:
        from tidewater.kafka_source import kafka_settings
        from tidewater.spark_job import run_inline

        manifest = run_inline(plan, spec, kafka_settings(spec))
        write_json_atomic(manifest_path(path), manifest.to_json())
    else:
        manifest = run_write_step(spec, path, master=master)
    validate_step(spec, plan, manifest)
    result = commit_step(spec, plan, manifest)
    say(f"{result.status}: replay {plan.batch_id} ({plan.mode}), {manifest.rows_in_files} rows written"
        + (f", {manifest.present} already present" if manifest.present else ""))
    return {"status": result.status, "batch_id": plan.batch_id, "mode": plan.mode, "rows": manifest.rows_in_files,
            "already_present": manifest.present, "skipped": manifest.skipped, "preview": shown}


def committed_intervals(table: Any) -> dict[str, list[list[Any]]]:
    """Data interval ("start/end") -> ranges, from the ingest batches the table's history records."""
    from tidewater.offsets import DATA_INTERVAL, RANGES, REPLAY, summary_dict

    out: dict[str, list[list[Any]]] = {}
    for snap in table.metadata.snapshots:
        props = summary_dict(snap)
        if DATA_INTERVAL in props and RANGES in props and REPLAY not in props:
            out.setdefault(props[DATA_INTERVAL], []).extend(json.loads(props[RANGES]))
    return out


def plan_backfill(spec: PipelineSpec, data_interval: tuple[str, str], reprocess: bool = False,
                  lookup: OffsetLookup | None = None) -> tuple[BatchPlan | None, Path | None]:
    """What an Airflow backfill run of the ingest DAG does for its data interval.

    - The interval was committed by an ingest batch (its ranges are in the snapshot summary): nothing,
      or with ``reprocess`` a ``replace`` replay of exactly those ranges.
    - It was never ingested: the interval is mapped to offsets with Kafka's timestamp lookup, clipped to
      the committed offsets (later records are the scheduled batches'), and replayed with
      ``append-missing`` (``replace`` with ``reprocess``).
    """
    from tidewater.catalog import load_catalog, load_table
    from tidewater.kafka_source import kafka_settings, list_partitions, resolve_topics
    from tidewater.offsets import committed_state

    key = "/".join(data_interval)
    table = load_table(load_catalog(spec), spec.table.identifier) if not spec.routed else None
    if spec.routed:
        raise ConfigError("backfill: pipelines that route to several tables cannot be backfilled yet")
    if table is None:
        log.info("backfill %s: the table does not exist yet; the scheduled runs ingest from the log start", key)
        return None, None
    state = committed_state(table, spec.table.branch)
    known = committed_intervals(table)
    if key in known:
        if not reprocess:
            log.info("backfill %s: already committed (ranges %s); nothing to do (set reprocess to re-ingest it)", key, known[key])
            return None, None
        ranges = [PartitionRange(t, int(p), int(s), int(e)) for t, p, s, e in known[key] if int(e) > int(s)]
        mode = "replace"
    else:
        settings = kafka_settings(spec)
        lookup = lookup or KafkaOffsetLookup(settings)
        start_ms, end_ms = parse_time(data_interval[0], "data_interval_start"), parse_time(data_interval[1], "data_interval_end")
        ranges = []
        parts = list_partitions(settings, resolve_topics(settings, spec))
        for topic in sorted({t for t, _ in parts}):
            partitions = [p for t, p in parts if t == topic]
            for p, (lo, hi) in sorted(interval_offsets(lookup, topic, partitions, start_ms, end_ms).items()):
                upto = state.offsets.get(topic, {}).get(p)
                if upto is not None and min(hi, upto) > lo:
                    ranges.append(PartitionRange(topic, p, lo, min(hi, upto)))
        mode = "replace" if reprocess else "append-missing"
        if not ranges:
            log.info("backfill %s: no committed records in the interval (later records are the scheduled runs' to ingest)", key)
            return None, None
    if spec.format.metadata == "none":
        raise ConfigError(f"format.metadata: the backfill of {key} needs rows that carry their source offsets "
                          "(format.metadata prefixed or struct)")
    check_rows_carry_offsets(spec, table)
    log.info("backfill %s: %s over %s", key, mode, ", ".join(f"{r.topic}[{r.partition}] [{r.start}, {r.end})" for r in ranges))
    return stage_replay_plan(spec, ranges, mode, state.offsets, state.snapshot_id, table, data_interval=data_interval,
                             batch_id="backfill-" + new_batch_id())
