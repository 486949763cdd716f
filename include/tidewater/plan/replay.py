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

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from tidewater.batch import PLAN_NAME, BatchPlan, Mode, Offsets, PartitionRange, batch_dir, write_json_atomic
from tidewater.config.spec import PipelineSpec
from tidewater.config.times import parse_time
from tidewater.errors import ConfigError
from tidewater.source.kafka import kafka_settings, list_partitions, resolve_topics, watermarks
from tidewater.source.timestamps import KafkaOffsetLookup, OffsetLookup, interval_offsets
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.provenance import check_rows_carry_offsets, present_offsets
from tidewater.table.targets import holder_state, target_role, target_spec, target_tables

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)


MODES = tuple(m.value for m in (Mode.REPLACE, Mode.APPEND_MISSING, Mode.REAPPLY))


@dataclass(frozen=True)
class ReplayRequest:
    """What a person asks to replay (the replay DAG's form, or `tidewater replay`)."""

    topic: str
    partitions: tuple[int, ...] = ()  # empty: every partition of the topic
    start_offset: int | None = None
    end_offset: int | None = None  # exclusive
    start_time: str | None = None  # ISO-8601; naive times are UTC
    end_time: str | None = None  # exclusive
    mode: Mode = Mode.REPLACE
    dry_run: bool = False
    tables: tuple[str, ...] = ()  # only these target tables of a routed pipeline (empty: every table)

    def __post_init__(self) -> None:
        if self.mode not in MODES:  # a form's or a caller's mode name; check_request says which the pipeline takes
            raise ConfigError(f"mode: {self.mode!r} is not one of {', '.join(MODES)}")
        object.__setattr__(self, "mode", Mode(self.mode))

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
            mode=params.get("mode") or Mode.REPLACE,
            dry_run=bool(params.get("dry_run")),
            tables=_names(params.get("tables")),
        )


def _names(value: Any) -> tuple[str, ...]:
    """Table names from a form's list or a comma-separated string."""
    items = value.split(",") if isinstance(value, str) else (value or [])
    return tuple(sorted({str(v).strip() for v in items if str(v).strip()}))


def check_request(spec: PipelineSpec, req: ReplayRequest) -> None:
    """Checks that need no broker. Raises ConfigError naming the parameter or setting."""
    if req.tables and spec.targets.fused:
        raise ConfigError(f"tables: pipeline {spec.name} writes one table ({spec.table.identifier}); leave tables empty")
    if spec.format.metadata == "none":
        raise ConfigError(
            "format.metadata: replay needs the source of every row: set format.metadata to prefixed or "
            "struct (rows written before that cannot be matched to their offsets)"
        )
    if req.mode not in spec.replay_modes:  # one of MODES: ReplayRequest refuses any other when it is made
        raise ConfigError(
            "mode: a change table (table.upsert / op_field) is replayed with mode reapply (each change is "
            "applied again where it is still its key's latest)"
            if spec.applies_changes
            else "mode: reapply is for change tables (table.upsert / op_field); use replace or append-missing"
        )
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


def resolve_ranges(
    spec: PipelineSpec, req: ReplayRequest, committed: Offsets, settings: dict[str, str], lookup: OffsetLookup | None = None
) -> list[PartitionRange]:
    """The offset ranges of a request, checked against the log and the committed offsets.

    By offset: a range beyond the committed offset is an error (those records are the scheduled
    batches' to ingest). By time: the ranges are clipped to the committed offsets.
    """
    if req.topic not in resolve_topics(settings, spec):
        raise ConfigError(f"topic: {req.topic!r} is not one of the pipeline's topics")
    available = [p for t, p in list_partitions(settings, [req.topic])]
    partitions = list(req.partitions) or available
    unknown = sorted(set(partitions) - set(available))
    if unknown:
        raise ConfigError(f"partitions: {unknown} do not exist in topic {req.topic} (it has {len(available)})")
    marks = watermarks(settings, [(req.topic, p) for p in partitions])
    done = committed.get(req.topic, {})
    bounds: dict[int, tuple[int, int]]
    if req.start_offset is not None and req.end_offset is not None:  # check_request: both or neither
        bounds = {p: (req.start_offset, req.end_offset) for p in partitions}
    else:
        lookup = lookup or KafkaOffsetLookup(settings)
        bounds = interval_offsets(
            lookup, req.topic, partitions, parse_time(req.start_time or "", "start_time"), parse_time(req.end_time or "", "end_time")
        )
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
                raise ConfigError(
                    f"end_offset: {end} is beyond the committed offset {upto} of {req.topic}[{p}]; "
                    "the scheduled batches ingest records from there"
                )
        start, end = max(start, low), min(end, upto)
        if end > start:
            out.append(PartitionRange(req.topic, p, start, end))
    return out


def preview(
    spec: PipelineSpec, table: Any, ranges: list[PartitionRange], mode: Mode, table_name: str | None = None
) -> list[dict[str, Any]]:
    """Per partition: offsets in the range, rows now from it, rows to delete and (at most) to add."""
    present = present_offsets(spec, table, ranges)
    out = []
    for r in ranges:
        mask = pc.and_(pc.equal(present.column("topic"), r.topic), pc.equal(present.column("partition"), r.partition))
        now = int(pc.sum(mask.cast("int64")).as_py() or 0)
        distinct = len(pc.unique(present.column("offset").filter(mask))) if now else 0
        reapply = mode == "reapply"  # rows_now: rows whose latest change is in the range; at most those change
        out.append(
            {
                "topic": r.topic,
                "partition": r.partition,
                "start": r.start,
                "end": r.end,
                "offsets": r.size,
                "rows_now": now,
                "rows_to_delete": now if mode == "replace" else 0,
                "rows_to_add_at_most": r.size if mode in ("replace", "reapply") else r.size - distinct,
                **({"mode": mode} if reapply else {}),
                **({"table": table_name} if table_name else {}),
            }
        )
    return out


def describe(row: dict[str, Any]) -> str:
    """One preview row as people read it (logs, the CLI, the replay DAG)."""
    where = f"{row['table']}: " if row.get("table") else ""
    if row.get("mode") == "reapply":
        return (
            f"{where}{row['topic']}[{row['partition']}] [{row['start']}, {row['end']}): {row['offsets']} changes to "
            f"re-read; {row['rows_now']} rows were written by them; each change is applied again only where it is "
            "still its key's latest (a healthy table stays unchanged)"
        )
    return (
        f"{where}{row['topic']}[{row['partition']}] [{row['start']}, {row['end']}): {row['offsets']} offsets; rows "
        f"now {row['rows_now']}, to delete {row['rows_to_delete']}, to add at most {row['rows_to_add_at_most']}"
    )


def stage_replay_plan(
    spec: PipelineSpec,
    ranges: list[PartitionRange],
    mode: Mode,
    committed: Offsets,
    snapshot_id: int | None,
    data_interval: tuple[str, str] | None = None,
    batch_id: str | None = None,
    tables: tuple[str, ...] = (),
) -> tuple[BatchPlan, Any]:
    """Write a replay plan to the staging area. Routed pipelines: ``tables`` the target tables asked for (empty: all).
    An append-missing replay's write step asks each table which offsets it already holds (``TableSink.held``)."""
    bid = batch_id or mode.new_batch_id()  # the staging directory's name, before the plan
    directory = batch_dir(spec.staging_dir(), spec.name, bid)
    plan = BatchPlan.new(spec, ranges, committed, snapshot_id, mode, batch_id=bid, data_interval=data_interval, tables=tables)

    path = directory / PLAN_NAME
    write_json_atomic(path, plan.to_json())
    return plan, path


def plan_replay(
    spec: PipelineSpec, req: ReplayRequest, lookup: OffsetLookup | None = None, log_preview: bool = True
) -> tuple[BatchPlan | None, Path | None, list[dict[str, Any]]]:
    """Check and plan a replay: its ranges are checked against the holder's committed offsets, and previewed per
    target table and partition (each table keeps its own offsets). Returns (plan, path, preview); plan and path
    are None for a dry run or when the request selects no committed records. ``log_preview``: log each preview
    row (the DAG's task log); a caller that prints the preview itself turns it off."""
    check_request(spec, req)
    catalog = load_catalog(spec)
    holder, state = holder_state(catalog, spec)
    if holder is None or state is None or state.snapshot_id is None:
        raise ConfigError(f"pipeline {spec.name} has committed no batch yet ({spec.targets.holder}): nothing to replay")
    ranges = resolve_ranges(spec, req, state.offsets, kafka_settings(spec), lookup)
    tables = replay_tables(spec, catalog, req.tables, holder)
    shown = replay_preview(spec, tables, ranges, req.mode, bool(req.tables))
    for row in shown if log_preview else ():
        log.info("replay %s: %s", req.mode, describe(row))
    if req.dry_run or not ranges:
        return None, None, shown
    plan, path = stage_replay_plan(spec, ranges, req.mode, state.offsets, state.snapshot_id, tables=req.tables)
    return plan, path, shown


def replay_tables(spec: PipelineSpec, catalog: Catalog, asked: tuple[str, ...], holder: Any) -> dict[str, Any]:
    """The target tables a replay looks at (``asked``, else every target table of the pipeline), loaded; each must
    be a target table that exists and whose rows carry their source offsets."""
    known = target_tables(catalog, spec, holder)
    unknown = sorted(set(asked) - set(known))
    if unknown:
        raise ConfigError(
            f"tables: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a target table of "
            f"pipeline {spec.name} (its tables: {', '.join(known) or 'none yet'})"
        )
    out = {}
    for ident in asked or known:
        table = holder if target_role(spec, ident).holds_offsets else load_table(catalog, ident)
        if table is None:
            if asked:
                raise ConfigError(f"tables: {ident} does not exist yet: nothing to replay")
            continue
        check_rows_carry_offsets(target_spec(spec, ident), table)
        out[ident] = table
    return out


def replay_preview(
    spec: PipelineSpec, tables: dict[str, Any], ranges: list[PartitionRange], mode: Mode, asked: bool
) -> list[dict[str, Any]]:
    """Per target table and partition (see ``preview``), each with the mode the table gets. Tables of a separate
    holder are named, and without ``asked`` tables only those holding rows from the ranges are shown (records
    re-read may also route elsewhere); a fused set's one table is always shown."""
    shown = []
    for ident, table in sorted(tables.items()):
        view = target_spec(spec, ident)
        own = target_role(spec, ident).holds_offsets  # the pipeline's own table: shown always, unnamed
        rows = preview(view, table, ranges, mode.for_table(view.applies_changes), table_name=None if own else ident)
        if own or asked or any(r["rows_now"] for r in rows):
            shown.extend(rows)
    return shown
