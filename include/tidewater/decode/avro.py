"""Avro values in the Confluent wire format (magic byte 0, 4-byte big-endian schema id, Avro body),
with writer schemas fetched from a schema registry by id and cached for the task's life.

Avro has no vectorized decoder: each record is read by fastavro in Python (the one per-record step
in Tidewater; its cost is measured in BENCHMARKS.md). Records of several schema ids in one chunk
land together under the union of their schemas (fields added by evolution are null in older records).
"""

from __future__ import annotations

import io
import logging
from typing import Any

import numpy as np
import pyarrow as pa

from tidewater.decode.arrow_types import Rebuilt, rebuilt_schema, rebuilt_type
from tidewater.decode.framed import Part, SchemaGroup, by_schema_id
from tidewater.decode.records import BadRecord, DecodeContext, in_chunk_order
from tidewater.decode.registry_client import RegistryClient
from tidewater.errors import TerminalError
from tidewater.source.kafka import Chunk

log = logging.getLogger(__name__)


# ---- Avro schema -> Arrow type -------------------------------------------------------------------


def _branches(schema: list[Any]) -> list[Any]:
    return [b for b in schema if b != "null"]


_PRIMITIVES = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}


def arrow_type(schema: Any, named: dict[str, pa.DataType] | None = None, namespace: str = "") -> pa.DataType:
    """The Arrow type of an Avro schema, as Spark's Avro reader maps it. A union of ``null`` and one type is
    that type (nullable); a union of several types is a struct with one field per branch (``member0``,
    ``member1``, ...; the branch a value took is set, the others null). ``timestamp-nanos`` arrives in
    nanoseconds and is stored in microseconds (Iceberg v2 has no nanosecond timestamps; see ``to_micros``).
    A reference to a named type defined earlier (Debezium's ``after`` refers to ``before``'s record) is that
    type (``named``: full and short names seen so far)."""
    named = {} if named is None else named
    if isinstance(schema, list):
        branches = _branches(schema)
        if len(branches) == 1:
            return arrow_type(branches[0], named, namespace)
        return pa.struct([pa.field(f"member{i}", arrow_type(b, named, namespace)) for i, b in enumerate(branches)])
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        return named.get(schema) or named.get(f"{namespace}.{schema}") or pa.string()
    if schema.get("type") in ("record", "enum", "fixed"):
        name = str(schema.get("name", ""))
        ns = schema.get("namespace", namespace) if "." not in name else name.rsplit(".", 1)[0]
        t = _complex_type(schema, named, ns)
        for key in (name, name.rsplit(".", 1)[-1], f"{ns}.{name.rsplit('.', 1)[-1]}" if ns else name):
            named.setdefault(key, t)
        return t
    return _complex_type(schema, named, namespace)


def _complex_type(schema: dict, named: dict[str, pa.DataType], namespace: str) -> pa.DataType:
    t = schema.get("type")
    logical = schema.get("logicalType")
    logical_types = {
        "timestamp-millis": pa.timestamp("us", tz="UTC"),
        "timestamp-micros": pa.timestamp("us", tz="UTC"),
        "timestamp-nanos": pa.timestamp("ns", tz="UTC"),
        "local-timestamp-millis": pa.timestamp("us"),
        "local-timestamp-micros": pa.timestamp("us"),
        "local-timestamp-nanos": pa.timestamp("ns"),
        "time-millis": pa.time64("us"),
        "time-micros": pa.time64("us"),
        "date": pa.date32(),
        "uuid": pa.string(),
    }
    if logical in logical_types:
        return logical_types[logical]
    if logical == "decimal":
        return pa.decimal128(int(schema["precision"]), int(schema.get("scale", 0)))
    if t == "record":
        return pa.struct([pa.field(f["name"], arrow_type(f["type"], named, namespace)) for f in schema["fields"]])
    if t == "array":
        return pa.list_(arrow_type(schema["items"], named, namespace))
    if t == "map":
        return pa.map_(pa.string(), arrow_type(schema["values"], named, namespace))
    if t == "enum":
        return pa.string()
    if t == "fixed":
        return pa.binary()
    return arrow_type(t, named, namespace)


_PY_TYPES = {
    "boolean": bool,
    "int": int,
    "long": int,
    "float": float,
    "double": float,
    "string": str,
    "bytes": bytes,
    "enum": str,
    "fixed": bytes,
    "record": dict,
    "map": dict,
    "array": list,
}


def _kind(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        return str(schema.get("type"))
    return "union"


def union_converter(schema: Any) -> Any:
    """A function that turns a decoded value of ``schema`` into the shape ``arrow_type`` gives it (the
    multi-type unions as structs), or None when the schema has no such union (nothing to do).

    fastavro returns a union's value as it is, so its branch is found by its Python type (bool before int:
    a bool is an int in Python). Records only reach this path when their schema has such a union."""
    if isinstance(schema, list):
        branches = _branches(schema)
        if len(branches) == 1:
            return union_converter(branches[0])
        inner = [union_converter(b) for b in branches]

        def pick(v: Any) -> Any:
            if v is None:
                return None
            for i, b in enumerate(branches):
                py = _PY_TYPES.get(_kind(b))
                if py is not None and isinstance(v, py) and not (py is int and isinstance(v, bool)):
                    return {f"member{j}": ((inner[i](v) if inner[i] else v) if j == i else None) for j in range(len(branches))}
            return {f"member{j}": None for j in range(len(branches))}

        return pick
    if isinstance(schema, dict) and schema.get("type") == "record":
        fields = [(f["name"], union_converter(f["type"])) for f in schema["fields"]]
        if not any(c for _, c in fields):
            return None
        return lambda r: None if r is None else {n: (c(r.get(n)) if c else r.get(n)) for n, c in fields}
    if isinstance(schema, dict) and schema.get("type") in ("array", "map"):
        c = union_converter(schema["items"] if schema["type"] == "array" else schema["values"])
        if c is None:
            return None
        if schema["type"] == "array":
            return lambda xs: None if xs is None else [c(x) for x in xs]
        return lambda m: None if m is None else {k: c(x) for k, x in m.items()}
    if isinstance(schema, dict) and isinstance(schema.get("type"), (dict, list)):
        return union_converter(schema["type"])
    return None


class _Micros(Rebuilt):
    def primitive(self, t: pa.DataType) -> pa.DataType:
        return pa.timestamp("us", tz=t.tz) if pa.types.is_timestamp(t) and t.unit == "ns" else t


def to_micros(t: pa.DataType) -> pa.DataType:
    """``t`` with nanosecond timestamps at microsecond precision (nested types included)."""
    return rebuilt_type(t, _Micros())


def decode_avro(chunk: Chunk, registry: RegistryClient) -> tuple[pa.Table, list[BadRecord]]:
    """Decode Confluent-framed Avro values (the framing and the per-schema-id loop: ``decode/framed.py``). Unknown
    schema ids and unreadable bodies are bad records; an unreachable registry fails the batch (TransientError:
    nothing is committed, retrying is safe).

    Unlike the other registry formats, Avro's columns do not carry the schema id they were decoded with, and its
    schema ids' rows join under the union of their schemas with Arrow's permissive promotion (a long that became a
    double in a later version is a double), as they always did: what lands on disk stays the same."""
    import fastavro

    decoded: list[int] = []  # the schema ids with rows, for the error when they do not fit one table schema

    def rows_of(group: SchemaGroup, writer: Any, bad: dict[int, BadRecord]) -> list[Part]:
        sid = group.schema_id
        rows: list[Any] = []
        kept: list[int] = []
        for i, body in zip(group.at.tolist(), group.bodies.to_pylist(), strict=True):
            try:
                record = fastavro.schemaless_reader(io.BytesIO(body), writer, None)
            except Exception as e:  # noqa: BLE001 - fastavro's many kinds for a truncated or corrupt body: a dead letter
                bad[i] = BadRecord(i, "InvalidAvro", f"schema id {sid}: {type(e).__name__}: {e}")
                continue
            if not isinstance(record, dict):
                bad[i] = BadRecord(i, "InvalidAvro", f"schema id {sid} is not a record schema")
                continue
            rows.append(record)
            kept.append(i)
        if not rows:
            return []
        decoded.append(sid)
        convert = union_converter(writer)
        schema = pa.schema(list(arrow_type(writer)))
        try:
            table = pa.Table.from_pylist([convert(r) for r in rows] if convert else rows, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise _unfit(chunk, [sid], e) from e
        micros = rebuilt_schema(schema, _Micros())
        return [Part(table if micros == schema else table.cast(micros, safe=False), np.array(kept, dtype=np.int64), f"schema id {sid}")]

    def joined(parts: list[pa.Table], positions: list[np.ndarray], labels: list[str]) -> pa.Table:
        try:
            return in_chunk_order(parts, positions, labels, check=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise _unfit(chunk, sorted(decoded), e) from e

    return by_schema_id(chunk, "NotConfluentAvro", registry.schema, rows_of, mark=False, join=joined)


def _unfit(chunk: Chunk, schema_ids: list[int], e: Exception) -> TerminalError:
    return TerminalError(
        f"Avro records of schema ids {schema_ids} do not fit one table schema: {e}",
        topic=chunk.topic,
        partition=chunk.partition,
        offset=chunk.offsets[0],
    )


def decode(chunk: Chunk, ctx: DecodeContext) -> tuple[pa.Table, list[BadRecord]]:
    """Registry entry for ``avro`` (Confluent wire format; writer schemas from ``ctx.registry``)."""
    return decode_avro(chunk, ctx.registry)
