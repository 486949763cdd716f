"""Kafka Connect JSON and Debezium envelopes: declared types honoured, row images picked, bad envelopes set apart."""

from __future__ import annotations

import json

import pyarrow as pa

from tidewater.decode.connect import decode_connect
from tidewater.decode.debezium import decode_debezium
from tidewater.source.kafka import Chunk

SCHEMA = {
    "type": "struct",
    "name": "orders.Value",
    "optional": False,
    "fields": [
        {"field": "id", "type": "int32", "optional": False},
        {"field": "amount", "type": "float64", "optional": True},
        {"field": "ordered_at", "type": "int64", "optional": True, "name": "org.apache.kafka.connect.data.Timestamp"},
        {"field": "day", "type": "int32", "optional": True, "name": "org.apache.kafka.connect.data.Date"},
        {"field": "tags", "type": "array", "items": {"type": "string"}, "optional": True},
    ],
}


def chunk(values: list[bytes | None]) -> Chunk:
    return Chunk("t", 0, values, list(range(len(values))), [0] * len(values))


def connect(payload: dict | None) -> bytes:
    return json.dumps({"schema": SCHEMA, "payload": payload}).encode()


def test_connect_payload_typed_by_the_declared_schema():
    rows = [
        connect({"id": 1, "amount": 2, "ordered_at": 1_700_000_000_000, "day": 19000, "tags": ["a"]}),
        connect({"id": 2, "amount": 2.5, "ordered_at": None, "day": None, "tags": []}),
    ]
    table, bad = decode_connect(chunk(rows), None)
    assert bad == []
    assert table.schema.field("id").type == pa.int32()
    assert table.schema.field("amount").type == pa.float64()  # 2 is a double because the schema says so
    assert table.schema.field("ordered_at").type == pa.timestamp("us", tz="UTC")
    assert table.column("ordered_at")[0].as_py().timestamp() == 1_700_000_000
    assert table.schema.field("day").type == pa.date32() and str(table.column("day")[0].as_py()) == "2022-01-08"
    assert table.column("tags").to_pylist() == [["a"], []]


def test_connect_bad_envelopes_are_set_apart():
    rows = [connect({"id": 1}), b'{"no": "envelope"}', connect(None), b"{trunc", connect({"id": 4})]
    table, bad = decode_connect(chunk(rows), None)
    assert table.column("id").to_pylist() == [1, 4]
    assert [(b.index, b.error_class) for b in bad] == [(1, "EnvelopeMissing"), (2, "EnvelopeMissing"), (3, "InvalidJson")]


def test_debezium_after_for_create_update_snapshot_before_for_delete():
    ev = [
        {"before": None, "after": {"id": 1, "name": "a"}, "op": "c", "source": {"db": "x"}, "ts_ms": 1},
        {"before": {"id": 1, "name": "a"}, "after": {"id": 1, "name": "b"}, "op": "u", "source": {"db": "x"}, "ts_ms": 2},
        {"before": {"id": 1, "name": "b"}, "after": None, "op": "d", "source": {"db": "x"}, "ts_ms": 3},
        {"before": None, "after": {"id": 2, "name": "r"}, "op": "r", "source": {"db": "x"}, "ts_ms": 4},
    ]
    values = [json.dumps(e).encode() for e in ev] + [None, json.dumps({**ev[0], "op": "x"}).encode()]
    table, bad = decode_debezium(chunk(values), None)
    assert table.to_pylist() == [
        {"id": 1, "name": "a", "_op": "c"},
        {"id": 1, "name": "b", "_op": "u"},
        {"id": 1, "name": "b", "_op": "d"},
        {"id": 2, "name": "r", "_op": "r"},
    ]
    assert [(b.index, b.error_class) for b in bad] == [(4, "Tombstone"), (5, "NotDebezium")]


def test_debezium_inside_a_connect_envelope():
    row_schema = {"type": "struct", "optional": True, "fields": [{"field": "id", "type": "int64"}, {"field": "v", "type": "string"}]}
    schema = {
        "type": "struct",
        "fields": [
            {"field": "before", **row_schema},
            {"field": "after", **row_schema},
            {"field": "op", "type": "string"},
            {"field": "ts_ms", "type": "int64", "optional": True},
        ],
    }
    payloads = [
        {"before": None, "after": {"id": 7, "v": "x"}, "op": "c", "ts_ms": 1},
        {"before": {"id": 7, "v": "x"}, "after": None, "op": "d", "ts_ms": 2},
    ]
    values = [json.dumps({"schema": schema, "payload": p}).encode() for p in payloads]
    table, bad = decode_debezium(chunk(values), None)
    assert bad == []
    assert table.to_pylist() == [{"id": 7, "v": "x", "_op": "c"}, {"id": 7, "v": "x", "_op": "d"}]


def test_debezium_schema_changes_and_heartbeats_are_named_not_taken_for_rows():
    """A pattern that picks up the connector's schema change topic or heartbeat topic meets events that are not row
    changes: each is a bad record named for what it is (`SchemaChange`, `Heartbeat`), in a chunk of its own or
    among change events; anything else without a valid `op` stays `NotDebezium`; a truncate (`t`) is a change event
    without an image."""
    ddl = {
        "source": {"db": "inventory"},
        "databaseName": "inventory",
        "ddl": "ALTER TABLE orders ADD note text",
        "tableChanges": [{"type": "ALTER", "id": "inventory.orders"}],
        "ts_ms": 5,
    }
    change = {"before": None, "after": {"id": 1}, "op": "c", "ts_ms": 1}
    values = [
        json.dumps(v).encode() for v in (change, ddl, {"ts_ms": 6}, {"foo": 1}, {"before": None, "after": None, "op": "t", "ts_ms": 7})
    ]
    table, bad = decode_debezium(chunk(values), None)
    assert [(b.index, b.error_class) for b in bad] == [(1, "SchemaChange"), (2, "Heartbeat"), (3, "NotDebezium")]
    assert "schema change topic out of `topics` / `topic_pattern`" in bad[0].message
    assert table.column("_op").to_pylist() == ["c", "t"] and table.column("id").to_pylist() == [1, None]
    only_control = [json.dumps(v).encode() for v in (ddl, {"ts_ms": 8})]
    table, bad = decode_debezium(chunk(only_control), None)
    assert table.num_rows == 0 and [b.error_class for b in bad] == ["SchemaChange", "Heartbeat"]
