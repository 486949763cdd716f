"""A JSON Schema as the columns of a table: the Arrow schema that values of a ``json_schema`` topic are parsed with,
instead of types inferred from the values (``decode/json.py``), and the paths every value must hold.

``decode`` is the ``json_schema`` value format: Confluent's JSON Schema wire format (magic byte 0, a 4-byte big-endian
schema id, the JSON document), the schema fetched from the registry by id (``schemaType: JSON``). Each schema id's
values are parsed in one pass by Arrow's JSON reader with that schema's columns (``decode/json.py``; fields the schema
does not name are ignored, as Confluent's converter ignores them), then the date-time and date strings are converted
and the required paths checked, column by column. A record that breaks its schema (a value of another type, a date
that is not one, a required field missing) is a dead letter of class ``SchemaViolation`` naming the path; a value
without the framing is ``NotConfluentJsonSchema``, an id the registry does not know (or not a JSON Schema)
``UnknownSchemaId``; a registered schema that cannot be a table's columns ``UnmappableSchema`` (below). The framing
and the per-schema-id loop are the registry formats' skeleton (``decode/framed.py``).

The mapping (Confluent's JSON Schema converter maps the same way where both define one):

- ``integer`` -> int64; ``number`` -> float64; ``boolean`` -> bool; ``string`` -> string, except ``format: date-time``
  -> timestamp (microseconds, UTC) and ``format: date`` -> date32; ``enum`` of strings (without ``type``) -> string;
- ``object`` with ``properties`` -> a struct of them, in the order they are declared (its ``additionalProperties``,
  if any, are not columns: keys the properties do not name are ignored, as undeclared fields are); ``array`` -> a
  list of its ``items``;
- ``object`` without ``properties`` whose ``additionalProperties`` is a schema (the usual way to write a map), or
  with one ``patternProperties`` schema -> ``map<string, T>``, T that schema's type, as a Protobuf map; a key whose
  value is null is left out of the map. A map inside a list is not mapped;
- a type list with ``"null"`` (``["string", "null"]``), or ``oneOf``/``anyOf`` of one type and ``{"type": "null"}``,
  is that type; local ``$ref`` (``#/$defs/...``, ``#/definitions/...``) is followed;
- ``allOf`` is merged (properties and required together: a schema extending a base); ``oneOf``/``anyOf`` of several
  objects is one struct of all their properties (required: what every alternative requires); ``const`` and ``enum``
  without ``type`` are their values' type (integers among numbers: number).

Arrow's JSON reader does not parse dates from strings, nor objects into maps: ``reader_schema`` is the schema to
parse with (the date-time and date columns as strings, their paths in ``formats``; the map columns left out, their
paths in ``maps``), converted to the table's types after the parse. A schema with maps is parsed with Arrow inferring
the fields the reader schema does not name, so each map comes back as a struct of the keys its chunk holds; the
struct's columns become the map's entries in one vectorized pass (``_to_map``).

Every column is nullable in Arrow; ``required`` is returned as paths (``a``, ``a.b`` for ``b`` required inside a
required ``a``), for a vectorized null check after parsing. A schema this cannot map (several types for one field,
an object without properties or a map's schema, a recursive ``$ref``) is refused with a ``TerminalError`` naming the
path: a table needs one type per column. In the decoder that refusal is per schema id: that id's records are dead
letters of class ``UnmappableSchema`` naming the id and the path, and the topic's other records go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidewater.decode.arrow_types import Rebuilt, rebuilt_schema
from tidewater.decode.framed import Part, SchemaGroup, SchemaRefused, by_schema_id
from tidewater.decode.json import decode_json_lenient
from tidewater.decode.records import BadRecord, DecodeContext
from tidewater.errors import TerminalError
from tidewater.source.kafka import Chunk

SCALARS = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_(), "string": pa.string()}
FORMATS = {"date-time": pa.timestamp("us", tz="UTC"), "date": pa.date32()}


@dataclass(frozen=True)
class Columns:
    schema: pa.Schema  # the values' columns, every field nullable
    required: tuple[str, ...]  # dotted paths a value must hold (a required field inside a required object)
    formats: dict[str, str]  # dotted path -> "date-time" or "date": strings in the values, converted after the parse
    maps: tuple[str, ...] = ()  # dotted paths of the map columns: parsed as inferred structs, converted after

    def reader_schema(self) -> pa.Schema:
        """The schema Arrow's JSON reader parses the values with: the ``formats`` columns as strings, the ``maps``
        left out (inferred)."""
        return rebuilt_schema(self.schema, _ReaderColumns(self))


class _ReaderColumns(Rebuilt):
    """``Columns.reader_schema``: inside structs (not lists or maps), a ``formats`` path as a string and a ``maps``
    path left out; a rebuilt struct's field nullable, any other field as it is."""

    into_maps = False

    def __init__(self, cols: Columns) -> None:
        self.cols = cols

    def field(self, f: pa.Field, result: pa.DataType | pa.Field | None) -> pa.Field | None:
        path = ".".join(self.path)
        if path in self.cols.maps:
            return None
        if path in self.cols.formats:
            return pa.field(f.name, pa.string())
        return pa.field(f.name, result) if pa.types.is_struct(f.type) and result is not None else f

    def list(self, t: pa.DataType, element: pa.DataType | pa.Field | None) -> pa.DataType:
        return t


def columns(doc: dict[str, Any]) -> Columns:
    """The columns of a JSON Schema whose root is an object with ``properties``."""
    mapper = _Mapper(doc)
    root = mapper.combined(mapper.resolve(doc, "$"), "$")
    if _kind(root, "$") != "object":
        raise TerminalError(f"JSON Schema: the root must be an object with properties (a row's columns), not {_kind(root, '$')!r}")
    fields, required = mapper.struct(root, "")
    return Columns(pa.schema(fields), tuple(required), dict(mapper.formats), tuple(mapper.maps))


class _Mapper:
    """Walks one document: ``$ref`` is resolved against it, and a reference met again inside itself is refused."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.active: list[str] = []
        self.formats: dict[str, str] = {}  # the date-time and date columns met (not inside lists or maps)
        self.maps: list[str] = []  # the map columns met

    def resolve(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        ref = node.get("$ref")
        if ref is None:
            return node
        if not ref.startswith("#/"):
            raise TerminalError(
                f"JSON Schema at {path}: $ref {ref!r} is not in the same document (only local "
                "references, #/$defs/... or #/definitions/..., are followed)"
            )
        target: Any = self.doc
        for part in ref[2:].split("/"):
            if not isinstance(target, dict) or part not in target:
                raise TerminalError(f"JSON Schema at {path}: $ref {ref!r} names nothing in the document")
            target = target[part]
        return {**target, **{k: v for k, v in node.items() if k != "$ref"}}

    def struct(self, node: dict[str, Any], prefix: str) -> tuple[list[pa.Field], list[str]]:
        """(fields, required paths) of an object's properties; nested required paths only under required parents."""
        props = node.get("properties")
        if not isinstance(props, dict) or not props:
            raise TerminalError(f"JSON Schema at {prefix or '$'}: an object without properties has no columns to map (give its properties)")
        required = set(node.get("required") or ())
        fields: list[pa.Field] = []
        paths: list[str] = []
        for name, sub in props.items():
            path = f"{prefix}.{name}" if prefix else name
            arrow, inner = self.field(sub, path)
            fields.append(pa.field(name, arrow, nullable=True))
            if name in required:
                paths += [path, *inner]
        return fields, paths

    def combined(self, node: dict[str, Any], path: str, depth: int = 0) -> dict[str, Any]:
        """``node`` with ``allOf`` merged into it (properties together, required together: how a schema extends a
        base), and ``oneOf``/``anyOf`` of several objects as one object of all their properties (required: those every
        alternative requires). A property two parts give different schemas is refused by path."""
        if depth > 32:
            raise TerminalError(f"JSON Schema at {path}: allOf/oneOf/anyOf nest more than 32 deep (a reference to itself?)")
        parts = node.get("allOf")
        if isinstance(parts, list):
            merged = {k: v for k, v in node.items() if k != "allOf"}
            for i, part in enumerate(parts):
                if isinstance(part, dict):
                    merged = _merged(merged, self.combined(self.resolve(part, path), path, depth + 1), f"{path} allOf[{i}]")
            node = merged
        for key in ("oneOf", "anyOf"):
            options = node.get(key)
            if not isinstance(options, list):
                continue
            kept = [
                self.combined(self.resolve(o, path), path, depth + 1) for o in options if isinstance(o, dict) and o.get("type") != "null"
            ]
            if len(kept) < 2 or not all(_kind(o, path) == "object" and o.get("properties") for o in kept):
                return node  # one type and null, or alternatives of other kinds: _without_null decides
            props: dict[str, Any] = {}
            for o in kept:
                for name, sub in o["properties"].items():
                    if name in props and props[name] != sub:
                        raise TerminalError(
                            f"JSON Schema at {path}.{name}: the alternatives of {key} give it different schemas; a column has one type"
                        )
                    props[name] = sub
            required = set.intersection(*(set(o.get("required") or ()) for o in kept))
            rest = {k: v for k, v in node.items() if k != key}
            return {
                **rest,
                "type": "object",
                "properties": {**(rest.get("properties") or {}), **props},
                "required": sorted(set(rest.get("required") or ()) | required),
            }
        return node

    def map(self, item: dict[str, Any], path: str) -> pa.DataType:
        """``map<string, T>`` of an object whose values all follow ``item``."""
        if "[]" in path or "{}" in path:
            raise TerminalError(f"JSON Schema at {path}: a map inside a list or a map is not mapped to a column")
        value, _ = self.field(item, f"{path}{{}}")
        self.maps.append(path)
        return pa.map_(pa.string(), value)

    def field(self, node: dict[str, Any], path: str) -> tuple[pa.DataType, list[str]]:
        ref = node.get("$ref")
        if ref is not None and ref in self.active:
            raise TerminalError(f"JSON Schema at {path}: $ref {ref!r} refers to itself; a table's columns cannot nest without end")
        if ref is not None:
            self.active.append(ref)
        try:
            node = _without_null(self.combined(self.resolve(node, path), path), path)
            kind = _kind(node, path)
            if kind == "object":
                item = _map_item(node)
                if item is not None and not node.get("properties"):
                    return self.map(item, path), []
                fields, inner = self.struct(node, path)
                return pa.struct(fields), inner
            if kind == "array":
                items = node.get("items")
                if not isinstance(items, dict):
                    raise TerminalError(f"JSON Schema at {path}: an array needs one schema for its items")
                item, _ = self.field(items, f"{path}[]")
                return pa.list_(item), []
            if kind == "string" and node.get("format") in FORMATS:
                if "{}" in path:  # a map's dates are converted with its entries (_to_map)
                    return FORMATS[node["format"]], []
                if "[]" not in path:  # a list of dates stays a list of strings: converting its items is not done
                    self.formats[path] = node["format"]
                    return FORMATS[node["format"]], []
                return pa.string(), []
            return SCALARS[kind], []
        finally:
            if ref is not None:
                self.active.pop()


def _merged(into: dict[str, Any], part: dict[str, Any], where: str) -> dict[str, Any]:
    """``into`` with one ``allOf`` part merged in."""
    out = dict(into)
    for k, v in part.items():
        if k == "properties":
            props = dict(out.get("properties") or {})
            for name, sub in v.items():
                before, after = props.get(name, {}).get("type"), sub.get("type")
                if before and after and before != after:
                    raise TerminalError(f"JSON Schema at {where}: property {name!r} is {before!r} in one part and {after!r} in another")
                props[name] = {**props.get(name, {}), **sub}
            out["properties"] = props
        elif k == "required":
            out["required"] = sorted(set(out.get("required") or ()) | set(v))
        elif k == "type" and out.get("type") not in (None, v):
            raise TerminalError(f"JSON Schema at {where}: type {v!r} where another part says {out['type']!r}")
        else:
            out.setdefault(k, v)
    return out


_CONST_KINDS = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))


def _value_kind(values: list[Any]) -> str | None:
    """The one JSON type of ``const``/``enum`` values (integers among numbers make numbers), or None."""
    kinds = {next((k for t, k in _CONST_KINDS if isinstance(v, t)), None) for v in values if v is not None}
    if kinds == {"integer", "number"}:
        return "number"
    return kinds.pop() if len(kinds) == 1 and None not in kinds else None


def _map_item(node: dict[str, Any]) -> dict[str, Any] | None:
    """The schema of an object's values when it is a map: its ``additionalProperties`` schema, or its one
    ``patternProperties`` schema."""
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and extra:
        return extra
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict) and len(patterns) == 1:
        only = next(iter(patterns.values()))
        return only if isinstance(only, dict) else None
    return None


def _without_null(node: dict[str, Any], path: str) -> dict[str, Any]:
    """``node`` with a ``null`` alternative removed (a nullable field is its other type)."""
    for key in ("oneOf", "anyOf"):
        options = node.get(key)
        if options is None:
            continue
        kept = [o for o in options if o.get("type") != "null"]
        if len(kept) != 1:
            raise TerminalError(f"JSON Schema at {path}: {key} of {len(kept)} types; a column has one type (and may be null)")
        return {**{k: v for k, v in node.items() if k != key}, **kept[0]}
    types = node.get("type")
    if isinstance(types, list):
        kept = [t for t in types if t != "null"]
        if len(kept) != 1:
            raise TerminalError(f"JSON Schema at {path}: type {types!r}; a column has one type (and may be null)")
        return {**node, "type": kept[0]}
    return node


def _kind(node: dict[str, Any], path: str) -> str:
    kind = node.get("type")
    if kind is None and ("properties" in node or _map_item(node) is not None):
        return "object"
    if kind is None and ("enum" in node or "const" in node):
        kind = _value_kind(list(node.get("enum") or []) + ([node["const"]] if "const" in node else []))
        if kind is None:
            raise TerminalError(f"JSON Schema at {path}: enum or const values of several types (or objects, lists); a column has one type")
    if kind not in (*SCALARS, "object", "array"):
        raise TerminalError(
            f"JSON Schema at {path}: type {kind!r} cannot be a column (one of integer, number, boolean, string, object, array)"
        )
    return str(kind)


# ---- the format: framed values, parsed per schema id -------------------------------------------

NOT_FRAMED = "NotConfluentJsonSchema"
VIOLATION = "SchemaViolation"
UNMAPPABLE = "UnmappableSchema"


def decode(chunk: Chunk, ctx: DecodeContext) -> tuple[pa.Table, list[BadRecord]]:
    """Registry entry for ``json_schema`` (see the module docstring). Rows come back in chunk order, the bad records
    apart; an unreachable registry fails the batch (``TransientError``: nothing is committed, retrying is safe)."""

    def look_up(schema_id: int) -> Columns:
        doc = ctx.registry.json_schema(schema_id)  # refused credentials stay terminal: they are no schema's fault
        try:
            return columns(doc)
        except TerminalError as e:  # this id's records wait as dead letters; the topic's others go on
            raise SchemaRefused(UNMAPPABLE, f"schema id {schema_id} cannot be a table's columns: {e}") from None

    def rows_of(group: SchemaGroup, cols: Columns, bad: dict[int, BadRecord]) -> list[Part]:
        rows, kept, found = _parsed(chunk, group.at, group.bodies, cols, group.schema_id, ctx)
        bad.update(found)
        return [Part(rows, kept, f"schema id {group.schema_id}")]

    return by_schema_id(chunk, NOT_FRAMED, look_up, rows_of, table=ctx)


def _parsed(
    chunk: Chunk, at: np.ndarray, bodies: pa.Array, cols: Columns, schema_id: int, ctx: DecodeContext
) -> tuple[pa.Table, np.ndarray, dict[int, BadRecord]]:
    """One schema id's records (chunk positions ``at``): their rows with the schema's types, the chunk position of
    each row, and the records that break the schema."""
    offsets = [chunk.offsets[i] for i in at.tolist()]
    sub = Chunk(chunk.topic, chunk.partition, bodies.to_pylist(), offsets, [chunk.timestamps[i] for i in at.tolist()])
    extra = "infer" if cols.maps else "ignore"  # maps come back as structs of their keys (see the module docstring)
    rows, failed = decode_json_lenient(sub, cols.reader_schema(), ctx.max_depth, ctx.allow_non_numeric, extra=extra)
    bad = {
        int(at[b.index]): BadRecord(
            int(at[b.index]), VIOLATION if b.error_class == "TypeMismatch" else b.error_class, f"schema id {schema_id}: {b.message}"
        )
        for b in failed
    }
    kept = np.delete(at, [b.index for b in failed])
    if rows.num_rows == 0:
        return rows, kept[:0], bad
    rows, broken = _typed(rows, cols)
    for r, why in _missing(rows, cols.required).items():
        broken.setdefault(r, why)  # a required date that is not one is null now: its own reason comes first
    if broken:
        bad.update({int(kept[r]): BadRecord(int(kept[r]), VIOLATION, f"schema id {schema_id}: {why}") for r, why in broken.items()})
        keep = np.ones(rows.num_rows, dtype=bool)
        keep[list(broken)] = False
        rows, kept = rows.filter(pa.array(keep)), kept[keep]
    return rows, kept, bad


def _typed(rows: pa.Table, cols: Columns) -> tuple[pa.Table, dict[int, str]]:
    """``rows`` (parsed with ``reader_schema``) with the schema's types: date-time and date strings converted. A value
    that is not one is null in the result and its row returned (row -> the path and the value)."""
    broken: dict[int, str] = {}
    arrays = [_converted(_column(rows, f.name), f.type, f.name, broken) for f in cols.schema]
    return pa.Table.from_arrays(arrays, schema=cols.schema), broken


def _column(rows: pa.Table, name: str) -> pa.Array:
    """A parsed column; a map column no value of the chunk held was not inferred: all null."""
    if name not in rows.column_names:
        return pa.nulls(rows.num_rows)
    return rows.column(name).combine_chunks()


def _converted(arr: pa.Array, target: pa.DataType, path: str, broken: dict[int, str]) -> pa.Array:
    if arr.type == target:
        return arr
    if pa.types.is_map(target):
        return _to_map(arr, target, path, broken)
    if pa.types.is_struct(target):
        by_name = {f.name: i for i, f in enumerate(arr.type)} if pa.types.is_struct(arr.type) else {}
        children = [
            _converted(arr.field(by_name[f.name]) if f.name in by_name else pa.nulls(len(arr)), f.type, f"{path}.{f.name}", broken)
            for f in target
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=arr.is_null())
    try:
        return pc.cast(arr, target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    out = []  # error path: the column holds a value that is not a date-time (or date); find which, one by one
    for r, v in enumerate(arr.to_pylist()):
        try:
            out.append(None if v is None else pc.cast(pa.array([v]), target)[0].as_py())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            broken.setdefault(r, f"{path}: {v!r} is not a {_format_name(target)}")
            out.append(None)
    return pa.array(out, target)


def _to_map(arr: pa.Array, target: pa.MapType, path: str, broken: dict[int, str]) -> pa.Array:
    """A map column from the struct Arrow inferred for it (one field per key its chunk holds): row r's entries are
    the fields with a value in row r, in the struct's order. Vectorized: a rows x keys validity matrix gives the
    offsets, and one ``take`` over the fields' values (cast to the map's value type) gives the items."""
    n = len(arr)
    if pa.types.is_null(arr.type) or not pa.types.is_struct(arr.type) or arr.type.num_fields == 0:
        empty = pa.array(np.zeros(n + 1, dtype=np.int32))
        return pa.MapArray.from_arrays(empty, pa.array([], pa.string()), pa.array([], target.item_type), type=target, mask=arr.is_null())
    names = [f.name for f in arr.type]
    fields = arr.flatten()  # each key's values, null where the row is null
    values = [_converted(f, target.item_type, f"{path}.{name}", broken) for name, f in zip(names, fields)]
    valid = np.column_stack([np.asarray(pc.is_valid(v)) for v in values])
    counts = valid.sum(axis=1)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    rows, cols = np.nonzero(valid)  # row-major: each row's entries together, in key order
    keys = pa.array(np.asarray(names, dtype=object)[cols], pa.string())
    items = pa.concat_arrays(values).take(pa.array(cols.astype(np.int64) * n + rows))
    return pa.MapArray.from_arrays(offsets, keys, items, type=target, mask=arr.is_null())


def _format_name(t: pa.DataType) -> str:
    if pa.types.is_timestamp(t):
        return "date-time with a zone offset (RFC 3339)"
    if pa.types.is_date(t):
        return "date (YYYY-MM-DD)"
    return f"value of type {t} (a map's values)"


def _missing(rows: pa.Table, required: tuple[str, ...]) -> dict[int, str]:
    """Rows without a value at a required path: row -> the path (vectorized per path; Python over the rows found)."""
    out: dict[int, str] = {}
    for path in required:
        head, *rest = path.split(".")
        arr = rows.column(head).combine_chunks()
        for name in rest:
            arr = pc.struct_field(arr, name)
        for r in pc.indices_nonzero(pc.is_null(arr)).to_pylist():
            out.setdefault(r, f"{path}: required, missing or null")
    return out
