"""Routing records to tables: topic-to-table mapping, static routing by a field's value, and dynamic
routing where the field's value names the table.

All of it is Arrow work over a decoded chunk: the route field is read as one column, a regular
expression is matched against the whole column, and dynamic names are worked out once per distinct
value (not per record). The result is, per target table, a boolean mask over the chunk's rows, plus
the rows that went nowhere and the rows whose value cannot name a table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidewater.config.spec import PipelineSpec

_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_VALUE = re.compile(r"[A-Za-z0-9_]{1,128}")  # what a record's route value may put into a table name


MAX_IDENTIFIER = 255


def valid_identifier(ident: str) -> bool:
    """`namespace.name` made of letters, digits and `_` (no empty, dotted-away or over-long parts).
    Whole-string matches: a trailing newline is not a name character."""
    parts = ident.split(".")
    return len(ident) <= MAX_IDENTIFIER and len(parts) >= 2 and all(_PART.fullmatch(p) for p in parts)


def route_values(data: pa.Table, path: str) -> pa.Array:
    """The route field (dotted path into nested objects) as strings; null where a record lacks it."""
    names = path.split(".")
    if names[0] not in data.column_names:
        return pa.nulls(data.num_rows, pa.string())
    arr: Any = data.column(names[0]).combine_chunks()
    for name in names[1:]:
        if not pa.types.is_struct(arr.type) or arr.type.get_field_index(name) < 0:
            return pa.nulls(data.num_rows, pa.string())
        arr = pc.struct_field(arr, name)
    if pa.types.is_nested(arr.type):
        return pa.nulls(data.num_rows, pa.string())  # an object or list never names a table
    return arr.cast(pa.string()) if not pa.types.is_string(arr.type) else arr


@dataclass
class Routed:
    """Where a chunk's rows go."""

    masks: dict[str, pa.Array] = field(default_factory=dict)  # table identifier -> rows for it
    unmatched: pa.Array | None = None  # rows that go to no table
    invalid: list[tuple[int, str]] = field(default_factory=list)  # rows whose value cannot name a table


class Router:
    """Decides the target tables of decoded rows for one pipeline."""

    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec
        self.routing = spec.routing
        self._static = [(t, re.compile(t.route_regex) if t.route_regex else None) for t in spec.tables]
        self._case_sensitive = spec.catalog.case_sensitive
        self._reserved = {self._compared(t) for t in (spec.checkpoint_table(), spec.dead_letter_table(), spec.ledger_table())}

    def _compared(self, ident: str) -> str:
        """A name as the catalog compares names (``catalog.case_sensitive``)."""
        return ident if self._case_sensitive else ident.casefold()

    def dynamic_identifier(self, value: str) -> str:
        """The table a route value names: the template with the value in it, in the template's namespace
        or ``routing.namespace``. Only the configuration chooses the namespace (see ``refusal``). Unless the
        catalog is case-sensitive, the value is folded to lower case, as Hive, Glue and Spark fold names: the
        value's spelling never decides which of two tables it reaches."""
        value = value if self._case_sensitive else value.lower()
        name = self.routing.table_template.replace("{value}", value)
        return name if "." in self.routing.table_template else f"{self.routing.namespace}.{name}"

    def refusal(self, value: str) -> str | None:
        """Why a route value cannot name a table, or None. A value is one name part (letters, digits,
        `_`): it can never add a namespace, reach another pipeline's namespace or name this pipeline's
        own checkpoint, dead-letter or ledger table."""
        if not _VALUE.fullmatch(value):
            return "a route value must be 1-128 letters, digits or '_' (no dots, spaces or line breaks)"
        ident = self.dynamic_identifier(value)
        if not valid_identifier(ident):
            return f"{ident[:300]!r} is not a valid table name (letters, digits and '_', at most {MAX_IDENTIFIER} characters)"
        if self._compared(ident) in self._reserved:
            return f"{ident!r} is the pipeline's own checkpoint, dead-letter or ledger table"
        return None

    def route(self, topic: str, data: pa.Table) -> Routed:
        n = data.num_rows
        out = Routed()
        if n == 0:
            out.unmatched = pa.array([], pa.bool_())
            return out
        any_row = pa.array(np.zeros(n, dtype=bool))
        values = route_values(data, self.routing.field) if self.routing.field else None
        if self.routing.dynamic:
            assert values is not None
            invalid_rows = pa.array(np.zeros(n, dtype=bool))
            reasons: dict[str, str] = {}
            for v in pc.unique(pc.drop_null(values)).to_pylist():  # once per distinct value, not per record
                rows = pc.fill_null(pc.equal(values, v), False)
                why = self.refusal(v)
                if why is not None:
                    reasons[v] = why
                    invalid_rows = pc.or_(invalid_rows, rows)
                    continue
                ident = self.dynamic_identifier(v)  # values that differ by case alone may name one table
                out.masks[ident] = pc.or_(out.masks[ident], rows) if ident in out.masks else rows
                any_row = pc.or_(any_row, rows)
            if reasons:
                shown = {}
                for r in pc.indices_nonzero(invalid_rows).to_pylist():  # error path
                    v = values[r].as_py()
                    shown[r] = f"route field {self.routing.field!r} = {v[:300]!r} does not name a table: {reasons[v]}"
                out.invalid = sorted(shown.items())
                any_row = pc.or_(any_row, invalid_rows)
        else:
            for t, regex in self._static:
                if t.topics and topic not in t.topics:
                    continue
                if regex is None:
                    rows = pa.array(np.ones(n, dtype=bool))
                else:
                    assert values is not None
                    rows = pc.fill_null(pc.match_substring_regex(values, f"^(?:{regex.pattern})$"), False)
                if pc.any(rows).as_py():
                    out.masks[t.identifier] = pc.or_(out.masks[t.identifier], rows) if t.identifier in out.masks else rows
                    any_row = pc.or_(any_row, rows)
        out.unmatched = pc.invert(any_row)
        return out
