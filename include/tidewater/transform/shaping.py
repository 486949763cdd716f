"""Shaping decoded rows to the table: objects as maps, flattening, and field-name matching.

- ``format.map_columns``: object columns with unbounded keys become ``map<string, V>`` columns;
- ``format.flatten``: nested objects become top-level columns (``a.b.c`` -> ``a_b_c``) down to
  ``format.flatten_max_depth`` levels; deeper objects stay structs;
- field names are matched to the table's columns through the table's name mapping
  (``schema.name-mapping.default`` aliases) and, with ``table.case_insensitive``, ignoring case;
- values whose type differs from the table's column are cast; a value that cannot be cast makes its
  record a dead letter (``TypeMismatch``), never the batch.

Everything is Arrow work over whole chunks; only a column that fails to cast is looked at value by
value (error path).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.types import StructType

from tidewater.config.sections.source import FormatSpec
from tidewater.config.sections.table import TableSpec
from tidewater.decode.records import keep_mask
from tidewater.errors import TerminalError

NAME_MAPPING = "schema.name-mapping.default"


def active(fmt: FormatSpec, table_spec: TableSpec, table: Any | None) -> bool:
    """Whether shaping applies (otherwise decoded rows are used as they are, the fast path)."""
    has_mapping = table is not None and NAME_MAPPING in table.metadata.properties
    return bool(fmt.flatten or fmt.map_columns or table_spec.case_insensitive or has_mapping)


# ---- maps ----------------------------------------------------------------------------------------


def _common_type(types: list[pa.DataType], column: str) -> pa.DataType:
    distinct = set(types)
    if len(distinct) == 1:
        return types[0]
    if all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in distinct):
        return pa.float64() if any(pa.types.is_floating(t) for t in distinct) else pa.int64()
    if all(pa.types.is_primitive(t) or pa.types.is_string(t) for t in distinct):
        return pa.string()
    raise TerminalError(
        f"format.map_columns: the values of {column!r} mix types that have no common type ({', '.join(sorted(str(t) for t in distinct))})"
    )


def struct_to_map(arr: pa.Array, column: str) -> pa.Array:
    """A struct array (one field per key) as a ``map<string, V>`` array; absent and null keys are left out."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    if pa.types.is_map(arr.type):
        return arr
    if not pa.types.is_struct(arr.type):
        if pa.types.is_null(arr.type):
            return pa.nulls(n, pa.map_(pa.string(), pa.string()))
        raise TerminalError(f"format.map_columns: {column!r} holds {arr.type} values, not objects")
    k = arr.type.num_fields
    if k == 0:
        offsets = pa.array(np.zeros(n + 1, dtype=np.int32))
        return pa.MapArray.from_arrays(offsets, pa.array([], pa.string()), pa.array([], pa.string()), mask=pc.is_null(arr))
    value_type = _common_type([arr.type.field(i).type for i in range(k)], column)
    parent_valid = pc.is_valid(arr)
    rows, keys, values = [], [], []
    for i in range(k):
        child = arr.field(i)
        keep = pc.and_(parent_valid, pc.is_valid(child))
        idx = pc.indices_nonzero(keep)
        rows.append(idx)
        keys.append(pa.array(np.full(len(idx), i, dtype=np.int32)))
        values.append(pc.take(child, idx).cast(value_type))
    row = pa.concat_arrays(rows)
    key = pa.concat_arrays(keys)
    order = pc.sort_indices(pa.table({"r": row, "k": key}), sort_keys=[("r", "ascending"), ("k", "ascending")])
    names = pa.array([arr.type.field(i).name for i in range(k)], pa.string())
    key_names = pc.take(names, pc.take(key, order))
    items = pc.take(pa.concat_arrays(values), order)
    per_row = np.bincount(row.to_numpy(zero_copy_only=False), minlength=n) if len(row) else np.zeros(n, np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(per_row)]), pa.int32())
    return pa.MapArray.from_arrays(offsets, key_names, items, mask=pc.invert(parent_valid))


# ---- flattening ----------------------------------------------------------------------------------


def flatten(table: pa.Table, separator: str, max_depth: int) -> pa.Table:
    """Struct columns expanded into ``parent<sep>child`` columns, ``max_depth`` levels deep."""
    names: list[str] = []
    arrays: list[pa.Array] = []

    def add(name: str, arr: Any, depth: int) -> None:
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if pa.types.is_struct(arr.type) and depth < max_depth and arr.type.num_fields:
            for child_name, child in zip((f.name for f in arr.type), arr.flatten()):
                add(f"{name}{separator}{child_name}", child, depth + 1)
            return
        names.append(name)
        arrays.append(arr)

    for name in table.column_names:
        add(name, table.column(name), 0)
    return merge_columns(names, arrays)


def merge_columns(names: list[str], arrays: list[pa.Array]) -> pa.Table:
    """A table from columns where two may share a name: they merge when no row has both values."""
    out: dict[str, pa.Array] = {}
    for name, arr in zip(names, arrays):
        if name not in out:
            out[name] = arr
            continue
        have = out[name]
        if pa.types.is_null(arr.type) or arr.null_count == len(arr):
            continue
        if pa.types.is_null(have.type) or have.null_count == len(have):
            out[name] = arr
            continue
        both = pc.and_(pc.is_valid(have), pc.is_valid(arr))
        if pc.any(both).as_py():
            raise TerminalError(
                f"two fields of the same record both become column {name!r} (flattening or name matching); "
                "rename one (format.flatten_separator) or switch table.case_insensitive off"
            )
        try:
            out[name] = pc.coalesce(have, arr.cast(have.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            out[name] = pc.coalesce(have.cast(arr.type), arr)
    return pa.table(out)


# ---- field-name matching -------------------------------------------------------------------------


class NameMatcher:
    """Renames fields (top-level and inside structs) to the table's names: name-mapping aliases,
    then, with ``case_insensitive``, names that differ only in case."""

    def __init__(self, table: Any | None, case_insensitive: bool) -> None:
        self._levels: dict[tuple[str, ...], dict[str, str]] = {}
        self._ci = case_insensitive
        if table is None:
            return
        schema = table.schema()
        try:
            mapping = table.name_mapping()
        except Exception:  # noqa: BLE001 - an unreadable schema.name-mapping.default: names match as they are
            mapping = None
        by_id: dict[int, list[str]] = {}
        if mapping is not None:

            def collect(fields: Any) -> None:
                for mf in fields:
                    if mf.field_id is not None:
                        by_id.setdefault(mf.field_id, []).extend(mf.names)
                    collect(mf.fields)

            collect(mapping)

        def level(fields: Any, path: tuple[str, ...]) -> None:
            lookup: dict[str, str] = {}
            for f in fields:
                for alias in [f.name, *by_id.get(f.field_id, [])]:
                    lookup.setdefault(alias, f.name)
                    if self._ci:
                        lookup.setdefault(alias.lower(), f.name)
                if isinstance(f.field_type, StructType):
                    level(f.field_type.fields, (*path, f.name))
            self._levels[path] = lookup

        level(schema.fields, ())

    def _name(self, name: str, path: tuple[str, ...]) -> str:
        lookup = self._levels.get(path)
        if not lookup:
            return name
        return lookup.get(name) or (lookup.get(name.lower()) if self._ci else None) or name

    def _array(self, arr: Any, path: tuple[str, ...]) -> Any:
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if not pa.types.is_struct(arr.type) or path not in self._levels:
            return arr
        names = [self._name(f.name, path) for f in arr.type]
        children = [self._array(c, (*path, n)) for c, n in zip((arr.field(i) for i in range(arr.type.num_fields)), names)]
        if len(set(names)) != len(names):
            merged = merge_columns(names, children)
            names, children = merged.column_names, [c.combine_chunks() for c in merged.columns]
        return pa.StructArray.from_arrays(children, names=names, mask=pc.is_null(arr) if arr.null_count else None)

    def apply(self, table: pa.Table) -> pa.Table:
        if not self._levels:
            return table
        names = [self._name(n, ()) for n in table.column_names]
        arrays = [self._array(c, (n,)) for c, n in zip(table.columns, names)]
        if names == table.column_names and all(a.type == c.type for a, c in zip(arrays, table.columns)):
            return table
        return merge_columns(names, arrays)


# ---- casting to the table's types ----------------------------------------------------------------


def conform(data: pa.Table, target: pa.Schema | None) -> tuple[pa.Table, list[tuple[int, str]]]:
    """Cast top-level scalar and map columns to the table's types. Returns the rows that cast (others
    removed) and the failed rows' positions with a message naming the column and the value."""
    if target is None or data.num_rows == 0:
        return data, []
    failed: dict[int, str] = {}
    for i, name in enumerate(data.column_names):
        j = target.get_field_index(name)
        if j < 0:
            continue
        want = target.field(j).type
        col = data.column(i).combine_chunks()
        if col.type == want or not (_scalar(want) and _scalar(col.type) or _scalar_map(want) and _scalar_map(col.type)):
            continue
        try:
            data = data.set_column(i, name, col.cast(want))
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        values = col.to_pylist()  # error path: find the values that do not cast
        out = []
        for r, v in enumerate(values):
            try:
                out.append(pa.array([v], col.type).cast(want)[0].as_py())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                failed.setdefault(r, f"column {name!r}: {v!r} is not a {want} value")
                out.append(None)
        data = data.set_column(i, name, pa.array(out, want))
    if failed:
        data = data.filter(keep_mask(data.num_rows, list(failed)))
    return data, sorted(failed.items())


def _scalar(t: pa.DataType) -> bool:
    return not (pa.types.is_nested(t) or pa.types.is_null(t))


def _scalar_map(t: pa.DataType) -> bool:
    return pa.types.is_map(t) and _scalar(t.key_type) and _scalar(t.item_type)


def shape(data: pa.Table, fmt: FormatSpec, matcher: NameMatcher) -> pa.Table:
    """Map columns, flattening and name matching, in that order."""
    if fmt.map_columns:
        for name in fmt.map_columns:
            if name in data.column_names:
                data = data.set_column(data.column_names.index(name), name, struct_to_map(data.column(name), name))
    if fmt.flatten:
        data = flatten(data, fmt.flatten_separator, fmt.flatten_max_depth)
    return matcher.apply(data)


def decoder_schema(table_schema: pa.Schema | None, fmt: FormatSpec) -> pa.Schema | None:
    """The table schema as the value decoder may use it when shaping: map columns are read as objects, and
    with flattening a struct column (an object left whole below ``flatten_max_depth``, named ``a_b_c``, never
    a key of the record itself) is left out: read as an empty struct, flattening would expand it again into
    columns the table does not have."""
    if table_schema is None:
        return None
    return pa.schema([f for f in table_schema if not pa.types.is_map(f.type) and not (fmt.flatten and pa.types.is_struct(f.type))])
