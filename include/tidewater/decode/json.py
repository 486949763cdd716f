"""Decoding record values into Arrow tables.

JSON values of a chunk are joined into one newline-delimited buffer and parsed by Arrow's JSON reader
in one call (vectorized, multi-threaded): no Python work per record on the success path. When Arrow
rejects the buffer, the failing record is located by bisection (error path only) so the error names
its topic, partition and offset.

Type inference: fields already in the table are parsed with the table's types; new fields are inferred
(long, double, boolean, string, struct, list). Strings that merely look like timestamps stay strings
(parsing date-times is an explicit, configured conversion), and fields that are null in every record
of a chunk are left out until a record gives them a type.

Numbers (RFC 8259, the rule documented under ``format.allow_non_numeric_numbers``): ``NaN`` and
``Infinity`` are not JSON, and Arrow's reader would take them: such a record is a dead letter
(``InvalidJson``) unless the setting allows them. An integer beyond the signed 64-bit range would be inferred
as a double (its digits silently lost) or refused by a long column: it is always a dead letter
(``NumberOutOfRange``), as is a number too large for a double (``1e400``). Each of these lands in a float
column as NaN, an infinity or a magnitude of at least 2^63 (in an integer column Arrow refuses it), so the
parsed float columns are checked, vectorized, for such values; only a chunk that has one has its records
screened one by one (error path), and a legitimate double that large (``1e19``) costs that screen only.
A chunk without float columns pays nothing.
"""

from __future__ import annotations

import io
import json
from operator import itemgetter
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from tidewater.decode.arrow_types import Rebuilt, rebuilt_schema, visit
from tidewater.decode.records import MAX_DEPTH_DEFAULT, BadRecord, DecodeContext
from tidewater.errors import RecordError
from tidewater.source.kafka import Chunk

MIN_BLOCK_SIZE = 1 << 20  # small blocks let Arrow parse one chunk on several threads


def _parse(buf: bytes, explicit: pa.Schema | None, block_size: int, extra: str = "infer") -> pa.Table:
    """``extra``: what becomes of fields ``explicit`` does not name (Arrow's ``unexpected_field_behavior``: ``infer``
    their types, or ``ignore`` them as a JSON Schema's columns do)."""
    opts = pj.ParseOptions(
        explicit_schema=explicit,
        unexpected_field_behavior=extra,
        newlines_in_values=False,
    )
    return pj.read_json(io.BytesIO(buf), read_options=pj.ReadOptions(block_size=block_size), parse_options=opts)


def _parse_settled(buf: bytes, explicit: pa.Schema | None, block_size: int, extra: str = "infer") -> pa.Table:
    """Parse, then parse again with the settled schema if inferred fields need their final types."""
    table = _parse(buf, explicit, block_size, extra)
    settled = settle_schema(table.schema, explicit)
    if settled != table.schema:
        table = _parse(buf, settled, block_size, extra)
        if table.schema != settled:  # null-only fields come back as inferred nulls: drop them
            table = table.select(settled.names).cast(settled)
    return table


class _Readable(Rebuilt):
    """The table's type as Arrow's JSON reader can produce it (no large_* layouts); cast back on write. Fields come
    out nullable, and maps as they are."""

    into_maps, large_lists, keep_nullability = False, False, False

    def primitive(self, t: pa.DataType) -> pa.DataType:
        if pa.types.is_large_string(t):
            return pa.string()
        return pa.binary() if pa.types.is_large_binary(t) else t


def readable_schema(schema: pa.Schema) -> pa.Schema:
    return rebuilt_schema(schema, _Readable())


class _Inferred(Rebuilt):
    """The type to keep for an inferred field: timestamps become strings, null-only fields are dropped (a struct or
    list left with nothing: dropped too). Fields come out nullable, and maps as they are."""

    into_maps, large_lists, keep_nullability = False, False, False

    def struct(self, t: pa.StructType, fields: list[pa.DataType | pa.Field | None]) -> pa.DataType | None:
        kept = [f for f in fields if isinstance(f, pa.Field)]
        return pa.struct(kept) if kept else None

    def primitive(self, t: pa.DataType) -> pa.DataType | None:
        if pa.types.is_null(t):
            return None
        return pa.string() if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) else t


def _inferred_type(t: pa.DataType) -> pa.DataType | None:
    found = visit(t, _Inferred())
    assert not isinstance(found, pa.Field)
    return found


def _merge(explicit: pa.DataType | None, decoded: pa.DataType) -> pa.DataType | None:
    """Keep the table's type where it has one, fix up inferred types elsewhere."""
    if explicit is None:
        return _inferred_type(decoded)
    if pa.types.is_struct(explicit) and pa.types.is_struct(decoded):
        fields = []
        for f in decoded:
            idx = explicit.get_field_index(f.name)
            ft = _merge(explicit.field(idx).type if idx >= 0 else None, f.type)
            if ft is not None:
                fields.append(pa.field(f.name, ft))
        return pa.struct(fields)
    if pa.types.is_list(explicit) and (pa.types.is_list(decoded) or pa.types.is_large_list(decoded)):
        vt = _merge(explicit.value_type, decoded.value_type)
        return pa.list_(vt if vt is not None else explicit.value_type)
    return explicit


def settle_schema(decoded: pa.Schema, explicit: pa.Schema | None) -> pa.Schema:
    """The schema to parse with so that inferred fields get their final types."""
    struct = _merge(pa.struct(list(explicit)) if explicit is not None else pa.struct([]), pa.struct(list(decoded)))
    assert struct is not None
    return pa.schema(list(struct))


_NULL_LINE = r"(?m)^[ \t]*null[ \t]*$"


def schema_depth(schema: pa.Schema) -> int:
    """Nesting depth of a schema (1 for flat records), computed without recursion: the schema is inferred from the
    records, as deep as a record can be before this check sets it apart (so not a ``decode.arrow_types`` visitor)."""
    deepest, stack = 1, [(f.type, 1) for f in schema]
    while stack:
        t, d = stack.pop()
        deepest = max(deepest, d)
        if pa.types.is_struct(t):
            stack.extend((t.field(i).type, d + 1) for i in range(t.num_fields))
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            stack.append((t.value_type, d + 1))
        elif pa.types.is_map(t):
            stack.extend(((t.key_type, d + 1), (t.item_type, d + 1)))
    return deepest


_FIRST_BYTE = itemgetter(slice(0, 1))

SUSPECT_MAGNITUDE = 2.0**63  # an integer token at least this large does not fit a long: it became a double


def _suspect_numbers(table: pa.Table, allow_non_numeric: bool) -> bool:
    """Whether a float column (nested ones included) holds a value that may come from a number token JSON cannot
    hold exactly: NaN or an infinity (allowed NaN/Infinity aside) or a magnitude of at least 2^63. Vectorized."""
    stack = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in table.columns]
    while stack:
        a = stack.pop()
        t = a.type
        if pa.types.is_struct(t):
            stack.extend(a.field(i) for i in range(t.num_fields))
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            stack.append(a.flatten())
        elif pa.types.is_floating(t) and len(a):
            big = pc.greater_equal(pc.abs(a), SUSPECT_MAGNITUDE)  # infinities included
            odd = big if allow_non_numeric else pc.or_(big, pc.is_nan(a))
            if pc.any(odd).as_py():
                return True
    return False


def _buffer_problem(buf: bytes, values: list[bytes]) -> str | None:
    """Checks of the chunk done in C, no Python work per record: invalid UTF-8 (Arrow's JSON reader
    passes it through into string columns, where Parquet statistics fail later) and JSON ``null``
    values (Arrow would make an all-null row of them, so the outcome would depend on the neighbours).

    Every value starting with ``{`` (the first bytes are gathered by a C slice mapped over the list, as
    cheap as ``len``) rules out null values at once; otherwise a regular expression looks for them.
    """
    data = pa.py_buffer(buf)
    offsets = pa.array([0, len(buf)], pa.int64()).buffers()[1]
    whole = pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, data])
    try:
        text = whole.cast(pa.large_string())
    except pa.ArrowInvalid:
        return "invalid UTF-8"
    firsts = b"".join(map(_FIRST_BYTE, values))
    if len(firsts) == len(values) and firsts.count(b"{") == len(values):
        return None
    if pc.match_substring_regex(text, _NULL_LINE)[0].as_py():
        return "JSON null value"
    return None


def decode_json(
    chunk: Chunk, explicit: pa.Schema | None, max_depth: int = MAX_DEPTH_DEFAULT, allow_non_numeric: bool = False, extra: str = "infer"
) -> pa.Table:
    """Parse a chunk of JSON object values. Raises RecordError naming the first bad record. ``extra``: see
    ``_parse``."""
    if explicit is not None:
        explicit = readable_schema(explicit)
    n = len(chunk.values)
    if n == 0:
        return pa.table({})
    if chunk.values.count(None):
        i = chunk.values.index(None)
        raise RecordError(
            "record has a null value (tombstone); JSON pipelines need an object per record",
            topic=chunk.topic,
            partition=chunk.partition,
            offset=chunk.offsets[i],
        )
    values = cast(list[bytes], chunk.values)  # no null among them (above)
    buf = b"\n".join(values)
    if buf.count(b"\n") != n - 1 or b"\r" in buf:
        # Pretty-printed values: raw line breaks can only be whitespace between JSON tokens.
        values = [v.replace(b"\r", b" ").replace(b"\n", b" ") for v in values]
        buf = b"\n".join(values)
    block_size = max(MIN_BLOCK_SIZE, 2 * max(map(len, values)) + 1)
    problem = _buffer_problem(buf, values)
    table = None
    try:
        table = None if problem else _parse_settled(buf, explicit, block_size, extra)
    except pa.ArrowInvalid as e:
        _raise_bad_record(
            chunk,
            values,
            explicit,
            block_size,
            e,
            max_depth,
            allow_non_numeric,
            extra,
        )
        raise  # pragma: no cover - _raise_bad_record always raises
    except RecursionError:
        problem = "nesting too deep"
    if table is not None and schema_depth(table.schema) > max_depth:
        problem = f"nesting deeper than format.max_nesting_depth ({max_depth})"
    if table is not None and problem is None and _suspect_numbers(table, allow_non_numeric):
        _raise_first_screened(chunk, values, max_depth, allow_non_numeric)
        # a false alarm (a legitimate double that large): no record holds such a token
    if problem is not None:
        _raise_first_screened(chunk, values, max_depth, allow_non_numeric)
        raise RecordError(
            f"chunk of {len(values)} records could not be decoded ({problem})",
            topic=chunk.topic,
            partition=chunk.partition,
            offset=chunk.offsets[0],
        )
    assert table is not None
    if table.num_rows != n:
        stripped = [i for i, v in enumerate(values) if not v.strip()]
        i = stripped[0] if stripped else 0
        raise RecordError(
            "record value is empty or whitespace; expected a JSON object",
            topic=chunk.topic,
            partition=chunk.partition,
            offset=chunk.offsets[i],
        )
    return table


def _raise_first_screened(chunk: Chunk, values: list[bytes], max_depth: int, allow_non_numeric: bool) -> None:
    """Error path: raise a RecordError naming the first record the per-record screen rejects, if any."""
    for i, v in enumerate(values):
        found = screen(v, max_depth, allow_non_numeric)
        if found is not None:
            raise RecordError(
                f"record is not a valid JSON object ({found[0]}: {found[1]})",
                topic=chunk.topic,
                partition=chunk.partition,
                offset=chunk.offsets[i],
            )


def _raise_bad_record(
    chunk: Chunk,
    values: list[bytes],
    explicit: pa.Schema | None,
    block_size: int,
    error: Exception,
    max_depth: int = MAX_DEPTH_DEFAULT,
    allow_non_numeric: bool = False,
    extra: str = "infer",
) -> None:
    """Find the first record that is no JSON object at all (screen), else the first whose prefix fails to
    parse (bisection: a type the table does not take), and raise naming it."""
    for i, v in enumerate(values):
        found = screen(v, max_depth, allow_non_numeric)
        if found is not None:
            raise RecordError(
                f"record is not a valid JSON object ({found[0]}: {found[1]})",
                topic=chunk.topic,
                partition=chunk.partition,
                offset=chunk.offsets[i],
            ) from error

    def fails(k: int) -> bool:
        try:
            _parse_settled(b"\n".join(values[:k]), explicit, block_size, extra)
            return False
        except pa.ArrowInvalid:
            return True

    lo, hi = 0, len(values)
    if not fails(hi):  # the failure needed the whole buffer: report the chunk
        raise RecordError(
            f"chunk of {len(values)} records could not be decoded: {error}",
            topic=chunk.topic,
            partition=chunk.partition,
            offset=chunk.offsets[0],
        ) from error
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid
    bad = hi - 1
    try:
        _parse(values[bad], explicit, block_size, extra)
        reason = str(error)
    except pa.ArrowInvalid as e:
        reason = str(e)
    preview = values[bad][:120]
    raise RecordError(
        f"record is not a valid JSON object for this table ({reason}); value starts with {preview!r}",
        topic=chunk.topic,
        partition=chunk.partition,
        offset=chunk.offsets[bad],
    ) from error


def decode_json_lenient(
    chunk: Chunk, explicit: pa.Schema | None, max_depth: int = MAX_DEPTH_DEFAULT, allow_non_numeric: bool = False, extra: str = "infer"
) -> tuple[pa.Table, list[BadRecord]]:
    """Like :func:`decode_json`, but records that cannot be decoded are returned apart, not raised.

    Success path: one parse of the whole chunk, as ``decode_json``. Error path only: each record is
    screened (tombstone, empty, invalid UTF-8, invalid JSON, not an object); the rest is split in halves
    until every failing piece is a single record (type mismatches: a few parses per bad record).
    Returns the good records' table, in chunk order, and the bad records.
    """
    try:
        return decode_json(chunk, explicit, max_depth, allow_non_numeric, extra), []
    except RecordError:
        pass
    values = chunk.values
    bad: dict[int, BadRecord] = {}
    clean: dict[int, bytes] = {}
    for i, v in enumerate(values):
        # Cheap per-record screen (error path only): records that are not JSON objects at all never reach
        # the halving below, which then only has type mismatches left to find (usually none: one parse).
        problem = screen(v, max_depth, allow_non_numeric)
        if problem is not None:
            bad[i] = BadRecord(i, *problem)
        else:
            clean[i] = v.replace(b"\r", b" ").replace(b"\n", b" ")  # type: ignore[union-attr]  # screen refuses a null
    candidates = list(clean)
    block_size = max([MIN_BLOCK_SIZE, *(2 * len(v) + 1 for v in clean.values())])
    schema = readable_schema(explicit) if explicit is not None else None
    for _ in range(8):  # each round fixes the types of fields the table does not have yet
        good, failed = _isolate(candidates, clean, schema, block_size, extra)
        if not good:
            table = pa.table({})
            bad.update(failed)
            break
        buf = b"\n".join(clean[i] for i in good)
        try:
            table = _parse_settled(buf, schema, block_size, extra)
        except pa.ArrowInvalid:
            # Good pieces disagree on a field's type (first seen wins): take the first piece's types.
            first = _parse_settled(clean[good[0]], schema, block_size, extra)
            schema = settle_schema(first.schema, schema)
            continue
        if table.num_rows != len(good):
            raise RecordError(
                f"chunk of {len(values)} records decoded to {table.num_rows} rows",
                topic=chunk.topic,
                partition=chunk.partition,
                offset=chunk.offsets[0],
            )
        bad.update(failed)
        break
    else:
        raise RecordError(
            f"chunk of {len(values)} records: field types could not be settled",
            topic=chunk.topic,
            partition=chunk.partition,
            offset=chunk.offsets[0],
        )
    return table, [bad[i] for i in sorted(bad)]


def json_depth(doc: object) -> int:
    """Nesting depth of a loaded JSON document (1 for a flat object), without recursion (error path)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            deepest = max(deepest, d)
            stack.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            deepest = max(deepest, d)
            stack.extend((v, d + 1) for v in node)
    return deepest


class _Unrepresentable(ValueError):
    """A number token JSON cannot hold exactly (raised by the screen's number hooks)."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


def _refuse_constant(token: str) -> float:
    raise _Unrepresentable("InvalidJson", f"{token} is not a JSON number (format.allow_non_numeric_numbers is off)")


def _checked_int(token: str) -> int:
    digits = token.lstrip("-")
    value = int(token) if len(digits) <= 20 else None  # longer ones never fit (and int() caps digits)
    if value is None or not -(1 << 63) <= value < (1 << 63):
        raise _Unrepresentable(
            "NumberOutOfRange", f"integer {token[:40]}{'...' if len(token) > 40 else ''} is outside the signed 64-bit range"
        )
    return value


def _checked_float(token: str) -> float:
    value = float(token)
    if value in (float("inf"), float("-inf")):
        raise _Unrepresentable("NumberOutOfRange", f"number {token[:40]} is too large for a double")
    return value


def screen(v: bytes | None, max_depth: int = MAX_DEPTH_DEFAULT, allow_non_numeric: bool = False) -> tuple[str, str] | None:
    """(error class, message) for a value that is no usable JSON object, else None (error path only)."""
    if v is None:
        return "Tombstone", "record has a null value (tombstone); JSON pipelines need an object per record"
    if not v.strip():
        return "EmptyValue", "record value is empty or whitespace; expected a JSON object"
    hooks: dict[str, Any] = {"parse_int": _checked_int, "parse_float": _checked_float}
    if not allow_non_numeric:
        hooks["parse_constant"] = _refuse_constant
    try:
        doc = json.loads(v.decode("utf-8"), **hooks)
    except UnicodeDecodeError:
        return "InvalidUtf8", f"value is not valid UTF-8; value starts with {v[:120]!r}"
    except RecursionError:
        return "TooDeep", f"value nests deeper than format.max_nesting_depth ({max_depth}); value starts with {v[:120]!r}"
    except _Unrepresentable as e:
        return e.error_class, f"{e}; value starts with {v[:120]!r}"
    except ValueError as e:
        return "InvalidJson", f"JSON parse error: {e}; value starts with {v[:120]!r}"
    if doc is None:
        return "TypeMismatch", f"value is JSON null, not an object; value starts with {v[:120]!r}"
    if not isinstance(doc, dict):
        return "TypeMismatch", f"value is a JSON {type(doc).__name__}, not an object; value starts with {v[:120]!r}"
    if json_depth(doc) > max_depth:
        return "TooDeep", f"value nests deeper than format.max_nesting_depth ({max_depth}); value starts with {v[:120]!r}"
    return None


def _isolate(
    indices: list[int], values: dict[int, bytes], schema: pa.Schema | None, block_size: int, extra: str = "infer"
) -> tuple[list[int], dict[int, BadRecord]]:
    """Split ``indices`` until each failing piece is one record. Returns good indices (in order) and bad ones."""
    if not indices:
        return [], {}
    try:
        _parse_settled(b"\n".join(values[i] for i in indices), schema, block_size, extra)
        return indices, {}
    except pa.ArrowInvalid as e:
        if len(indices) == 1:  # valid JSON objects (screened): what Arrow rejects is a type
            i = indices[0]
            reason = str(e).splitlines()[0].replace(" in row 0", "")
            kind = "TypeMismatch" if "changed from" in reason or "conversion" in reason.lower() else "InvalidJson"
            return [], {i: BadRecord(i, kind, f"{reason}; value starts with {values[i][:120]!r}")}
    mid = len(indices) // 2
    good_a, bad_a = _isolate(indices[:mid], values, schema, block_size, extra)
    good_b, bad_b = _isolate(indices[mid:], values, schema, block_size, extra)
    return good_a + good_b, {**bad_a, **bad_b}


def decode(chunk: Chunk, ctx: DecodeContext) -> tuple[pa.Table, list[BadRecord]]:
    """Registry entry for ``json``: strict (first bad record raises) or lenient (bad records isolated)."""
    if ctx.strict:
        return decode_json(chunk, ctx.explicit, ctx.max_depth, ctx.allow_non_numeric), []
    return decode_json_lenient(chunk, ctx.explicit, ctx.max_depth, ctx.allow_non_numeric)
