"""What decoders return besides rows: bad records by chunk index, and the masks that drop them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def in_chunk_order(parts: list[pa.Table], positions: list[np.ndarray]) -> pa.Table:
    """The rows of several parts of one chunk (decoded apart: one per schema id, say) as one table in chunk order;
    ``positions``: each part's rows' chunk positions. Fields one part lacks are null in the others' rows."""
    full = [(p, at) for p, at in zip(parts, positions, strict=True) if p.num_rows]
    if not full:
        return pa.table({})
    table = pa.concat_tables([p for p, _ in full], promote_options="permissive")
    return table.take(pa.array(np.argsort(np.concatenate([at for _, at in full]), kind="stable")))


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


MAX_DEPTH_DEFAULT = 64  # format.max_nesting_depth's default (config/spec.py states it too, free of decode imports)


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
