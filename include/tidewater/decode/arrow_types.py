"""One walk over Arrow types: a visitor in the shape of pyiceberg's ``visit_pyarrow`` (post-order: a struct's method
gets its fields' results, a list's its element's, a map's its key's and value's), which also keeps the path of what
it visits (``path``: field names, ``element`` inside a list, ``key`` and ``value`` inside a map, as Iceberg names
them).

Why not pyiceberg's own visitor: importing ``pyiceberg.io.pyarrow`` costs about half a second, which the decoders'
and the schema checks' processes do not otherwise pay (a one-record batch's latency counts it), and it has no path.
``Rebuilt`` is the usual subclass: it rebuilds the type it visits, and its subclasses change what they need
(timestamps to microseconds, large layouts to small, fields left out).

Two walks stay apart, each for a reason its docstring gives: ``table.limits.field_paths`` (its order names the
field in a dead letter's message, which is on disk) and ``decode.json.schema_depth`` (inferred types as deep as a
record can make them: no recursion). The walks over two types at once (``records.type_conflicts``, a table's type
and a decoded one) compare rather than visit, and stay as they are.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import pyarrow as pa

T = TypeVar("T")
Path = tuple[str, ...]


class TypeVisitor(Generic[T]):
    """What ``visit`` calls, children first. ``path`` is the path of what is being visited (in ``field``: the
    field's own path)."""

    path: Path = ()

    def struct(self, t: pa.StructType, fields: list[T]) -> T:
        raise NotImplementedError

    def field(self, f: pa.Field, result: T) -> T:
        raise NotImplementedError

    def list(self, t: pa.DataType, element: T) -> T:
        """A list, large list or fixed-size list (``t.value_type`` its element type)."""
        raise NotImplementedError

    def map(self, t: pa.MapType, key: T, value: T) -> T:
        raise NotImplementedError

    def primitive(self, t: pa.DataType) -> T:
        raise NotImplementedError


def visit(t: pa.DataType, visitor: TypeVisitor[T], path: Path = ()) -> T:
    """``visitor``'s result for ``t``, whose path is ``path``."""
    visitor.path = path
    if pa.types.is_struct(t):
        fields = _fields(t, visitor, path)
        visitor.path = path
        return visitor.struct(t, fields)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        element = visit(t.value_type, visitor, (*path, "element"))
        visitor.path = path
        return visitor.list(t, element)
    if pa.types.is_map(t):
        key = visit(t.key_type, visitor, (*path, "key"))
        value = visit(t.item_type, visitor, (*path, "value"))
        visitor.path = path
        return visitor.map(t, key, value)
    return visitor.primitive(t)


def visit_fields(schema: pa.Schema, visitor: TypeVisitor[T]) -> list[T]:
    """``visitor``'s result for each field of ``schema`` (its ``field``'s)."""
    return _fields(schema, visitor, ())


def _fields(t: pa.StructType | pa.Schema, visitor: TypeVisitor[T], path: Path) -> list[T]:
    out = []
    for f in t:
        result = visit(f.type, visitor, (*path, f.name))
        visitor.path = (*path, f.name)
        out.append(visitor.field(f, result))
    return out


class Rebuilt(TypeVisitor["pa.DataType | pa.Field | None"]):
    """The type rebuilt from its parts, as it is unless a subclass changes a part: a field keeps its name and
    nullability (not its metadata); a part that comes back None is left out (a struct left with no field is kept
    empty; a list or a field of None is None); a list keeps its layout (list or large list), a fixed-size list is
    kept as it is. Three settings a subclass may turn off, in place of writing the part again:"""

    into_maps = True  # False: a map is kept as it is (its key and value not rebuilt)
    large_lists = True  # False: a large list becomes a list
    keep_nullability = True  # False: every field comes out nullable

    def struct(self, t: pa.StructType, fields: list[pa.DataType | pa.Field | None]) -> pa.DataType | None:
        return pa.struct([f for f in fields if isinstance(f, pa.Field)])

    def field(self, f: pa.Field, result: pa.DataType | pa.Field | None) -> pa.Field | None:
        return None if result is None else pa.field(f.name, result, f.nullable or not self.keep_nullability)

    def list(self, t: pa.DataType, element: pa.DataType | pa.Field | None) -> pa.DataType | None:
        if pa.types.is_fixed_size_list(t):
            return t
        if element is None:
            return None
        return pa.large_list(element) if pa.types.is_large_list(t) and self.large_lists else pa.list_(element)

    def map(self, t: pa.MapType, key: pa.DataType | pa.Field | None, value: pa.DataType | pa.Field | None) -> pa.DataType | None:
        if not self.into_maps:
            return t
        return None if key is None or value is None else pa.map_(key, value)

    def primitive(self, t: pa.DataType) -> pa.DataType | None:
        return t


def rebuilt_schema(schema: pa.Schema, visitor: Rebuilt) -> pa.Schema:
    """``schema`` as ``visitor`` rebuilds its fields (without its metadata)."""
    return pa.schema([f for f in visit_fields(schema, visitor) if isinstance(f, pa.Field)])


def rebuilt_type(t: pa.DataType, visitor: Rebuilt, path: Path = ()) -> pa.DataType:
    """``t`` as ``visitor`` rebuilds it (one that leaves nothing out: a type, never None)."""
    out = visit(t, visitor, path)
    assert isinstance(out, pa.DataType), f"{visitor!r} left out the whole type {t}"
    return out


class DottedPaths(Rebuilt):
    """The dotted path of every struct field inside a type, in ``found`` (list elements as ``name.element``, map
    keys and values as ``name.key``, ``name.value``); a ``Rebuilt`` that notes each field it rebuilds."""

    def __init__(self) -> None:
        self.found: set[str] = set()

    def field(self, f: pa.Field, result: pa.DataType | pa.Field | None) -> pa.Field | None:
        self.found.add(".".join(self.path))
        return super().field(f, result)
