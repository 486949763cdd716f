"""Envelope formats on top of the JSON decoder: Kafka Connect JSON (``schema`` + ``payload``) and
Debezium change events (``before``, ``after``, ``op``, ``source``).

Both stay vectorized: the chunk is parsed once by Arrow's JSON reader (the Connect schema of the
chunk's first record gives the payload's declared types), then columns are picked and converted
with Arrow compute. Records whose envelope does not fit are set apart like any undecodable record.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tidewater.decode.json import decode_json_lenient
from tidewater.decode.records import BadRecord, DecodeContext, surviving
from tidewater.source.kafka import Chunk

TIMESTAMP = "org.apache.kafka.connect.data.Timestamp"


DATE = "org.apache.kafka.connect.data.Date"


_PRIMITIVES = {
    "int8": pa.int32(),
    "int16": pa.int32(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "bytes": pa.string(),  # base64 text in Connect JSON; kept as text
}


def connect_type(schema: dict[str, Any]) -> pa.DataType | None:
    """Arrow type the JSON reader should produce for a Connect schema (None: let the reader infer it)."""
    t = schema.get("type")
    if t == "struct":
        fields = []
        for f in schema.get("fields", []):
            ft = connect_type(f)
            if ft is not None:
                fields.append(pa.field(f["field"], ft))
        return pa.struct(fields)
    if t == "array":
        vt = connect_type(schema.get("items", {}))
        return pa.list_(vt) if vt is not None else None
    if t == "map":
        return None  # JSON objects with free keys: inferred
    return _PRIMITIVES.get(t) if isinstance(t, str) else None


def _logical_conversions(schema: dict[str, Any]) -> dict[str, str]:
    """Top-level payload fields with a Connect logical type we convert (Timestamp, Date)."""
    out = {}
    for f in schema.get("fields", []) if schema.get("type") == "struct" else []:
        if f.get("name") in (TIMESTAMP, DATE):
            out[f["field"]] = f["name"]
    return out


def _convert_logical(table: pa.Table, conversions: dict[str, str]) -> pa.Table:
    for name, logical in conversions.items():
        if name not in table.column_names:
            continue
        col = table.column(name)
        if logical == TIMESTAMP:
            new = pc.multiply(col.cast(pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC"))
        else:
            new = col.cast(pa.int32()).cast(pa.date32())
        table = table.set_column(table.column_names.index(name), name, new)
    return table


def first_schema(chunk: Chunk) -> dict[str, Any] | None:
    """The Connect schema of the chunk's first record that has one (one Python parse per chunk)."""
    for v in chunk.values:
        if not v:
            continue
        try:
            doc = json.loads(v)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("schema"), dict):
            return doc["schema"]
    return None


def flatten(struct_col: Any) -> pa.Table:
    arr = struct_col.combine_chunks() if isinstance(struct_col, pa.ChunkedArray) else struct_col
    if not pa.types.is_struct(arr.type):
        return pa.table({})
    return pa.Table.from_arrays(arr.flatten(), names=[f.name for f in arr.type])


def failures_where(n: int, bad: list[BadRecord], failing: Any, kind: str, message: str) -> list[BadRecord]:
    """Bad records for the decoded rows where ``failing`` is true (chunk indices worked out only then)."""
    rows = pc.indices_nonzero(pc.fill_null(failing, False)).to_pylist()
    if not rows:
        return []
    good = surviving(n, [b.index for b in bad])
    return [BadRecord(good[r], kind, message) for r in rows]


def all_failed(n: int, bad: list[BadRecord], kind: str, message: str) -> tuple[pa.Table, list[BadRecord]]:
    return pa.table({}), sorted(bad + [BadRecord(i, kind, message) for i in surviving(n, [b.index for b in bad])], key=lambda b: b.index)


_WIDENINGS = {(pa.int32(), pa.int64()), (pa.float32(), pa.float64())}


def _table_types_unless_wider(declared: pa.DataType, have: pa.DataType | None) -> pa.DataType:
    """The table's type for each declared field, except where the declared one widens it (int -> long,
    float -> double), recursively through structs."""
    if have is None:
        return declared
    if pa.types.is_struct(declared) and pa.types.is_struct(have):
        fields = []
        for f in declared:
            i = have.get_field_index(f.name)
            fields.append(pa.field(f.name, _table_types_unless_wider(f.type, have.field(i).type if i >= 0 else None)))
        return pa.struct(fields)
    if _family(have) != _family(declared):
        return declared  # a logical type (Timestamp, Date, Decimal) is read as declared, then converted
    return declared if (have, declared) in _WIDENINGS else have


def _family(t: pa.DataType) -> str:
    for name, test in (
        ("int", pa.types.is_integer),
        ("float", pa.types.is_floating),
        ("text", pa.types.is_string),
        ("bool", pa.types.is_boolean),
    ):
        if test(t):
            return name
    return str(t)


def decode_connect(chunk: Chunk, explicit: pa.Schema | None, allow_non_numeric: bool = False) -> tuple[pa.Table, list[BadRecord]]:
    """Kafka Connect JSON with schemas: rows are the payloads, typed by the declared schema."""
    schema = first_schema(chunk)
    declared = connect_type(schema) if schema else None
    envelope = pa.schema([pa.field("payload", declared)]) if isinstance(declared, pa.StructType) else None
    if explicit is not None and envelope is not None:
        # the table's types win for columns it already has, unless the declared type is wider (the table widens)
        envelope = pa.schema([pa.field("payload", _table_types_unless_wider(declared, pa.struct(list(explicit))))])
    parsed, bad = decode_json_lenient(chunk, envelope, allow_non_numeric=allow_non_numeric)
    if "payload" not in parsed.column_names:
        return all_failed(len(chunk), bad, "EnvelopeMissing", "no `payload` in the Connect JSON envelope")
    payload = parsed.column("payload")
    missing = pc.is_null(payload)
    failures = failures_where(len(chunk), bad, missing, "EnvelopeMissing", "`payload` is null or missing in the Connect JSON envelope")
    table = flatten(payload.filter(pc.invert(missing)))
    table = _convert_logical(table, _logical_conversions(schema or {}))
    return table, sorted(bad + failures, key=lambda b: b.index)


def decode(chunk: Chunk, ctx: DecodeContext) -> tuple[pa.Table, list[BadRecord]]:
    """Registry entry for ``connect_json``."""
    return decode_connect(chunk, ctx.explicit, ctx.allow_non_numeric)
