"""What decoders return besides rows: bad records by chunk index, and the masks that drop them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidewater.errors import TerminalError

# An Arrow field's metadata key for its identity in the source schema (a Protobuf field number): a column whose
# number a field of a new name carries is renamed, not dropped and added (table/evolution.py)
FIELD_NUMBER = b"tidewater.field-number"
# An Arrow field's metadata key for the registered schema its values were decoded with (its id): the table keeps the
# id that added each column (table/evolution.py: SCHEMA_IDS), so that a conflicting version is named with it
SCHEMA_ID = b"tidewater.schema-id"


def with_schema_id(rows: pa.Table, schema_id: int) -> pa.Table:
    """``rows`` with each top-level field marked as decoded with ``schema_id`` (``SCHEMA_ID``)."""
    fields = [f.with_metadata({**(f.metadata or {}), SCHEMA_ID: str(schema_id).encode()}) for f in rows.schema]
    return rows.cast(pa.schema(fields, metadata=rows.schema.metadata))


def in_chunk_order(parts: list[pa.Table], positions: list[np.ndarray], labels: list[str] | None = None, check: bool = True) -> pa.Table:
    """The rows of several parts of one chunk (decoded apart: one per schema id, say) as one table in chunk order;
    ``positions``: each part's rows' chunk positions. Fields one part lacks are null in the others' rows. Two parts
    that give a field types that do not widen into one raise TerminalError naming it and both parts (``labels``);
    with ``check`` False the parts join under Arrow's permissive promotion (int64 and double: double) and only
    types it cannot join raise (Arrow's error)."""
    full = [(p, at) for p, at in zip(parts, positions, strict=True) if p.num_rows]
    if not full:
        return pa.table({})
    if check:
        _refuse_part_conflicts(parts, labels or [f"part {i}" for i in range(len(parts))])
    table = pa.concat_tables([p for p, _ in full], promote_options="permissive")
    return table.take(pa.array(np.argsort(np.concatenate([at for _, at in full]), kind="stable")))


def _refuse_part_conflicts(parts: list[pa.Table], names: list[str]) -> None:
    """TerminalError naming the first field two parts give types that do not widen into one, and both parts."""
    for i in range(1, len(parts)):
        for j in range(i):
            found = type_conflicts(parts[j].schema, parts[i].schema)
            if found:
                path, a, b = found[0]
                raise TerminalError(
                    f"field {path}: {names[j]} gives it type {a}, {names[i]} type {b}; a column has one "
                    "type (an incompatible schema change)"
                )


def type_conflicts(have: pa.Schema, got: pa.Schema, prefix: str = "") -> list[tuple[str, pa.DataType, pa.DataType]]:
    """The fields both schemas hold whose types are neither equal nor one a widening of the other (int -> long,
    float -> double, null -> anything; nested structs, lists and maps compared field by field): (path, have, got)."""
    theirs = {f.name: f.type for f in got}
    out: list[tuple[str, pa.DataType, pa.DataType]] = []
    for f in have:
        if f.name in theirs and not _fits(f.type, theirs[f.name], f"{prefix}{f.name}", out):
            out.append((f"{prefix}{f.name}", f.type, theirs[f.name]))
    return out


_WIDENS = {(pa.int32(), pa.int64()), (pa.float32(), pa.float64())}


def _fits(a: pa.DataType, b: pa.DataType, path: str, out: list[tuple[str, pa.DataType, pa.DataType]]) -> bool:
    """``a`` and ``b`` are one column's type (nested conflicts are added to ``out`` under their own paths)."""
    if a == b or pa.types.is_null(a) or pa.types.is_null(b) or (a, b) in _WIDENS or (b, a) in _WIDENS:
        return True
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
        return (a.tz is None) == (b.tz is None)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        out += type_conflicts(pa.schema(list(a)), pa.schema(list(b)), path + ".")
        return True
    if (pa.types.is_list(a) or pa.types.is_large_list(a)) and (pa.types.is_list(b) or pa.types.is_large_list(b)):
        return _fits(a.value_type, b.value_type, path + "[]", out)
    if pa.types.is_map(a) and pa.types.is_map(b):
        return _fits(a.key_type, b.key_type, path + "{}", out) and _fits(a.item_type, b.item_type, path + "{}", out)
    if {a, b} <= {pa.string(), pa.large_string()} or {a, b} <= {pa.binary(), pa.large_binary()}:
        return True
    return False


def refuse_conflicts(ctx: Any, rows: pa.Table, label: str) -> None:
    """TerminalError when ``rows`` (decoded with a registered schema, ``label``) give a column of the table
    (``ctx.explicit``) a type it cannot take: the schema changed incompatibly; nothing of the batch is committed."""
    if ctx.explicit is None:
        return
    found = [c for c in type_conflicts(ctx.explicit, rows.schema) if c[0] not in ctx.converted]
    if found:
        path, have, got = found[0]
        where = f"table {ctx.table}" if ctx.table else "the table"
        column = ctx.explicit.field(path.split(".")[0])
        added = (column.metadata or {}).get(SCHEMA_ID)
        since = f" (added by schema id {added.decode()})" if added else ""
        raise TerminalError(
            f"field {path}: {label} gives it type {got}, {where} has {have}{since}; an incompatible "
            "schema change (a new column name, or a new table, takes it)",
            table=ctx.table,
        )


# ---- error path: separate the records that cannot be decoded -------------------------------------


@dataclass(frozen=True)
class BadRecord:
    """A record of a chunk that could not be decoded, by its index in the chunk."""

    index: int
    error_class: str
    message: str


def surviving(n: int, bad: list[int]) -> list[int]:
    """Chunk index of each decoded row when the records at ``bad`` were set apart (error path)."""
    gone = set(bad)
    return [i for i in range(n) if i not in gone]


def keep_mask(n: int, bad: list[int]) -> pa.Array:
    """A filter keeping every row of an ``n``-record chunk but those at ``bad``."""
    mask = np.ones(n, dtype=bool)
    mask[list(bad)] = False
    return pa.array(mask)


def decoded_rows(n: int, bad: list[int]) -> pa.Array:
    """Chunk index of each decoded row when the records at ``bad`` were set apart (vectorized)."""
    return pa.array(np.flatnonzero(keep_mask(n, bad).to_numpy(zero_copy_only=False)) if bad else np.arange(n), pa.uint64())


MAX_DEPTH_DEFAULT = 64  # format.max_nesting_depth's default (config/sections/source.py states it too, free of decode imports)


@dataclass(frozen=True)
class DecodeContext:
    """What a value-format decoder gets besides the chunk (see ``decode/registry.py``)."""

    fmt: str  # format.value
    explicit: Any = None  # the table's Arrow schema (readable types) when the table exists
    strict: bool = False  # dead_letter.policy is fail: the first bad record may raise at once
    registry: Any = None  # schema registry client (avro)
    max_depth: int = MAX_DEPTH_DEFAULT  # format.max_nesting_depth: deeper records are dead letters (TooDeep)
    allow_non_numeric: bool = False  # format.allow_non_numeric_numbers: NaN and Infinity taken as numbers
    keep_source: bool = False  # Debezium: keep the envelope's source block (routing by {source.<field>})
    table: str | None = None  # the table ``explicit`` is of, for errors (None: a routed pipeline's several)
    converted: tuple[str, ...] = ()  # columns converted after decoding (format.timestamps): their types may differ
    message: str | None = None  # format.message: the Protobuf message type to read (None: the message indexes')


def not_utf8(v: bytes) -> bool:
    try:
        v.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def null_rows(rows: pa.Table, columns: list[str]) -> dict[int, str]:
    """Rows (positions) with a null or missing value in one of ``columns``: row -> the first such column.
    Vectorized per column; Python only over the rows found (error path)."""
    out: dict[int, str] = {}
    for column in columns:
        empty = pc.is_null(rows.column(column)) if column in rows.column_names else pa.nulls(rows.num_rows).is_null()
        if pc.any(empty).as_py():
            for r in pc.indices_nonzero(empty).to_pylist():
                out.setdefault(r, column)
    return out
