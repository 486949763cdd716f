"""``format.value: json_schema`` through the real broker, write step and commit: messages framed by confluent-kafka's
real ``JSONSerializer`` against a real schema registry (Apicurio Registry's Confluent API, the session's
``registry_server``), which assigns the schema ids."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.conftest import ingest_inline, produce_to_partition, table_of, write_pipeline
from tidewater.audit.pipeline import audit
from tidewater.config.parse import load_pipeline
from tidewater.errors import TerminalBatchWriteError
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state

pytestmark = [pytest.mark.integration]

V1 = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "qty": {"type": "integer"},
        "at": {"type": "string", "format": "date-time"},
        "buyer": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
    "required": ["order_id", "qty", "at"],
}
V2 = {
    **V1,
    "properties": {
        **V1["properties"],
        "coupon": {"type": ["string", "null"]},
        "buyer": {"type": "object", "properties": {"name": {"type": "string"}, "tier": {"type": "integer"}}},
    },
}


def _serialize(url: str, schema: dict, records: list[dict], topic: str) -> list[bytes]:
    """The real serializer, its validation off so that records breaking the schema can be produced too."""
    ser = JSONSerializer(json.dumps(schema), SchemaRegistryClient({"url": url}), conf={"validate": False})
    return [ser(r, SerializationContext(topic, MessageField.VALUE)) for r in records]


def _schema_id(url: str, schema: dict, topic: str) -> int:
    """The id the registry gave ``schema`` under the topic's value subject."""
    found = SchemaRegistryClient({"url": url}).lookup_schema(f"{topic}-value", Schema(json.dumps(schema), "JSON"))
    return found.schema_id


def test_json_schema_records_land_typed_a_new_version_adds_columns_and_bad_ones_are_dead_letters(broker, home, topic, registry_url):
    first = [{"order_id": f"o{i}", "qty": i, "at": f"2026-01-02T03:04:0{i}Z", "buyer": {"name": f"b{i}"}} for i in range(4)]
    broken = [
        {"order_id": "x", "qty": "many", "at": "2026-01-02T03:04:05Z"},  # a string where integer is declared
        {"order_id": "y", "qty": 1},
    ]  # required `at` missing
    values = _serialize(registry_url, V1, first + broken, topic) + [b'{"order_id": "z"}']  # no framing
    produce_to_partition(broker.bootstrap, topic, 0, values)
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, format={"value": "json_schema", "registry_url": registry_url}
    )  # Kafka metadata columns: audit --deep
    spec = load_pipeline(path)
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (7, 3)
    table = table_of(path)
    types = {f.name: str(f.field_type) for f in table.schema().fields if not f.name.startswith("_kafka_")}
    assert {k: v.split(":")[0] if k != "buyer" else v.split(": ", 1)[1] for k, v in types.items()} == {
        "order_id": "string",
        "qty": "long",
        "at": "timestamptz",
        "buyer": "name: optional string>",
    }
    assert sorted(table.scan().to_arrow().column("order_id").to_pylist()) == ["o0", "o1", "o2", "o3"]
    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().sort_by("offset")
    assert dlq.column("error_class").to_pylist() == ["SchemaViolation", "SchemaViolation", "NotConfluentJsonSchema"]
    assert dlq.column("offset").to_pylist() == [4, 5, 6]
    assert "at: required" in dlq.column("error_message").to_pylist()[1]
    assert committed_state(table).offsets == {topic: {0: 7}}

    # a new version adds a top-level and a nested field: the table evolves before the batch commits
    later = [{"order_id": "o9", "qty": 9, "at": "2026-01-03T00:00:00+02:00", "coupon": "SPRING", "buyer": {"name": "b9", "tier": 2}}]
    produce_to_partition(broker.bootstrap, topic, 0, _serialize(registry_url, V2, later, topic))
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (1, 0)
    table = table_of(path)
    assert {f.name for f in table.schema().fields if not f.name.startswith("_kafka_")} == {"order_id", "qty", "at", "buyer", "coupon"}
    rows = {r["order_id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert rows["o9"]["coupon"] == "SPRING" and rows["o9"]["buyer"] == {"name": "b9", "tier": 2}
    assert rows["o9"]["at"].isoformat() == "2026-01-02T22:00:00+00:00"
    assert rows["o0"]["coupon"] is None and rows["o0"]["buyer"] == {"name": "b0", "tier": None}
    assert committed_state(table).offsets == {topic: {0: 8}}
    report = audit(spec, deep=True)  # every offset a row or a dead letter, no row twice
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


CHANGED = {**V1, "properties": {**V1["properties"], "qty": {"type": "string"}}}  # qty: integer -> string


def test_a_chunk_of_two_schema_versions_that_give_a_column_two_types_is_refused_naming_both_ids(broker, home, topic, registry_url):
    """The first batch, before the table exists: nothing is created or committed and the offsets stay."""
    first = {"order_id": "o1", "qty": 1, "at": "2026-01-02T03:04:05Z"}
    values = _serialize(registry_url, V1, [first], topic) + _serialize(registry_url, CHANGED, [{**first, "qty": "one"}], topic)
    produce_to_partition(broker.bootstrap, topic, 0, values)
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"value": "json_schema", "registry_url": registry_url, "metadata": "none"},
    )
    v1, changed = _schema_id(registry_url, V1, topic), _schema_id(registry_url, CHANGED, topic)
    with pytest.raises(
        TerminalBatchWriteError,
        match=rf"field qty: schema id {v1} gives it type int64, schema id {changed} "
        r"type string; a column has one type",
    ):
        ingest_inline(load_pipeline(path))
    table = table_of(path)
    assert table is None or table.current_snapshot() is None


def test_records_of_a_schema_version_that_changes_a_column_s_type_are_refused_against_the_table(broker, home, topic, registry_url):
    """Nothing of the batch is committed: the table's snapshot, rows and offsets stay."""
    first = {"order_id": "o1", "qty": 1, "at": "2026-01-02T03:04:05Z"}
    produce_to_partition(broker.bootstrap, topic, 0, _serialize(registry_url, V1, [first], topic))
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"value": "json_schema", "registry_url": registry_url, "metadata": "none"},
    )
    spec = load_pipeline(path)
    ingest_inline(spec)
    before = table_of(path).current_snapshot().snapshot_id
    produce_to_partition(broker.bootstrap, topic, 0, _serialize(registry_url, CHANGED, [{**first, "qty": "one"}], topic))
    v1, changed = _schema_id(registry_url, V1, topic), _schema_id(registry_url, CHANGED, topic)
    with pytest.raises(
        TerminalBatchWriteError,
        match=rf"field qty: schema id {changed} gives it type string, table "
        rf"rpc.orders has int64 \(added by schema id {v1}\); an "
        r"incompatible schema change",
    ):
        ingest_inline(spec)
    table = table_of(path)
    assert table.current_snapshot().snapshot_id == before and committed_state(table).offsets == {topic: {0: 1}}
    assert table.scan().to_arrow().column("qty").to_pylist() == [1]


MAPPED = {**V1, "properties": {**V1["properties"], "extras": {"type": "object", "additionalProperties": {"type": "integer"}}}}
UNMAPPABLE = {"type": "object", "properties": {"order_id": {"type": "string"}, "v": {"type": ["string", "integer"]}}}


def test_a_json_schema_map_lands_as_a_map_column_and_an_unmappable_schema_id_is_dead_lettered_not_a_stopped_topic(
    broker, home, topic, registry_url
):
    """A schema version with ``extras`` as ``additionalProperties: integer`` (a map) and records of a version whose
    field has two types, interleaved. Expected: the batch commits; the map records land with ``extras`` as an Iceberg
    ``map<string, long>`` holding each record's entries; the other version's 2 records are dead letters of class
    UnmappableSchema naming its id and the path; read = rows + dead letters, offsets at the end, deep audit clean."""
    mapped = [{"order_id": f"m{i}", "qty": i, "at": "2026-01-02T03:04:05Z", "extras": {"k": i, f"only{i}": 10 * i}} for i in range(3)]
    odd = _serialize(registry_url, UNMAPPABLE, [{"order_id": "u0", "v": 1}, {"order_id": "u1", "v": "x"}], topic)
    ok = _serialize(registry_url, MAPPED, mapped, topic)
    produce_to_partition(broker.bootstrap, topic, 0, [ok[0], odd[0], ok[1], odd[1], ok[2]])
    spec = load_pipeline(
        write_pipeline(
            home,
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            format={"value": "json_schema", "registry_url": registry_url},
        )
    )
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (5, 2)
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert str(table.schema().find_field("extras").field_type) == "map<string, long>"
    rows = {r["order_id"]: r["extras"] for r in table.scan().to_arrow().to_pylist()}
    assert rows == {f"m{i}": [("k", i), (f"only{i}", 10 * i)] for i in range(3)}
    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().sort_by("offset")
    assert dlq.column("offset").to_pylist() == [1, 3]
    assert set(dlq.column("error_class").to_pylist()) == {"UnmappableSchema"}
    assert all(
        "cannot be a table's columns: JSON Schema at v: type ['string', 'integer']" in m for m in dlq.column("error_message").to_pylist()
    )
    assert committed_state(table).offsets == {topic: {0: 5}}
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def test_a_ref_to_another_registered_schema_lands_its_fields_as_columns(broker, home, topic, registry_url):
    """An order schema whose ``customer`` is ``{"$ref": "customer.json"}`` and ``ship_to``
    ``{"$ref": "customer.json#/$defs/address"}``, registered with a reference to the customer subject, which refers to
    the country subject in turn, as a producer registers them (the unit test's schemas): the registry keeps the
    references, the pipeline follows them, and the referenced fields are the table's columns."""
    from tests.unit.test_json_schema_format import order_referring_to_customer

    client = SchemaRegistryClient({"url": registry_url})
    ser = JSONSerializer(order_referring_to_customer(client, f"{topic}-"), client, conf={"validate": False})
    values = [
        {
            "id": i,
            "customer": {"name": f"c{i}", "home": {"city": "Oslo", "country": {"code": "NO"}}},
            "ship_to": {"city": "Rome", "country": {"code": "IT"}},
        }
        for i in range(3)
    ]
    produce_to_partition(broker.bootstrap, topic, 0, [ser(v, SerializationContext(topic, MessageField.VALUE)) for v in values])
    registered = client.get_schema(client.get_latest_version(f"{topic}-value").schema_id)
    assert [r.name for r in registered.references] == ["customer.json"]
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"value": "json_schema", "registry_url": registry_url, "metadata": "none"},
        validation={"not_null": []},
    )
    result = ingest_inline(load_pipeline(path))
    assert (result.records, result.dead_letters) == (3, 0)
    table = table_of(path)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert set(types) == {"id", "customer", "ship_to"} and "country: optional struct<" in types["customer"]
    assert sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"]) == values
    assert committed_state(table).offsets == {topic: {0: 3}}
