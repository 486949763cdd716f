"""Configured conversions of decoded columns: date-time strings and epoch numbers into timestamps
(``format.timestamps``, ``format.timezone``).

Vectorized with Arrow compute; only when a chunk holds a value Arrow's ISO parser rejects does a
per-value Python parse run (error path). A value that cannot be converted makes its record a dead
letter (it is a record-level failure, not a batch failure). Results are UTC ``timestamptz`` columns;
naive date-times are read in ``format.timezone``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.compute as pc

from tidewater.config.sections.source import FormatSpec
from tidewater.decode.records import keep_mask

UTC_US = pa.timestamp("us", tz="UTC")


_ZONED = r"(Z|z|[+-]\d{2}(:?\d{2})?)$"


def source_type(fmt: str) -> pa.DataType:
    """The type the value decoder should produce for a column converted with ``fmt``."""
    if fmt == "epoch_millis":
        return pa.int64()
    if fmt == "epoch_seconds":
        return pa.float64()
    return pa.string()


def decoder_schema(schema: pa.Schema | None, spec_format: FormatSpec) -> pa.Schema | None:
    """The table schema as the decoder must see it: converted columns (also inside structs: `a.b`) in
    their source type."""
    if schema is None or not spec_format.timestamps:
        return schema

    def walk(fields: Any, prefix: str) -> list[pa.Field]:
        out = []
        for f in fields:
            path = prefix + f.name
            if path in spec_format.timestamps:
                out.append(pa.field(f.name, source_type(spec_format.timestamps[path])))
            elif pa.types.is_struct(f.type) and any(k.startswith(path + ".") for k in spec_format.timestamps):
                out.append(pa.field(f.name, pa.struct(walk(list(f.type), path + "."))))
            else:
                out.append(f)
        return out

    return pa.schema(walk(list(schema), ""))


def _get(table: pa.Table, path: str) -> pa.Array | None:
    names = path.split(".")
    if names[0] not in table.column_names:
        return None
    arr: Any = table.column(names[0]).combine_chunks()
    valid = None
    for name in names[1:]:
        if not pa.types.is_struct(arr.type) or arr.type.get_field_index(name) < 0:
            return None
        valid = pc.is_valid(arr) if valid is None else pc.and_(valid, pc.is_valid(arr))
        arr = arr.field(arr.type.get_field_index(name))
    # a child of a null parent counts as null (its stored value is meaningless)
    return arr if valid is None else pc.if_else(valid, arr, pa.scalar(None, arr.type))


def _set(table: pa.Table, path: str, new: pa.Array) -> pa.Table:
    names = path.split(".")

    def rebuild(arr: Any, rest: list[str]) -> Any:
        if not rest:
            return new
        i = arr.type.get_field_index(rest[0])
        children = [arr.field(j) for j in range(arr.type.num_fields)]
        children[i] = rebuild(children[i], rest[1:])
        return pa.StructArray.from_arrays(children, names=[f.name for f in arr.type], mask=pc.is_null(arr) if arr.null_count else None)

    top = table.column(names[0]).combine_chunks()
    return table.set_column(table.column_names.index(names[0]), names[0], rebuild(top, names[1:]))


def _localize(naive: Any, tz: str) -> Any:
    if tz == "UTC":
        return naive.cast(UTC_US)
    return pc.assume_timezone(naive, tz, ambiguous="earliest", nonexistent="earliest").cast(UTC_US)


def _iso(col: pa.Array, tz: str) -> pa.Array:
    zoned = pc.fill_null(pc.match_substring_regex(col, _ZONED), False)
    try:
        aware = pc.if_else(zoned, col, pa.scalar(None, pa.string())).cast(UTC_US)
        naive = _localize(pc.if_else(zoned, pa.scalar(None, pa.string()), col).cast(pa.timestamp("us")), tz)
        return pc.if_else(zoned, aware, naive)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    # Error path: parse value by value so only the bad ones fail.

    zone = ZoneInfo(tz)
    out: list[datetime | None] = []
    for v in col.to_pylist():
        if v is None:
            out.append(None)
            continue
        try:
            d = datetime.fromisoformat(v.replace("z", "Z"))
        except ValueError:
            out.append(None)
            continue
        out.append((d if d.tzinfo else d.replace(tzinfo=zone)).astimezone(timezone.utc))
    return pa.array(out, UTC_US)


def convert(col: pa.Array, fmt: str, tz: str) -> pa.Array:
    """Convert one column; values that cannot be converted become null (the caller checks)."""
    if pa.types.is_timestamp(col.type):  # already typed (Avro logical types, table types)
        return col.cast(UTC_US) if col.type.tz else _localize(col, tz)
    if pa.types.is_null(col.type):
        return pa.nulls(len(col), UTC_US)
    if fmt == "epoch_millis":
        return pc.multiply(col.cast(pa.int64()), 1000).cast(UTC_US)
    if fmt == "epoch_seconds":
        return pc.round(pc.multiply(col.cast(pa.float64()), 1_000_000)).cast(pa.int64()).cast(UTC_US)
    text = col.cast(pa.string())
    if fmt == "iso8601":
        return _iso(text, tz)
    parsed = pc.strptime(text, format=fmt, unit="us", error_is_null=True)
    return parsed.cast(UTC_US) if "%z" in fmt else _localize(parsed, tz)


def apply(table: pa.Table, spec_format: FormatSpec) -> tuple[pa.Table, list[tuple[int, str]]]:
    """Convert the configured columns (top-level, or inside structs as `a.b`). Returns the table without the
    rows that failed, and the failed rows' positions (in ``table``) with a message naming the column, the value and the format."""
    if not spec_format.timestamps or table.num_rows == 0:
        return table, []
    failed: dict[int, str] = {}
    for name, fmt in spec_format.timestamps.items():
        col = _get(table, name)
        if col is None:
            continue
        new = convert(col, fmt, spec_format.timezone)
        lost = pc.and_(pc.is_valid(col), pc.is_null(new))
        if pc.any(lost).as_py():
            originals = col.to_pylist()
            for r in pc.indices_nonzero(lost).to_pylist():
                failed.setdefault(r, f"column {name!r}: {originals[r]!r} is not a date-time in format {fmt!r}")
        table = _set(table, name, new)
    if failed:
        table = table.filter(keep_mask(table.num_rows, list(failed)))
    return table, sorted(failed.items())
