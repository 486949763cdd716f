"""A JSON Schema as a table's columns (``decode/json_schema.py``): the types, nullability, nesting, references, and
the schemas a table cannot take, refused by path."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tidewater.decode.json_schema import columns
from tidewater.errors import TerminalError

ORDER = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "price": {"type": "number"},
        "paid": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "size": {"enum": ["S", "M", "L"]},
        "store": {"$ref": "#/$defs/store"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "coupon": {"oneOf": [{"type": "null"}, {"type": "object", "properties": {"code": {"type": "string"}}}]},
    },
    "required": ["id", "at", "store"],
    "$defs": {"store": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}}, "required": ["city"]}},
}


def test_a_schema_s_types_nesting_and_references_become_the_columns_in_their_order():
    got = columns(ORDER)
    assert got.schema == pa.schema(
        [
            ("id", pa.int64()),
            ("price", pa.float64()),
            ("paid", pa.bool_()),
            ("note", pa.string()),
            ("at", pa.timestamp("us", tz="UTC")),
            ("day", pa.date32()),
            ("size", pa.string()),
            ("store", pa.struct([("city", pa.string()), ("zip", pa.int64())])),
            ("tags", pa.list_(pa.string())),
            ("coupon", pa.struct([("code", pa.string())])),
        ]
    )
    assert all(f.nullable for f in got.schema)
    assert got.required == ("id", "at", "store", "store.city")


def test_a_required_field_inside_an_optional_object_is_not_required_of_every_value():
    doc = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}}}
    assert columns(doc).required == ()


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"type": "object", "properties": {"x": {"type": ["string", "integer"]}}}, "at x: type ['string', 'integer']"),
        ({"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}, "at x: anyOf of 2"),
        ({"type": "object", "properties": {"x": {"type": "object"}}}, "at x: an object without properties"),
        (
            {
                "type": "object",
                "properties": {"x": {"$ref": "#/$defs/n"}},
                "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}},
            },
            "at x.next: $ref '#/$defs/n' refers to itself",
        ),
        ({"type": "object", "properties": {"x": {"$ref": "other.json#/a"}}}, "at x: $ref 'other.json#/a' is not in the same document"),
        ({"type": "array", "items": {"type": "integer"}}, "the root must be an object"),
        ({"type": "object", "properties": {"x": {"type": "array"}}}, "at x: an array needs one schema for its items"),
        (
            {
                "type": "object",
                "properties": {"x": {"type": "array", "items": {"type": "object", "additionalProperties": {"type": "integer"}}}},
            },
            "at x[]: a map inside a list or a map",
        ),
        ({"type": "object", "properties": {"x": {"type": "object", "additionalProperties": True}}}, "at x: an object without"),
    ],
)
def test_a_schema_a_table_cannot_take_is_refused_naming_the_path(doc, message):
    with pytest.raises(TerminalError) as e:
        columns(doc)
    assert message in str(e.value)


def test_arrow_s_json_reader_parses_values_with_the_reader_schema_dates_as_strings():
    """The reader schema parses the values; the date-time and date columns come back as the strings the values hold,
    named in ``formats`` for the conversion to the table's types."""
    import io

    import pyarrow.json as pj

    got = columns(ORDER)
    assert got.formats == {"at": "date-time", "day": "date"}
    values = (
        b'{"id": 1, "price": 2.5, "paid": true, "note": null, "at": "2024-01-04T12:00:00Z", "day": "2024-01-04", '
        b'"size": "M", "store": {"city": "Oslo", "zip": 150}, "tags": ["a"], "coupon": null}\n'
        b'{"id": 2, "at": "2024-01-04T12:00:01+01:00", "store": {"city": "Rome"}}\n'
    )
    parsed = pj.read_json(io.BytesIO(values), parse_options=pj.ParseOptions(explicit_schema=got.reader_schema()))
    assert parsed.schema == got.reader_schema()
    assert parsed.column("day").to_pylist() == ["2024-01-04", None]
    assert parsed.column("store").to_pylist() == [{"city": "Oslo", "zip": 150}, {"city": "Rome", "zip": None}]


def test_all_of_one_of_const_and_enum_as_published_schemas_write_them():
    """The shapes of published schemas (JSON Schema Store's, OpenAPI components): a type extending a base through
    ``allOf`` with a ``$ref``; a payment that is ``oneOf`` a card or a bank transfer (one struct of both, only what both
    require required); ``const`` discriminators and ``enum`` of numbers."""
    doc = {
        "$defs": {"base": {"type": "object", "properties": {"id": {"type": "string"}, "kind": {"const": "order"}}, "required": ["id"]}},
        "allOf": [
            {"$ref": "#/$defs/base"},
            {
                "type": "object",
                "properties": {
                    "version": {"const": 2},
                    "size": {"enum": [1, 2.5]},
                    "flag": {"enum": [True, False]},
                    "payment": {
                        "oneOf": [
                            {
                                "type": "object",
                                "properties": {"method": {"const": "card"}, "card_last4": {"type": "string"}},
                                "required": ["method", "card_last4"],
                            },
                            {
                                "type": "object",
                                "properties": {"method": {"const": "card"}, "iban": {"type": "string"}},
                                "required": ["method", "iban"],
                            },
                            {"type": "null"},
                        ]
                    },
                },
                "required": ["payment"],
            },
        ],
    }
    got = columns(doc)
    assert got.schema == pa.schema(
        [
            ("id", pa.string()),
            ("kind", pa.string()),
            ("version", pa.int64()),
            ("size", pa.float64()),
            ("flag", pa.bool_()),
            ("payment", pa.struct([("method", pa.string()), ("card_last4", pa.string()), ("iban", pa.string())])),
        ]
    )
    assert set(got.required) == {"id", "payment", "payment.method"}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"type": "object", "properties": {"x": {"enum": [1, "a"]}}}, "at x: enum or const values of several types"),
        (
            {
                "type": "object",
                "properties": {
                    "x": {
                        "oneOf": [
                            {"type": "object", "properties": {"v": {"type": "string"}}},
                            {"type": "object", "properties": {"v": {"type": "integer"}}},
                        ]
                    }
                },
            },
            "at x.v: the alternatives of oneOf",
        ),
        (
            {
                "allOf": [
                    {"type": "object", "properties": {"v": {"type": "string"}}},
                    {"type": "object", "properties": {"v": {"type": "integer"}}},
                ]
            },
            "property 'v' is 'string' in one part",
        ),
    ],
)
def test_combinations_a_table_cannot_take_are_refused_naming_the_path(doc, message):
    with pytest.raises(TerminalError) as e:
        columns(doc)
    assert message in str(e.value)
