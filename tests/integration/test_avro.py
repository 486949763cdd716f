"""Avro in the Confluent wire format through the real broker and write step, with the schemas registered in a real
schema registry (Apicurio Registry's Confluent API, the session's ``registry_server``), which gives their ids. The
registry client's own test takes the stand-in (``LocalSchemaRegistry``) for what the real one cannot do here: basic
auth (Apicurio's authentication is OIDC, whose identity server cannot run here) and a registry that forgets a
schema."""

from __future__ import annotations

import io
import struct

import fastavro
import pytest

from tests.conftest import UNKNOWN_SCHEMA_ID, ingest_inline, produce_to_partition, registered_avro, stage_inline, table_of, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.errors import BatchWriteError
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state
from tidewater_dev.sample_data import LocalSchemaRegistry

pytestmark = [pytest.mark.integration]

V1 = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
V2 = {**V1, "fields": [*V1["fields"], {"name": "coupon", "type": ["null", "string"], "default": None}]}
SCHEMAS = {1: V1, 2: V2}  # the stand-in's ids, in the registry client's own test


@pytest.fixture
def ids(registry_url: str, topic: str) -> dict[int, int]:
    """V1 and V2 registered in the real registry under the topic's value subject: their ids, by version (1, 2)."""
    return registered_avro(registry_url, f"{topic}-value", {1: V1, 2: V2})


def framed(schema_id: int, record: dict, schema: dict = V1) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()


def test_avro_records_across_schema_ids_land_typed_and_bad_ones_are_dead_letters(broker, home, topic, registry_url, ids):
    values = [framed(ids[1], {"order_id": f"o{i}", "qty": i, "at": 1_700_000_000_000 + i}) for i in range(5)]
    values += [framed(ids[2], {"order_id": "o5", "qty": 5, "at": 1_700_000_000_005, "coupon": "SPRING"}, V2)]
    values += [
        framed(UNKNOWN_SCHEMA_ID, {"order_id": "x", "qty": 0, "at": 0}),
        b'{"not": "avro"}',
        framed(ids[1], {"order_id": "t", "qty": 1, "at": 1})[:-3],
    ]
    produce_to_partition(broker.bootstrap, topic, 0, values)
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"value": "avro", "registry_url": registry_url, "metadata": "none"},
    )
    spec = load_pipeline(path)
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (9, 3)
    table = table_of(path)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert types == {"order_id": "string", "qty": "int", "at": "timestamptz", "coupon": "string"}
    rows = table.scan().to_arrow().sort_by("order_id").to_pylist()
    assert [r["order_id"] for r in rows] == [f"o{i}" for i in range(6)]
    assert rows[5]["coupon"] == "SPRING" and rows[0]["coupon"] is None
    assert rows[0]["at"].timestamp() == 1_700_000_000
    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().sort_by("offset")
    assert dlq.column("error_class").to_pylist() == ["UnknownSchemaId", "NotConfluentAvro", "InvalidAvro"]
    assert dlq.column("offset").to_pylist() == [6, 7, 8]
    assert committed_state(table).offsets == {topic: {0: 9}}


def test_the_registry_from_an_airflow_connection(broker, home, topic, registry_url, ids, monkeypatch, tmp_path):
    """`format.registry_conn_id` instead of `registry_url`: the connection's host is the registry's URL (its extra a
    client setting); the batch decodes by it as by the URL, and the spec the Spark tasks get carries the resolved
    registry, not the connection id (executors cannot ask Airflow)."""
    import json

    from tidewater.config import connections

    monkeypatch.setattr(connections, "_CACHE", {})
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_CONN_ORDERS_REGISTRY", json.dumps({"conn_type": "http", "host": registry_url, "extra": {"timeout": "7"}}))
    produce_to_partition(broker.bootstrap, topic, 0, [framed(ids[1], {"order_id": f"o{i}", "qty": i, "at": i}) for i in range(4)])
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"value": "avro", "registry_conn_id": "orders_registry", "metadata": "none"},
    )
    spec = load_pipeline(path)
    shipped = spec.for_executors().format
    assert (shipped.registry_url, shipped.registry_conn_id, shipped.registry_settings) == (registry_url, None, {"timeout": "7"})
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (4, 0)
    assert sorted(table_of(path).scan().to_arrow().column("order_id").to_pylist()) == ["o0", "o1", "o2", "o3"]


def test_registry_unreachable_fails_the_batch_without_committing(broker, home, topic):
    produce_to_partition(broker.bootstrap, topic, 0, [framed(1, {"order_id": "o", "qty": 1, "at": 1})])
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, format={"value": "avro", "registry_url": "http://127.0.0.1:9"}
    )
    with pytest.raises(BatchWriteError) as e:
        stage_inline(load_pipeline(path))
    assert e.value.transient and "schema registry http://127.0.0.1:9 unreachable" in str(e.value)
    assert table_of(path) is None


def test_registry_client_maps_the_registry_answers():
    """confluent-kafka's schema registry client, with our error mapping: a schema by id (cached: the
    registry is not asked twice), an unknown id (the record's dead letter), credentials refused (terminal),
    accepted (basic auth), an unknown client setting (terminal, naming format.registry_settings).
    The registry is the local stand-in of `tidewater_dev.sample_data`: the real one here has no basic auth (its
    authentication is OIDC) and cannot be made to forget a schema."""
    from tidewater.decode.registry_client import RegistryClient, UnknownSchemaId
    from tidewater.errors import TerminalError

    open_reg = LocalSchemaRegistry(SCHEMAS)
    locked = LocalSchemaRegistry(SCHEMAS, basic_auth="reader:s3cret")
    try:
        client = RegistryClient(open_reg.start())
        assert client.schema(1)["name"] == V1["name"]
        open_reg.schemas.clear()
        assert client.schema(1)["name"] == V1["name"]  # from the task's cache
        with pytest.raises(UnknownSchemaId, match="schema id 99 is not in the registry"):
            client.schema(99)
        url = locked.start()
        with pytest.raises(TerminalError, match="refused the credentials \\(HTTP 401\\)"):
            RegistryClient(url).schema(1)
        with pytest.raises(TerminalError, match="refused the credentials"):
            RegistryClient(url, auth="reader:wrong").schema(1)
        assert RegistryClient(url, auth="reader:s3cret").schema(2)["name"] == SCHEMAS[2]["name"]
        with pytest.raises(TerminalError, match="format.registry_settings"):
            RegistryClient(url, settings={"no.such.setting": "1"})
    finally:
        open_reg.stop()
        locked.stop()


TYPED = {
    "type": "record",
    "name": "Event",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "at_time", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "at_time_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "at_ns", "type": {"type": "long", "logicalType": "timestamp-nanos"}},
        {"name": "value", "type": ["null", "long", "string"]},
        {"name": "tags", "type": {"type": "array", "items": ["int", "boolean"]}},
    ],
}


def test_avro_time_nanosecond_timestamps_and_unions_land_typed(broker, home, topic, registry_url):
    """time-millis and time-micros become Iceberg time, timestamp-nanos a timestamptz at microsecond
    precision (Iceberg v2 has none finer), and a union of several types a struct with one field per
    branch (as Spark's Avro reader maps it), at the top level and inside an array. The schema is registered in the
    real registry."""
    import datetime

    typed_id = registered_avro(registry_url, f"{topic}-value", {1: TYPED})[1]
    ns = 1_704_067_200_123_456_789  # 2024-01-01T00:00:00.123456789Z
    records = [
        {
            "id": 1,
            "at_time": datetime.time(1, 2, 3, 4000),
            "at_time_us": datetime.time(1, 2, 3, 5),
            "at_ns": ns,
            "value": 42,
            "tags": [1, True],
        },
        {
            "id": 2,
            "at_time": datetime.time(23, 59),
            "at_time_us": datetime.time(0, 0, 0, 1),
            "at_ns": ns + 1000,
            "value": "forty-two",
            "tags": [],
        },
        {"id": 3, "at_time": datetime.time(0, 0), "at_time_us": datetime.time(0, 0), "at_ns": 0, "value": None, "tags": [False]},
    ]
    buf = []
    for r in records:
        b = io.BytesIO()
        fastavro.schemaless_writer(b, fastavro.parse_schema(TYPED), r)
        buf.append(b"\x00" + struct.pack(">I", typed_id) + b.getvalue())
    produce_to_partition(broker.bootstrap, topic, 0, buf)
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"value": "avro", "registry_url": registry_url, "metadata": "none"},
        validation={"not_null": ["id"]},
    )
    result = ingest_inline(load_pipeline(path))
    assert (result.records, result.dead_letters) == (3, 0)
    table = table_of(path)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert types["at_time"] == "time" and types["at_time_us"] == "time" and types["at_ns"] == "timestamptz"
    assert types["value"].startswith("struct<") and "member0: optional long" in types["value"]
    assert "member1: optional string" in types["value"] and types["tags"].startswith("list<struct<")
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert rows[0]["at_time"] == datetime.time(1, 2, 3, 4000) and rows[0]["at_time_us"] == datetime.time(1, 2, 3, 5)
    assert rows[0]["at_ns"] == datetime.datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=datetime.timezone.utc)
    assert rows[0]["value"] == {"member0": 42, "member1": None}
    assert rows[1]["value"] == {"member0": None, "member1": "forty-two"} and rows[2]["value"] is None
    assert rows[0]["tags"] == [{"member0": 1, "member1": None}, {"member0": None, "member1": True}]


def test_schema_ids_interleaved_in_a_chunk_join_in_chunk_order_under_their_union(registry_url, topic):
    """The registry formats' skeleton (decode/framed.py) on Avro: one chunk whose records interleave two schema ids
    (the later id first), a tombstone, a value named by GUID and an id the registry does not know. Each id is
    looked up once, its records decoded together, and the rows come back in chunk order under the union of both
    schemas, in the order the ids first appear; a long that became a double in the later version joins as a
    double (Arrow's permissive promotion, as Avro's rows always joined)."""
    from tidewater.decode.avro import decode_avro
    from tidewater.decode.registry_client import RegistryClient
    from tidewater.source.kafka import Chunk

    narrow = {"type": "record", "name": "Reading", "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}]}
    wide = {**narrow, "fields": [*narrow["fields"][:1], {"name": "amount", "type": "double"}, {"name": "unit", "type": "string"}]}
    ids = registered_avro(registry_url, f"{topic}-value", {1: narrow, 2: wide})
    values = [
        framed(ids[2], {"id": "a", "amount": 1.5, "unit": "kg"}, wide),
        framed(ids[1], {"id": "b", "amount": 2}, narrow),
        None,
        b"\x01" + bytes(16) + b"\x02",
        framed(UNKNOWN_SCHEMA_ID, {"id": "x", "amount": 0}, narrow),
        framed(ids[2], {"id": "c", "amount": 3.25, "unit": "g"}, wide),
        framed(ids[1], {"id": "d", "amount": 4}, narrow),
    ]
    chunk = Chunk(topic, 0, values, list(range(len(values))), [0] * len(values))
    rows, bad = decode_avro(chunk, RegistryClient(registry_url))
    assert rows.column_names == ["id", "amount", "unit"]
    assert rows.schema.field("amount").type == "double"
    assert rows.to_pylist() == [
        {"id": "a", "amount": 1.5, "unit": "kg"},
        {"id": "b", "amount": 2.0, "unit": None},
        {"id": "c", "amount": 3.25, "unit": "g"},
        {"id": "d", "amount": 4.0, "unit": None},
    ]
    assert [(b.index, b.error_class) for b in bad] == [(2, "Tombstone"), (3, "NotConfluentAvro"), (4, "UnknownSchemaId")]
    assert "GUID (magic byte 1)" in bad[1].message
    assert all(b.error_class != "InvalidAvro" for b in bad) and len(rows) + len(bad) == len(values)
