"""Changes keyed by the Kafka message key (`table.key_source: message_key`): the key's values become the
row's id columns, and a tombstone (null value) becomes a delete of its key.

Vectorized: keys that are JSON objects are parsed by the same Arrow JSON reader as values; otherwise, for
a single id column, the key bytes are the value (a JSON string's quotes removed), cast to the id column's
type. A key that cannot be read leaves the id empty, which the task sets apart as a ``MissingId`` dead letter.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidewater.config.sections.table import KEYED_OP
from tidewater.config.spec import PipelineSpec
from tidewater.decode.avro import decode_avro
from tidewater.decode.json import decode_json_lenient
from tidewater.decode.records import BadRecord, decoded_rows
from tidewater.source.kafka import Chunk

UPSERT, DELETE = "U", "D"


def _spread(parsed: pa.Table, bad: list[BadRecord], n: int, ids: list[str], types: dict[str, pa.DataType]) -> pa.Table:
    """Decoded keys (the records' fields; ``bad`` set apart) back to one row per record of the chunk."""
    rows = decoded_rows(n, [b.index for b in bad])
    cols = {}
    for c in ids:
        col = parsed.column(c).combine_chunks() if c in parsed.column_names else pa.nulls(parsed.num_rows)
        if c in types and col.type != types[c]:
            col = _cast_or_null(col, types[c])
        full = pa.nulls(n, col.type)
        cols[c] = pc.replace_with_mask(full, _at(n, rows), col) if len(rows) else full
    return pa.table(cols)


def _key_columns(chunk: Chunk, ids: list[str], types: dict[str, pa.DataType], registry: Any = None) -> pa.Table:
    """The id columns read from every record's key (chunk order; nulls where a key is missing or unreadable):
    Confluent-framed Avro records (with ``registry``, as Debezium's Avro converter writes keys), JSON objects,
    or for a single id column the key itself (a JSON scalar or plain text)."""
    n = len(chunk)
    keyed = Chunk(chunk.topic, chunk.partition, list(chunk.keys or [None] * n), chunk.offsets, chunk.timestamps)
    raw = pa.array(keyed.values, pa.binary())
    if registry is not None and pc.any(pc.fill_null(pc.starts_with(pc.cast(raw, pa.string(), safe=False), "\x00"), False)).as_py():
        parsed, bad = decode_avro(keyed, registry)
        return _spread(parsed, bad, n, ids, types)
    text = pc.cast(raw, pa.string(), safe=False)
    if pc.any(pc.fill_null(pc.starts_with(pc.utf8_ltrim_whitespace(text), "{"), False)).as_py():
        parsed, bad = decode_json_lenient(keyed, None)
        return _spread(parsed, bad, n, ids, types)
    if len(ids) != 1:
        return pa.table({c: pa.nulls(n, types.get(c, pa.string())) for c in ids})
    unquoted = pc.replace_substring_regex(text, pattern=r'^\s*"(.*)"\s*$', replacement=r"\1")
    want = types.get(ids[0])
    if want is None:  # no type known yet: integers when every key is one (as JSON would read them), else strings
        integral = pc.fill_null(pc.match_substring_regex(text, r"^-?\d{1,18}$"), True)
        want = pa.int64() if pc.all(integral).as_py() and text.null_count < len(text) else pa.string()
    return pa.table({ids[0]: _cast_or_null(unquoted, want)})


def _at(n: int, rows: Any) -> pa.Array:
    """A mask of length ``n`` true at ``rows``."""
    mask = np.zeros(n, dtype=bool)
    mask[np.asarray(rows)] = True
    return pa.array(mask)


def _cast_or_null(col: pa.Array, to: pa.DataType) -> pa.Array:
    """``col`` cast to ``to``; values that do not convert become null (their records become MissingId)."""
    try:
        return pc.cast(col, to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if not pa.types.is_string(col.type):
            col = pc.cast(col, pa.string())
        if pa.types.is_integer(to):
            ok = pc.fill_null(pc.match_substring_regex(col, r"^-?\d+$"), False)
        elif pa.types.is_floating(to):
            ok = pc.fill_null(pc.match_substring_regex(col, r"^-?\d+(\.\d*)?([eE][-+]?\d+)?$"), False)
        else:
            return pa.nulls(len(col), to)
        return pc.cast(pc.if_else(ok, col, pa.scalar(None, pa.string())), to)


def keyed_changes(
    spec: PipelineSpec,
    chunk: Chunk,
    decoded: pa.Table,
    bad: list[BadRecord],
    ignored: list[BadRecord],
    table_schema: pa.Schema | None = None,
    registry: Any = None,
) -> tuple[pa.Table, list[BadRecord], list[BadRecord]]:
    """Decoded rows with their id columns from the message key and an operation (`_op`: the record's own,
    else U), plus one delete row per tombstone; rows in chunk order. Returns (rows, bad, ignored) without
    the tombstones, which are rows now. ``table_schema``: the table's Arrow schema, whose id types win;
    ``registry``: the schema registry client, for Avro keys."""
    ids = list(spec.table.id_columns)
    n = len(chunk)
    tombstones = sorted(b.index for b in bad + ignored if b.error_class == "Tombstone")
    rows_at = decoded_rows(n, [b.index for b in bad + ignored])
    bad = [b for b in bad if b.error_class != "Tombstone"]
    ignored = [b for b in ignored if b.error_class != "Tombstone"]
    types = {f.name: f.type for f in (table_schema or []) if f.name in ids}  # the table's types win
    types.update({c: decoded.schema.field(c).type for c in ids if c in decoded.column_names and c not in types})
    keys = _key_columns(chunk, ids, types, registry)
    values = decoded
    for c in ids:
        col = keys.column(c).take(rows_at)
        values = values.set_column(values.column_names.index(c), c, col) if c in values.column_names else values.append_column(c, col)
    if KEYED_OP not in values.column_names:
        values = values.append_column(KEYED_OP, pa.repeat(UPSERT, values.num_rows))
    if not tombstones:
        return values, bad, ignored
    at = pa.array(tombstones, pa.int64())
    deletes = keys.take(at).append_column(KEYED_OP, pa.repeat(DELETE, len(tombstones)))
    both = pa.concat_tables(
        [values.append_column("__at", pc.cast(rows_at, pa.int64())), deletes.append_column("__at", at)], promote_options="permissive"
    )
    return both.sort_by("__at").drop_columns(["__at"]), bad, ignored


def key_field_names(chunk: Chunk, registry: Any = None) -> tuple[list[str], int | None]:
    """The field names of the chunk's first message key that has any (Debezium's key: the source table's primary
    key), read once per chunk: JSON with its schema (``{"schema": ..., "payload": {...}}``) or without, or a
    Confluent-framed Avro record (``registry``). Returns (names, offset of the key read), ``([], offset)`` when
    that key is not a record with fields, ``([], None)`` when no record has a key."""
    found = next(((k, chunk.offsets[i]) for i, k in enumerate(chunk.keys or []) if k), None)
    if found is None:
        return [], None
    key, offset = found
    if key[:1] == b"\x00" and registry is not None:
        parsed, bad = decode_avro(Chunk(chunk.topic, chunk.partition, [key], [offset], [0]), registry)
        return ([] if bad else list(parsed.column_names)), offset
    try:
        doc = json.loads(key)
    except ValueError:
        return [], offset
    if isinstance(doc, dict) and isinstance(doc.get("payload"), dict) and "schema" in doc:
        doc = doc["payload"]
    return (list(doc) if isinstance(doc, dict) else []), offset
