"""Routing records to tables: topic-to-table mapping, static routing by a field's value, and dynamic
routing where the field's value or the record's topic names the table.

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

from tidewater.config.routes import (
    MAX_IDENTIFIER,
    NOT_NAME,
    ROUTE_VALUE,
    SOURCE_PLACEHOLDER,
    TOPIC_PLACEHOLDER,
    valid_identifier,
)
from tidewater.config.spec import PipelineSpec
from tidewater.decode.debezium import SOURCE_COLUMN


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
        self._topic_templates: dict[str, tuple[str, str | None]] = {}

    def _compared(self, ident: str) -> str:
        """A name as the catalog compares names (``catalog.case_sensitive``)."""
        return ident if self._case_sensitive else ident.casefold()

    def dynamic_identifier(self, value: str, template: str | None = None) -> str:
        """The table a route value names: the template (``template``: the one for the record's topic, see
        ``topic_template``) with the value in it, in the template's namespace or ``routing.namespace``. Only the
        configuration chooses the namespace (see ``refusal``). Unless the catalog is case-sensitive, the value is
        folded to lower case, as Hive, Glue and Spark fold names: the value's spelling never decides which of two
        tables it reaches."""
        template = self.routing.table_template if template is None else template
        value = value if self._case_sensitive else value.lower()
        return self._qualified(template.replace("{value}", value), template)

    def refusal(self, value: str, template: str | None = None) -> str | None:
        """Why a route value cannot name a table, or None. A value is one name part (letters, digits,
        `_`): it can never add a namespace, reach another pipeline's namespace or name this pipeline's
        own checkpoint, dead-letter or ledger table."""
        if not ROUTE_VALUE.fullmatch(value):
            return "a route value must be 1-128 letters, digits or '_' (no dots, spaces or line breaks)"
        return self._refused_name(self.dynamic_identifier(value, template))

    def _qualified(self, name: str, template: str) -> str:
        """``name`` in the template's namespace, or in ``routing.namespace`` when the template names none (the
        namespace is decided by the template, never by what a value put into it)."""
        return name if "." in template else f"{self.routing.namespace}.{name}"

    def _refused_name(self, ident: str) -> str | None:
        if not valid_identifier(ident):
            return f"{ident[:300]!r} is not a valid table name (letters, digits and '_', at most {MAX_IDENTIFIER} characters)"
        if self._compared(ident) in self._reserved:
            return f"{ident!r} is the pipeline's own checkpoint, dead-letter or ledger table"
        return None

    def topic_template(self, topic: str) -> tuple[str, str | None]:
        """``routing.table_template`` with the topic placeholders filled for ``topic`` (``{topic}``: the whole
        name, ``{topic[N]}``: its N-th dot-separated part, from 0, or from the end when negative; characters
        other than letters, digits and `_` become `_`, and the name is folded to lower case unless the catalog is
        case-sensitive), and why the topic cannot fill it (None when it can). Topics are chosen by the
        pipeline's configuration (`topics`, `topic_pattern`), so a topic part may name the namespace."""
        cached = self._topic_templates.get(topic)
        if cached is not None:
            return cached
        parts, missing = topic.split("."), []

        def fill(m: re.Match[str]) -> str:
            if m.group(1) is None:
                text = topic
            else:
                i = int(m.group(1))
                if not -len(parts) <= i < len(parts):
                    missing.append(m.group(0))
                    return "_"
                text = parts[i]
            text = NOT_NAME.sub("_", text)
            return text if self._case_sensitive else text.lower()

        template = TOPIC_PLACEHOLDER.sub(fill, self.routing.table_template)
        why = (
            (f"topic {topic!r} has no part {', '.join(missing)} for routing.table_template {self.routing.table_template!r}")
            if missing
            else None
        )
        if why is None and "{value}" not in template and not SOURCE_PLACEHOLDER.search(template):
            why = self._refused_name(self._qualified(template, template))
        self._topic_templates[topic] = (template, why)
        return template, why

    def route(self, topic: str, data: pa.Table) -> Routed:
        n = data.num_rows
        out = Routed()
        if n == 0:
            out.unmatched = pa.array([], pa.bool_())
            return out
        any_row = pa.array(np.zeros(n, dtype=bool))
        values = route_values(data, self.routing.field) if self.routing.field else None
        if self.routing.dynamic:
            template, why_not = self.topic_template(topic)
            if why_not is None and SOURCE_PLACEHOLDER.search(template):
                return self._by_source(data, template)
            if why_not is not None or "{value}" not in template:  # the topic alone names the table: the whole chunk
                return self._whole_chunk(n, template, why_not)
            assert values is not None
            invalid_rows = pa.array(np.zeros(n, dtype=bool))
            reasons: dict[str, str] = {}
            for v in pc.unique(pc.drop_null(values)).to_pylist():  # once per distinct value, not per record
                rows = pc.fill_null(pc.equal(values, v), False)
                why = self.refusal(v, template)
                if why is not None:
                    reasons[v] = why
                    invalid_rows = pc.or_(invalid_rows, rows)
                    continue
                ident = self.dynamic_identifier(v, template)  # values that differ by case alone may name one table
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

    def topic_table(self, topic: str) -> str | None:
        """The one table every record of ``topic`` goes to, when the topic alone decides (a topic-only template, or
        a single `tables` entry taking the topic without a route regex); None when records' values decide."""
        if self.routing.dynamic:
            template, why_not = self.topic_template(topic)
            if why_not is not None or "{value}" in template or SOURCE_PLACEHOLDER.search(template):
                return None
            return self._qualified(template, template)
        takers = [(t, regex) for t, regex in self._static if not t.topics or topic in t.topics]
        return takers[0][0].identifier if len(takers) == 1 and takers[0][1] is None else None

    def _by_source(self, data: pa.Table, template: str) -> Routed:
        """Tables named by fields of the Debezium envelope's source block (``{source.<field>}``, kept by the decoder
        in ``SOURCE_COLUMN``): worked out once per distinct combination of those fields' values, each checked
        like a route value (one name part)."""
        n = data.num_rows
        fields = SOURCE_PLACEHOLDER.findall(template)
        columns = [route_values(data, f"{SOURCE_COLUMN}.{f}") for f in fields]
        combined = pc.binary_join_element_wise(*columns, "\x1f") if len(columns) > 1 else columns[0]
        out = Routed()
        bad_rows = pc.fill_null(pc.is_null(combined), True)
        reasons = {}
        for combo in pc.unique(pc.drop_null(combined)).to_pylist():  # once per source table, not per record
            rows = pc.fill_null(pc.equal(combined, combo), False)
            ident, why = self._source_table(dict(zip(fields, combo.split("\x1f"))), template)
            if why is not None:
                reasons[combo] = why
                bad_rows = pc.or_(bad_rows, rows)
                continue
            out.masks[ident] = pc.or_(out.masks[ident], rows) if ident in out.masks else rows
        missing = f"the change event has no source.{' / source.'.join(fields)} to name its table"
        out.invalid = [
            (r, reasons.get(combined[r].as_py(), missing))  # error path
            for r in pc.indices_nonzero(bad_rows).to_pylist()
        ]
        out.unmatched = pa.array(np.zeros(n, dtype=bool))
        return out

    def _source_table(self, values: dict[str, str], template: str) -> tuple[str, str | None]:
        """The table one source block's values name, and why they cannot (None when they can)."""
        why = next(
            (
                f"source.{f} = {v[:300]!r}: a name part must be 1-128 letters, digits or '_'"
                for f, v in values.items()
                if not ROUTE_VALUE.fullmatch(v)
            ),
            None,
        )
        if why is not None:
            return "", why
        name = SOURCE_PLACEHOLDER.sub(lambda m: values[m.group(1)] if self._case_sensitive else values[m.group(1)].lower(), template)
        ident = self._qualified(name, SOURCE_PLACEHOLDER.sub("s", template))  # the dots of placeholders name no namespace
        return ident, self._refused_name(ident)

    def _whole_chunk(self, n: int, template: str, why_not: str | None) -> Routed:
        """A chunk routed by its topic alone: every row to the topic's table, or every row refused."""
        if why_not is not None:
            return Routed(invalid=[(r, why_not) for r in range(n)], unmatched=pa.array(np.zeros(n, dtype=bool)))  # error path
        ident = self._qualified(template, template)
        return Routed(masks={ident: pa.array(np.ones(n, dtype=bool))}, unmatched=pa.array(np.zeros(n, dtype=bool)))
