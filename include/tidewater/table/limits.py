"""Limits on what records may do to a table's schema.

One record with 10,000 keys must not add 10,000 columns to a table for good. Before a chunk's rows
evolve (or create) a table, the fields they would add are checked against the table's limits
(``table.max_new_columns`` per write task, ``table.max_columns`` in all, ``table.max_field_name_length``).
Records over a limit are dead letters (``TooManyColumns``, ``FieldNameTooLong``) and the fields only they
carried are left out; the other records of the chunk land as usual.

The check is one pass over the chunk's schema (no work per record) unless a limit is exceeded; finding
which records to set apart is the error path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidewater.config.sections.table import SchemaLimits
from tidewater.decode.arrow_types import Rebuilt, rebuilt_type

Path = tuple[str, ...]


@dataclass(frozen=True)
class Rejected:
    """Rows (positions in the chunk's decoded rows) over a limit, and why."""

    row: int
    error_class: str
    message: str


def field_paths(t: pa.DataType, prefix: Path = ()) -> list[Path]:
    """Every field inside a struct type, as name tuples (names may themselves contain dots). List and
    map contents count as fields of their own (``element``, ``key``, ``value``), as Iceberg counts them.

    Not a ``decode.arrow_types`` visitor: its order (each struct's fields before what they hold, the last field's
    first) decides which over-long name a dead letter's message gives, and dead letters are on disk."""
    out: list[Path] = []
    stack: list[tuple[pa.DataType, Path]] = [(t, prefix)]
    while stack:
        typ, pre = stack.pop()
        if pa.types.is_struct(typ):
            for f in typ:
                out.append((*pre, f.name))
                stack.append((f.type, (*pre, f.name)))
        elif pa.types.is_list(typ) or pa.types.is_large_list(typ):
            stack.append((typ.value_type, (*pre, "element")))
        elif pa.types.is_map(typ):
            stack.extend(((typ.key_type, (*pre, "key")), (typ.item_type, (*pre, "value"))))
    return out


def _carried(data: pa.Table, path: Path) -> np.ndarray:
    """Rows whose value at ``path`` is present. Inside lists and maps: rows where the list or map is
    present (a conservative answer: those rows may carry the field)."""
    arr = data.column(path[0]).combine_chunks()
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    for name in path[1:]:
        if not pa.types.is_struct(arr.type) or arr.type.get_field_index(name) < 0:
            break
        arr = pc.struct_field(arr, name)
        valid &= np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return valid


class _Restricted(Rebuilt):
    """A type without the struct fields whose path is not in ``keep`` (inside structs and lists; a map as it is)."""

    into_maps = False

    def __init__(self, keep: set[Path]) -> None:
        self.keep = keep

    def field(self, f: pa.Field, result: pa.DataType | pa.Field | None) -> pa.Field | None:
        return super().field(f, result) if self.path in self.keep else None


def check(data: pa.Table, existing: pa.Schema | None, limits: SchemaLimits, added: int) -> tuple[pa.Table, list[Rejected]]:
    """(the rows within the limits, with only the fields they may add; the rows over a limit).

    ``existing``: the table's schema (None: the table does not exist yet and these rows would create it;
    then only ``max_columns`` applies). ``added``: fields this task already added to the table.
    """
    have = set(field_paths(pa.struct(list(existing)))) if existing is not None else set()
    new = [p for p in field_paths(pa.struct(list(data.schema))) if p not in have]
    # creating a table is not adding columns to one: only the total applies then
    budget = limits.max_columns if existing is None else min(limits.max_new_columns - added, limits.max_columns - len(have))
    too_long = [p for p in new if len(p[-1]) > limits.max_field_name_length]
    if len(new) <= budget and not too_long:
        return data, []
    return _set_apart(data, have, new, too_long, budget, limits)


def _set_apart(
    data: pa.Table, have: set[Path], new: list[Path], too_long: list[Path], budget: int, limits: SchemaLimits
) -> tuple[pa.Table, list[Rejected]]:
    """Error path: reject the rows carrying over-long names, then, while the fields the remaining rows
    would add exceed the budget, the row that adds the most of them."""
    carriers = {p: np.flatnonzero(_carried(data, p)) for p in new}
    rejected: dict[int, Rejected] = {}
    for p in too_long:
        for r in carriers[p].tolist():
            rejected.setdefault(
                r,
                Rejected(
                    r,
                    "FieldNameTooLong",
                    f"field {'.'.join(p)[:80]!r}... is {len(p[-1])} characters; "
                    f"table.max_field_name_length is {limits.max_field_name_length}",
                ),
            )
    counts = {p: len(set(carriers[p].tolist()) - set(rejected)) for p in new}
    per_row: dict[int, list[Path]] = {}
    for p in new:
        for r in carriers[p].tolist():
            if r not in rejected:
                per_row.setdefault(r, []).append(p)
    while sum(1 for c in counts.values() if c) > max(budget, 0) and per_row:
        worst = max(per_row, key=lambda r: (len(per_row[r]), r))  # ties: the later record goes
        adds = per_row.pop(worst)
        for p in adds:
            counts[p] -= 1
        rejected[worst] = Rejected(
            worst,
            "TooManyColumns",
            (
                f"the record would add {len(adds)} columns; table.max_new_columns is {limits.max_new_columns} per write "
                f"task and table.max_columns {limits.max_columns} in all ({len(have)} now)"
            ),
        )
    keep_paths = have | {p for p, c in counts.items() if c}
    mask = np.ones(data.num_rows, dtype=bool)
    mask[list(rejected)] = False
    kept = data.filter(pa.array(mask))
    columns = [n for n in kept.column_names if (n,) in keep_paths]
    kept = kept.select(columns)
    target = pa.schema([pa.field(f.name, rebuilt_type(f.type, _Restricted(keep_paths), (f.name,)), f.nullable) for f in kept.schema])
    return kept.cast(target), [rejected[r] for r in sorted(rejected)]
