"""The one walk over Arrow types (decode/arrow_types.py) and the walks written on it: each keeps the exact types the
hand-written recursions gave (nullability, layouts, what each leaves as it is), since their types reach the table."""

from __future__ import annotations

import pyarrow as pa

from tidewater.decode.arrow_types import DottedPaths, Rebuilt, TypeVisitor, rebuilt_type, visit
from tidewater.decode.avro import to_micros
from tidewater.decode.json import _inferred_type, readable_schema
from tidewater.decode.json_schema import Columns
from tidewater.table.evolution import arrow_paths
from tidewater.table.limits import _Restricted

NS = pa.timestamp("ns", tz="UTC")
NESTED = pa.struct(
    [
        pa.field("at", NS, nullable=False),
        pa.field("xs", pa.list_(pa.struct([pa.field("t", NS), pa.field("n", pa.null())]))),
        pa.field("m", pa.map_(pa.string(), pa.struct([pa.field("t", NS)]))),
        pa.field("big", pa.large_list(pa.large_string())),
        pa.field("fixed", pa.list_(pa.large_binary(), 2)),
        pa.field("empty", pa.struct([pa.field("gone", pa.null())])),
    ]
)


class Paths(TypeVisitor[list]):
    """Every path the walk visits, in its order (children first)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def _saw(self) -> list:
        self.seen.append(".".join(self.path))
        return []

    def struct(self, t, fields):
        return self._saw()

    def field(self, f, result):
        return self._saw()

    def list(self, t, element):
        return self._saw()

    def map(self, t, key, value):
        return self._saw()

    def primitive(self, t):
        return self._saw()


def test_the_walk_visits_children_first_and_names_each_path_as_iceberg_does():
    walk = Paths()
    visit(
        pa.struct([pa.field("a", pa.list_(pa.struct([pa.field("b", pa.int64())]))), pa.field("m", pa.map_(pa.string(), pa.int32()))]), walk
    )
    assert walk.seen == ["a.element.b", "a.element.b", "a.element", "a", "a", "m.key", "m.value", "m", "m", ""]


def test_rebuilt_as_it_is_keeps_a_type_but_not_field_metadata():
    assert rebuilt_type(NESTED, Rebuilt()) == NESTED
    marked = pa.struct([pa.field("a", pa.int64(), metadata={b"k": b"v"})])
    assert rebuilt_type(marked, Rebuilt()).field("a").metadata is None


def test_avro_to_micros_reaches_structs_lists_and_maps_and_leaves_the_rest():
    out = to_micros(NESTED)
    us = pa.timestamp("us", tz="UTC")
    assert out.field("at") == pa.field("at", us, nullable=False)
    assert out.field("xs").type == pa.list_(pa.struct([pa.field("t", us), pa.field("n", pa.null())]))
    assert out.field("m").type == pa.map_(pa.string(), pa.struct([pa.field("t", us)]))
    assert out.field("big").type == pa.large_list(pa.large_string()) and out.field("fixed").type == pa.list_(pa.large_binary(), 2)


def test_json_readable_schema_has_no_large_layouts_nullable_fields_and_maps_as_they_are():
    out = readable_schema(pa.schema(list(NESTED)))
    assert out.field("at") == pa.field("at", NS)  # nullable now: the reader's fields all are
    assert out.field("big").type == pa.list_(pa.string())
    assert out.field("fixed").type == pa.list_(pa.large_binary(), 2)  # as it was
    assert out.field("m").type == NESTED.field("m").type


def test_json_inferred_type_drops_null_only_fields_and_makes_times_strings():
    out = _inferred_type(NESTED)
    assert out.get_field_index("empty") < 0
    assert out.field("at").type == pa.string() and out.field("xs").type == pa.list_(pa.struct([pa.field("t", pa.string())]))
    assert out.field("m").type == NESTED.field("m").type
    assert _inferred_type(pa.list_(pa.null())) is None and _inferred_type(pa.struct([pa.field("n", pa.null())])) is None


def test_restricted_keeps_only_the_paths_asked_for_inside_structs_and_lists():
    t = pa.struct(
        [
            pa.field("a", pa.int64(), nullable=False),
            pa.field("b", pa.large_list(pa.struct([pa.field("c", pa.int64()), pa.field("d", pa.string())]))),
        ]
    )
    out = rebuilt_type(t, _Restricted({("top", "a"), ("top", "b"), ("top", "b", "element", "c")}), ("top",))
    assert out == pa.struct(
        [pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.large_list(pa.struct([pa.field("c", pa.int64())])))]
    )


def test_dotted_paths_name_list_elements_and_map_keys_and_values():
    assert arrow_paths(NESTED) == {"at", "xs", "xs.element.t", "xs.element.n", "m", "m.value.t", "big", "fixed", "empty", "empty.gone"}
    found = DottedPaths()
    visit(pa.struct([pa.field("a.b", pa.int64())]), found)
    assert found.found == {"a.b"}


def test_json_schema_reader_columns_rewrite_structs_only():
    schema = pa.schema(
        [
            pa.field("when", pa.timestamp("us", tz="UTC")),
            pa.field(
                "o",
                pa.struct([pa.field("day", pa.date32()), pa.field("tags", pa.map_(pa.string(), pa.int64())), pa.field("n", pa.int64())]),
            ),
            pa.field("xs", pa.list_(pa.struct([pa.field("day", pa.date32())]))),
            pa.field("keep", pa.int64(), metadata={b"k": b"v"}),
        ]
    )
    cols = Columns(schema, (), {"when": "date-time", "o.day": "date", "xs.day": "date"}, maps=("o.tags",))
    out = cols.reader_schema()
    assert out.field("when").type == pa.string()
    assert out.field("o").type == pa.struct([pa.field("day", pa.string()), pa.field("n", pa.int64())])
    assert out.field("xs").type == schema.field("xs").type  # lists are not rewritten
    assert out.field("keep").metadata == {b"k": b"v"}
