"""Debezium change-event envelopes (JSON with or without a schema): the row image (``after``, or ``before`` for deletes) plus ``_op``."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tidewater.decode.connect import decode_connect, failures_where, first_schema, flatten
from tidewater.decode.json import decode_json_lenient
from tidewater.decode.records import BadRecord, DecodeContext
from tidewater.source.kafka import Chunk

OPS = ("c", "u", "d", "r", "t")  # t: a truncate (no image): applied or set apart by table.truncate


def decode_debezium(
    chunk: Chunk, explicit: pa.Schema | None, allow_non_numeric: bool = False, keep_source: bool = False
) -> tuple[pa.Table, list[BadRecord]]:
    """Debezium change events (plain JSON or inside a Connect envelope): the row image plus ``_op``.

    ``after`` for c/u/r, ``before`` for d. Tombstones (null values after a delete) come back as bad
    records of class ``Tombstone``: the caller counts them as skipped (they carry no row).
    """
    enveloped = first_schema(chunk) is not None
    if enveloped:
        outer, bad = decode_connect(chunk, None, allow_non_numeric)
    else:
        outer, bad = decode_json_lenient(chunk, None, allow_non_numeric=allow_non_numeric)
    return unwrap(outer, bad, len(chunk), explicit, keep_source)


SOURCE_COLUMN = "__debezium_source"  # the envelope's source block, for routing only (never written to a table)


def unwrap(
    outer: pa.Table, bad: list[BadRecord], n: int, explicit: pa.Schema | None, keep_source: bool = False
) -> tuple[pa.Table, list[BadRecord]]:
    """Decoded envelopes (``op``, ``before``, ``after`` columns; ``bad`` already set apart from the ``n``
    records) to the row image plus ``_op``, whatever the envelopes were encoded in (JSON, Avro). ``keep_source``:
    the envelope's ``source`` block too, as the column ``SOURCE_COLUMN`` (the router reads and drops it)."""
    if "op" not in outer.column_names:
        outer = outer.append_column("op", pa.nulls(outer.num_rows, pa.string()))
    op = outer.column("op").cast(pa.string())
    valid = pc.fill_null(pc.is_in(op, value_set=pa.array(OPS)), False)
    failures, rest = control_events(n, bad, outer, pc.invert(valid))
    failures += failures_where(n, bad, rest, "NotDebezium", f"`op` is not one of {', '.join(OPS)}")
    outer = outer.filter(valid)
    op = op.filter(valid)
    before = outer.column("before") if "before" in outer.column_names else None
    after = outer.column("after") if "after" in outer.column_names else None
    before, after = _same_type(before, after)
    if after is None and before is None:
        image = pa.table({})
    elif before is None:
        image = flatten(after)
    elif after is None:
        image = flatten(before)
    else:
        picked = pc.if_else(pc.equal(op, "d"), _whole(before), _whole(after))
        image = flatten(picked)
    if explicit is not None:
        want = {f.name: f.type for f in explicit}
        for i, name in enumerate(image.column_names):
            if name in want and image.column(i).type != want[name]:
                try:
                    image = image.set_column(i, name, image.column(i).cast(want[name]))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    pass  # the writer's cast names the column if it really cannot be converted
    image = image.append_column("_op", op)
    if keep_source:
        source = outer.column("source") if "source" in outer.column_names else pa.nulls(outer.num_rows)
        image = image.append_column(SOURCE_COLUMN, source)
    return image, sorted(bad + failures, key=lambda b: b.index)


SCHEMA_CHANGE, HEARTBEAT = "SchemaChange", "Heartbeat"  # skipped with format.skip_control_events (config/formats.py)
_SCHEMA_FIELDS = ("ddl", "tableChanges", "historyRecord")


def control_events(n: int, bad: list[BadRecord], outer: pa.Table, not_change: Any) -> tuple[list[BadRecord], Any]:
    """Among the records that are not change events (``not_change``), Debezium's own: schema-change events (a
    `ddl` / `tableChanges` / `historyRecord` field: the connector's schema change topic) and heartbeats (`ts_ms`
    and nothing else: its heartbeat topic). They are named, so a pattern that picks up those topics is refused
    record by record with the reason (or skipped, `format.skip_control_events`). Returns (their bad records, the
    mask of the other records that are not change events)."""
    names = outer.column_names
    present = [pc.is_valid(outer.column(c)) for c in _SCHEMA_FIELDS if c in names]
    schema = pc.and_(not_change, _any(present, outer.num_rows))
    images = [pc.is_valid(outer.column(c)) for c in ("before", "after") if c in names]
    heartbeat = pc.and_(pc.and_(not_change, pc.invert(schema)), pc.invert(_any(images, outer.num_rows)))
    if "ts_ms" in names:
        heartbeat = pc.and_(heartbeat, pc.is_valid(outer.column("ts_ms")))
    else:
        heartbeat = pc.and_(heartbeat, pa.repeat(False, outer.num_rows))
    out = failures_where(
        n,
        bad,
        schema,
        SCHEMA_CHANGE,
        "a Debezium schema-change event, not a row change: leave the "
        "connector's schema change topic out of `topics` / `topic_pattern`, or set "
        "format.skip_control_events: true",
    )
    out += failures_where(
        n,
        bad,
        heartbeat,
        HEARTBEAT,
        "a Debezium heartbeat, not a row change: leave the heartbeat "
        "topic out of `topics` / `topic_pattern`, or set format.skip_control_events: true",
    )
    return out, pc.and_(not_change, pc.invert(pc.or_(schema, heartbeat)))


def _any(masks: list[Any], n: int) -> Any:
    out = pa.repeat(False, n)
    for m in masks:
        out = pc.or_(out, pc.fill_null(m, False))
    return out


def _same_type(before: Any, after: Any) -> tuple[Any, Any]:
    """Before and after images as one struct type (an all-null image takes the other's type)."""

    def null_only(c: Any) -> bool:
        return c is None or pa.types.is_null(c.type)

    if null_only(before) and null_only(after):
        return None, None
    if null_only(before):
        return (pa.nulls(len(after), after.type) if before is not None else None), after
    if null_only(after):
        return before, (pa.nulls(len(before), before.type) if after is not None else None)
    if before.type != after.type:
        merged = pa.unify_schemas([pa.schema(list(before.type)), pa.schema(list(after.type))], promote_options="permissive")
        t = pa.struct(list(merged))
        return _cast_struct(before, t), _cast_struct(after, t)
    return before, after


def _whole(col: Any) -> pa.Array:
    """One array of a column (a decoded column is chunked; a cast image, see ``_same_type``, is not)."""
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _cast_struct(col: Any, t: pa.StructType) -> Any:
    arr = _whole(col)
    children = []
    for f in t:
        idx = arr.type.get_field_index(f.name)
        children.append(arr.field(idx).cast(f.type) if idx >= 0 else pa.nulls(len(arr), f.type))
    return pa.StructArray.from_arrays(children, fields=list(t), mask=arr.is_null())


def decode(chunk: Chunk, ctx: DecodeContext) -> tuple[pa.Table, list[BadRecord]]:
    """Registry entry for ``debezium``."""
    return decode_debezium(chunk, ctx.explicit, ctx.allow_non_numeric, ctx.keep_source)
