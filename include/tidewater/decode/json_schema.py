"""A JSON Schema as the columns of a table: the Arrow schema that values of a ``json_schema`` topic are parsed with,
instead of types inferred from the values (``decode/json.py``), and the paths every value must hold.

This module is the schema half of the ``json_schema`` value format (issue 44): pure, no registry and no records. The
format's decoder is not registered in ``config/formats.py`` yet, so ``format.value: json_schema`` is still refused.

The mapping (Confluent's JSON Schema converter maps the same way where both define one):

- ``integer`` -> int64; ``number`` -> float64; ``boolean`` -> bool; ``string`` -> string, except ``format: date-time``
  -> timestamp (microseconds, UTC) and ``format: date`` -> date32; ``enum`` of strings (without ``type``) -> string;
- ``object`` with ``properties`` -> a struct of them, in the order they are declared; ``array`` -> a list of its
  ``items``;
- a type list with ``"null"`` (``["string", "null"]``), or ``oneOf``/``anyOf`` of one type and ``{"type": "null"}``,
  is that type; local ``$ref`` (``#/$defs/...``, ``#/definitions/...``) is followed.

Arrow's JSON reader does not parse dates from strings: ``reader_schema`` is the schema to parse with (the date-time
and date columns as strings, their paths in ``formats``), converted to the table's types after the parse.

Every column is nullable in Arrow; ``required`` is returned as paths (``a``, ``a.b`` for ``b`` required inside a
required ``a``), for a vectorized null check after parsing. A schema this cannot map (several types for one field,
an object without properties, a recursive ``$ref``) is refused with a ``TerminalError`` naming the path: a table
needs one type per column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from tidewater.errors import TerminalError

SCALARS = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_(), "string": pa.string()}
FORMATS = {"date-time": pa.timestamp("us", tz="UTC"), "date": pa.date32()}


@dataclass(frozen=True)
class Columns:
    schema: pa.Schema  # the values' columns, every field nullable
    required: tuple[str, ...]  # dotted paths a value must hold (a required field inside a required object)
    formats: dict[str, str]  # dotted path -> "date-time" or "date": strings in the values, converted after the parse

    def reader_schema(self) -> pa.Schema:
        """The schema Arrow's JSON reader parses the values with: the ``formats`` columns as strings."""
        def walk(fields: list[pa.Field], prefix: str) -> list[pa.Field]:
            out = []
            for f in fields:
                path = prefix + f.name
                if path in self.formats:
                    out.append(pa.field(f.name, pa.string()))
                elif pa.types.is_struct(f.type):
                    out.append(pa.field(f.name, pa.struct(walk(list(f.type), path + "."))))
                else:
                    out.append(f)
            return out

        return pa.schema(walk(list(self.schema), ""))


def columns(doc: dict[str, Any]) -> Columns:
    """The columns of a JSON Schema whose root is an object with ``properties``."""
    mapper = _Mapper(doc)
    root = mapper.resolve(doc, "$")
    if _kind(root, "$") != "object":
        raise TerminalError("JSON Schema: the root must be an object with properties (a row's columns), not "
                            f"{_kind(root, '$')!r}")
    fields, required = mapper.struct(root, "")
    return Columns(pa.schema(fields), tuple(required), dict(mapper.formats))


class _Mapper:
    """Walks one document: ``$ref`` is resolved against it, and a reference met again inside itself is refused."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.active: list[str] = []
        self.formats: dict[str, str] = {}  # the date-time and date columns met (not inside lists)

    def resolve(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        ref = node.get("$ref")
        if ref is None:
            return node
        if not ref.startswith("#/"):
            raise TerminalError(f"JSON Schema at {path}: $ref {ref!r} is not in the same document (only local "
                                "references, #/$defs/... or #/definitions/..., are followed)")
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
            raise TerminalError(f"JSON Schema at {prefix or '$'}: an object without properties has no columns to "
                                "map (give its properties)")
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

    def field(self, node: dict[str, Any], path: str) -> tuple[pa.DataType, list[str]]:
        ref = node.get("$ref")
        if ref is not None and ref in self.active:
            raise TerminalError(f"JSON Schema at {path}: $ref {ref!r} refers to itself; a table's columns cannot "
                                "nest without end")
        if ref is not None:
            self.active.append(ref)
        try:
            node = _without_null(self.resolve(node, path), path)
            kind = _kind(node, path)
            if kind == "object":
                fields, inner = self.struct(node, path)
                return pa.struct(fields), inner
            if kind == "array":
                items = node.get("items")
                if not isinstance(items, dict):
                    raise TerminalError(f"JSON Schema at {path}: an array needs one schema for its items")
                item, _ = self.field(items, f"{path}[]")
                return pa.list_(item), []
            if kind == "string" and node.get("format") in FORMATS:
                if "[]" not in path:  # a list of dates stays a list of strings: converting its items is not done
                    self.formats[path] = node["format"]
                    return FORMATS[node["format"]], []
                return pa.string(), []
            return SCALARS[kind], []
        finally:
            if ref is not None:
                self.active.pop()


def _without_null(node: dict[str, Any], path: str) -> dict[str, Any]:
    """``node`` with a ``null`` alternative removed (a nullable field is its other type)."""
    for key in ("oneOf", "anyOf"):
        options = node.get(key)
        if options is None:
            continue
        kept = [o for o in options if o.get("type") != "null"]
        if len(kept) != 1:
            raise TerminalError(f"JSON Schema at {path}: {key} of {len(kept)} types; a column has one type "
                                "(and may be null)")
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
    if kind is None and "properties" in node:
        return "object"
    if kind is None and all(isinstance(v, str) for v in node.get("enum") or [None]):
        return "string"
    if kind not in (*SCALARS, "object", "array"):
        raise TerminalError(f"JSON Schema at {path}: type {kind!r} cannot be a column (one of integer, number, "
                            "boolean, string, object, array)")
    return str(kind)
