"""The ``json_schema`` value format's decoder on chunks framed by confluent-kafka's real ``JSONSerializer`` against the
schema-registry stand-in (``LocalSchemaRegistry``: the unit tests start no JVM; the serializer and the registry
client are the real ones). The same through the broker and a batch: ``tests/integration/test_json_schema.py``."""

from __future__ import annotations

import datetime as dt
import json
import re

import pyarrow as pa
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tidewater.decode.json_schema import decode
from tidewater.decode.records import DecodeContext
from tidewater.decode.registry_client import RegistryClient
from tidewater.source.kafka import Chunk

V1 = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": ["string", "null"], "format": "date"},
        "buyer": {"type": "object", "properties": {"name": {"type": "string"}, "vip": {"type": "boolean"}}, "required": ["name"]},
    },
    "required": ["id", "at", "buyer"],
}
V2 = {**V1, "properties": {**V1["properties"], "coupon": {"type": "string"}}}


def _serializer(url: str, schema: dict) -> JSONSerializer:
    """The real serializer, its own validation off: the records that break the schema are what the decoder must
    find (a producer without validation, or another client, writes them)."""
    return JSONSerializer(json.dumps(schema), SchemaRegistryClient({"url": url}), conf={"validate": False})


def _chunk(values: list) -> Chunk:
    return Chunk("orders", 0, values, list(range(len(values))), [0] * len(values))


def _decode(url: str, values: list):
    return decode(_chunk(values), DecodeContext("json_schema", registry=RegistryClient(url)))


def test_values_of_two_schema_ids_land_in_chunk_order_with_the_schema_s_types(registry_url):
    ctx = SerializationContext("orders", MessageField.VALUE)
    one, two = _serializer(registry_url, V1), _serializer(registry_url, V2)
    values = [
        one({"id": 1, "at": "2026-01-02T03:04:05Z", "day": "2026-01-02", "buyer": {"name": "a"}}, ctx),
        two({"id": 2, "at": "2026-01-02T04:04:05+01:00", "buyer": {"name": "b", "vip": True}, "coupon": "X", "unnamed": [1, 2]}, ctx),
        one({"id": 3, "at": "2026-01-02T05:04:05.5Z", "day": None, "buyer": {"name": "c"}}, ctx),
    ]
    rows, bad = _decode(registry_url, values)
    assert bad == []
    assert rows.schema.field("at").type == pa.timestamp("us", tz="UTC") and rows.schema.field("day").type == pa.date32()
    assert rows.schema.field("id").type == pa.int64() and "unnamed" not in rows.column_names  # the schema's columns only
    got = rows.to_pylist()
    assert [r["id"] for r in got] == [1, 2, 3]
    assert got[1]["at"] == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert got[0]["day"] == dt.date(2026, 1, 2) and got[2]["day"] is None
    assert [r["coupon"] for r in got] == [None, "X", None] and got[1]["buyer"] == {"name": "b", "vip": True}


def test_records_that_break_their_schema_or_the_framing_are_bad_records_naming_the_path(registry_url):
    ctx = SerializationContext("orders", MessageField.VALUE)
    one = _serializer(registry_url, V1)
    good = {"id": 1, "at": "2026-01-02T03:04:05Z", "buyer": {"name": "a"}}
    values = [
        one(good, ctx),
        one({**good, "id": "seven"}, ctx),  # a string where the schema says integer
        one({**good, "at": "2026-01-02T03:04:05"}, ctx),  # no zone offset: not an RFC 3339 date-time
        one({"id": 4, "at": "2026-01-02T03:04:05Z"}, ctx),  # required buyer missing
        one({**good, "buyer": {"vip": False}}, ctx),  # required buyer.name missing
        b'{"id": 6}',  # no framing
        b"\x00" + (99).to_bytes(4, "big") + b'{"id": 7}',  # an id the registry does not know
        None,
        one({**good, "id": 9}, ctx),
    ]
    rows, bad = _decode(registry_url, values)
    assert [r["id"] for r in rows.to_pylist()] == [1, 9]
    assert [(b.index, b.error_class) for b in bad] == [
        (1, "SchemaViolation"),
        (2, "SchemaViolation"),
        (3, "SchemaViolation"),
        (4, "SchemaViolation"),
        (5, "NotConfluentJsonSchema"),
        (6, "UnknownSchemaId"),
        (7, "Tombstone"),
    ]
    why = {b.index: b.message for b in bad}
    assert "at: '2026-01-02T03:04:05' is not a date-time" in why[2]
    assert "buyer: required" in why[3] and "buyer.name: required" in why[4]
    assert all(f"schema id {1}" in why[i] for i in (1, 2, 3, 4)), why


def test_records_of_a_schema_a_table_cannot_take_are_dead_letters_naming_the_id_and_path_and_the_others_land(registry_url):
    """A schema id whose schema cannot be columns (a field of two types) does not stop the topic: its records are
    dead letters of class UnmappableSchema naming the id and the path; another id's records in the chunk land."""
    ctx = SerializationContext("orders", MessageField.VALUE)
    mixed = {"type": "object", "properties": {"v": {"type": ["string", "integer"]}}}
    bad_value = _serializer(registry_url, mixed)({"v": 1}, ctx)
    good = _serializer(registry_url, V1)({"id": 5, "at": "2026-01-02T03:04:05Z", "buyer": {"name": "a"}}, ctx)
    rows, bad = _decode(registry_url, [bad_value, good, bad_value])
    assert [r["id"] for r in rows.to_pylist()] == [5]
    assert [(b.index, b.error_class) for b in bad] == [(0, "UnmappableSchema"), (2, "UnmappableSchema")]
    assert re.search(r"schema id \d+ cannot be a table's columns: JSON Schema at v: type \['string', 'integer'\]", bad[0].message)


# a schema as people write maps (the shape of the "additionalProperties" maps in JSON Schema Store's published
# schemas, e.g. package.json's "dependencies" and GitHub workflow "env"): string -> integer, string -> date-time,
# string -> object, beside a struct that also allows other keys
MAPS = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "extras": {"type": "object", "additionalProperties": {"type": "integer"}},
        "seen": {"type": "object", "additionalProperties": {"type": "string", "format": "date-time"}},
        "stores": {"type": "object", "patternProperties": {"^s[0-9]+$": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        "buyer": {"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": True},
    },
    "required": ["id"],
}


def test_json_schema_maps_land_as_map_columns_and_a_value_of_another_type_is_a_violation(registry_url):
    """``additionalProperties`` (or one ``patternProperties``) without ``properties`` is map<string, T>: each record's
    keys and values in its row (a null value leaves its key out), dates converted, a missing map null, an empty one
    empty. An object with properties keeps them as columns and ignores its other keys. A map value of another type
    is a SchemaViolation naming the key's path."""
    ctx = SerializationContext("orders", MessageField.VALUE)
    one = _serializer(registry_url, MAPS)
    values = [
        one(
            {
                "id": 1,
                "extras": {"a": 1, "b": 2},
                "seen": {"x": "2026-01-02T03:04:05Z"},
                "stores": {"s1": {"city": "Oslo"}},
                "buyer": {"name": "n", "tier": 3},
            },
            ctx,
        ),
        one({"id": 2, "extras": {"c": 3, "a": None}}, ctx),
        one({"id": 3, "extras": {}}, ctx),
        one({"id": 4, "extras": {"a": "many"}}, ctx),
    ]
    rows, bad = _decode(registry_url, values)
    assert rows.schema.field("extras").type == pa.map_(pa.string(), pa.int64())
    assert rows.schema.field("seen").type == pa.map_(pa.string(), pa.timestamp("us", tz="UTC"))
    assert rows.schema.field("stores").type == pa.map_(pa.string(), pa.struct([("city", pa.string())]))
    assert rows.schema.field("buyer").type == pa.struct([("name", pa.string())])
    got = rows.to_pylist()
    assert [r["id"] for r in got] == [1, 2, 3]
    assert [r["extras"] for r in got] == [[("a", 1), ("b", 2)], [("c", 3)], []]
    assert got[0]["seen"] == [("x", dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc))] and got[1]["seen"] is None
    assert got[0]["stores"] == [("s1", {"city": "Oslo"})] and got[0]["buyer"] == {"name": "n"}
    assert [(b.index, b.error_class) for b in bad] == [(3, "SchemaViolation")]
    assert "Column(/extras/a) changed from number to string" in bad[0].message  # Arrow's words, naming the path
    rows, bad = _decode(registry_url, [values[3]])  # alone in its chunk: inferred as text, refused by the map's type
    assert rows.num_rows == 0 and [b.error_class for b in bad] == ["SchemaViolation"]
    assert "extras.a: 'many' is not a value of type int64" in bad[0].message, bad[0].message


COUNTRY = {"type": "object", "properties": {"code": {"type": "string"}}}
CUSTOMER = {  # its home address's country refers to COUNTRY
    "type": "object",
    "properties": {"name": {"type": "string"}, "home": {"$ref": "#/$defs/address"}},
    "$defs": {"address": {"type": "object", "properties": {"city": {"type": "string"}, "country": {"$ref": "country.json"}}}},
}
ORDER_REFERRING = {  # refers to CUSTOMER, and to a definition inside it
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "customer": {"$ref": "customer.json"},
        "ship_to": {"$ref": "customer.json#/$defs/address"},
    },
}


def order_referring_to_customer(client: SchemaRegistryClient, prefix: str = "") -> Schema:
    """Register ``COUNTRY`` and ``CUSTOMER`` (which refers to it) as subjects ``<prefix>country`` and
    ``<prefix>customer``, as a producer registers referenced schemas: the order schema with its reference, to serialize
    with."""
    from confluent_kafka.schema_registry import SchemaReference

    client.register_schema(f"{prefix}country", Schema(json.dumps(COUNTRY), "JSON"))
    refs = [SchemaReference("country.json", f"{prefix}country", 1)]
    client.register_schema(f"{prefix}customer", Schema(json.dumps(CUSTOMER), "JSON", refs))
    return Schema(json.dumps(ORDER_REFERRING), "JSON", [SchemaReference("customer.json", f"{prefix}customer", 1)])


def test_a_ref_to_another_registered_schema_is_followed_through_the_registry_s_references(registry_url):
    """A schema whose ``customer`` is ``{"$ref": "customer.json"}`` and whose ``ship_to`` is
    ``{"$ref": "customer.json#/$defs/address"}``, registered with a reference to subject ``customer`` version 1 (which
    itself refers to ``country.json``), as confluent-kafka's serializer registers it. Expected: the referenced schemas
    are fetched by subject and version and their fields are columns; a reference the registry does not have makes
    the id's records UnknownSchemaId dead letters."""
    from confluent_kafka.schema_registry import SchemaReference

    client = SchemaRegistryClient({"url": registry_url})
    ser = JSONSerializer(order_referring_to_customer(client), client, conf={"validate": False})
    order = ORDER_REFERRING
    ctx = SerializationContext("orders", MessageField.VALUE)
    value = {
        "id": 1,
        "customer": {"name": "Ada", "home": {"city": "Oslo", "country": {"code": "NO"}}},
        "ship_to": {"city": "Rome", "country": {"code": "IT"}},
    }
    rows, bad = _decode(registry_url, [ser(value, ctx)])
    assert bad == [] and rows.to_pylist() == [value]
    address = pa.struct([("city", pa.string()), ("country", pa.struct([("code", pa.string())]))])
    assert rows.schema.field("customer").type == pa.struct([("name", pa.string()), ("home", address)])
    assert rows.schema.field("ship_to").type == address

    missing = Schema(json.dumps(order), "JSON", [SchemaReference("customer.json", "customer", 7)])
    sid = client.register_schema("orders-missing-ref", missing)
    framed = b"\x00" + sid.to_bytes(4, "big") + json.dumps(value).encode()
    rows, bad = _decode(registry_url, [framed])
    assert rows.num_rows == 0 and [b.error_class for b in bad] == ["UnknownSchemaId"]
    assert "its reference 'customer.json' (subject 'customer' version 7) is not in the registry" in bad[0].message
