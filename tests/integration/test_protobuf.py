"""``format.value: protobuf`` through the real broker, write step and commit: messages framed by confluent-kafka's real
``ProtobufSerializer`` against a real schema registry (Apicurio Registry's Confluent API, the session's
``registry_server``), which assigns the ids and keeps imported files as references. Each schema version's classes are
built from descriptors in a pool of their own, as two builds of ``shop/events.proto`` would be."""

from __future__ import annotations

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

from tests.conftest import ingest_inline, produce_to_partition, table_of, write_pipeline
from tidewater.audit.pipeline import audit
from tidewater.config.parse import load_pipeline
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state

pytestmark = [pytest.mark.integration]

F = descriptor_pb2.FieldDescriptorProto


def _event_class(version: int):
    """``shop.Event`` as schema version ``version`` defines it: version 2 adds ``coupon`` and ``Buyer.tier``; version 3
    renames ``qty`` (number 2) to ``quantity`` and ``Buyer.name`` (number 1) to ``full_name``, and adds ``coupon``."""
    renamed = version == 3
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    fd = descriptor_pb2.FileDescriptorProto(
        name="shop/events.proto", package="shop", syntax="proto3", dependency=["google/protobuf/wrappers.proto"]
    )
    event = fd.message_type.add(name="Event")
    buyer = event.nested_type.add(name="Buyer")
    buyer.field.add(name="full_name" if renamed else "name", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="order_id", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="quantity" if renamed else "qty", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    event.field.add(name="buyer", number=3, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".shop.Event.Buyer")
    if version == 2:
        buyer.field.add(name="tier", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    if version in (2, 3):
        event.field.add(name="coupon", number=4, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".google.protobuf.StringValue")
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Event"))


def _serialize(url: str, cls, messages: list, topic: str) -> list[bytes]:
    ser = ProtobufSerializer(cls, SchemaRegistryClient({"url": url}), {"use.deprecated.format": False})
    return [ser(m, SerializationContext(topic, MessageField.VALUE)) for m in messages]


def test_protobuf_records_land_typed_a_new_version_adds_columns_and_bad_ones_are_dead_letters(broker, home, topic, registry_url):
    v1 = _event_class(1)
    good = _serialize(registry_url, v1, [v1(order_id=f"e{i}", qty=i, buyer=v1.Buyer(name=f"b{i}")) for i in range(4)], topic)
    values = good + [b'{"id": "json"}', good[0][:5] + b"\x00" + b"\x0a\x09cut"]  # no framing; a string cut short
    produce_to_partition(broker.bootstrap, topic, 0, values)
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, format={"value": "protobuf", "registry_url": registry_url}
    )  # Kafka metadata columns: audit --deep
    spec = load_pipeline(path)
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (6, 2)
    table = table_of(path)
    assert {f.name: str(f.field_type) for f in table.schema().fields if f.name in ("order_id", "qty")} == {
        "order_id": "string",
        "qty": "int",
    }
    assert {f.name for f in table.schema().fields if not f.name.startswith("_kafka_")} == {"order_id", "qty", "buyer"}
    assert sorted(table.scan().to_arrow().column("order_id").to_pylist()) == ["e0", "e1", "e2", "e3"]
    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().sort_by("offset")
    assert dlq.column("error_class").to_pylist() == ["NotConfluentProtobuf", "InvalidProtobuf"]
    assert dlq.column("offset").to_pylist() == [4, 5]
    assert committed_state(table).offsets == {topic: {0: 6}}

    # a new schema version adds a top-level and a nested field: the table evolves before the batch commits
    v2 = _event_class(2)
    later = v2(order_id="e9", qty=9, buyer=v2.Buyer(name="b9", tier=2))
    later.coupon.value = "SPRING"
    produce_to_partition(broker.bootstrap, topic, 0, _serialize(registry_url, v2, [later], topic))
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (1, 0)
    table = table_of(path)
    rows = {r["order_id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert rows["e9"]["coupon"] == "SPRING" and rows["e9"]["buyer"] == {"name": "b9", "tier": 2}
    assert rows["e0"]["coupon"] is None and rows["e0"]["buyer"] == {"name": "b0", "tier": None}
    assert committed_state(table).offsets == {topic: {0: 7}}
    report = audit(spec, deep=True)  # every offset a row or a dead letter, no row twice
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def test_a_field_renamed_with_its_number_kept_renames_the_column_which_keeps_its_values(broker, home, topic, registry_url):
    """A Protobuf field's identity is its number: version 3 renames ``qty`` to ``quantity`` and ``buyer.name`` to
    ``buyer.full_name``. The table's columns are renamed (not dropped and added): the rows written before keep their
    values under the new names, the new rows land beside them, and ``coupon`` is added."""
    v1, v3 = _event_class(1), _event_class(3)
    produce_to_partition(
        broker.bootstrap,
        topic,
        0,
        _serialize(registry_url, v1, [v1(order_id=f"e{i}", qty=i + 1, buyer=v1.Buyer(name=f"b{i}")) for i in range(3)], topic),
    )
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, format={"value": "protobuf", "registry_url": registry_url}
    )
    spec = load_pipeline(path)
    ingest_inline(spec)
    ids = {f.name: f.field_id for f in table_of(path).schema().fields}
    later = v3(order_id="e9", quantity=9, buyer=v3.Buyer(full_name="b9"))
    later.coupon.value = "SPRING"
    produce_to_partition(broker.bootstrap, topic, 0, _serialize(registry_url, v3, [later], topic))
    assert ingest_inline(spec).records == 1
    table = table_of(path)
    columns = {f.name: f.field_id for f in table.schema().fields}
    assert "qty" not in columns and columns["quantity"] == ids["qty"], "renamed in place: the same field id"
    assert str(table.schema().find_field("buyer").field_type).count("full_name") == 1
    rows = {r["order_id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert [rows[f"e{i}"]["quantity"] for i in range(3)] == [1, 2, 3] and rows["e9"]["quantity"] == 9
    assert rows["e0"]["buyer"] == {"full_name": "b0"} and rows["e9"]["buyer"] == {"full_name": "b9"}
    assert rows["e9"]["coupon"] == "SPRING" and rows["e0"]["coupon"] is None
    assert committed_state(table).offsets == {topic: {0: 4}}
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def test_an_orders_schema_with_every_kind_of_field_lands_with_iceberg_types(broker, home, topic, registry_url):
    """``shop.Order`` (tests/unit/test_protobuf_format.py: a nested message, an enum, repeated messages, a map, a
    Timestamp, a Duration, a wrapper, a oneof, proto3 optional, uint64 and an imported file) through the broker into
    the table: the Iceberg types of the mapping and the values."""
    from decimal import Decimal

    from tests.unit.test_protobuf_format import _build

    classes = _build()
    order = classes["Order"](
        id="a",
        big=2**64 - 1,
        status=1,
        card="visa",
        coupon="X",
        lines=[classes["Order"].Line(sku="s", qty=4_000_000_000)],
        attrs={"k": "v"},
    )
    order.at.FromSeconds(1_700_000_000)
    order.wait.FromSeconds(90)
    order.total.units = 12
    ser = ProtobufSerializer(classes["Order"], SchemaRegistryClient({"url": registry_url}), {"use.deprecated.format": False})
    produce_to_partition(
        broker.bootstrap,
        topic,
        0,
        [ser(o, SerializationContext(topic, MessageField.VALUE)) for o in (order, classes["Order"](id="order_b", cash=5))],
    )
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"value": "protobuf", "registry_url": registry_url},
        validation={"not_null": []},
    )
    spec = load_pipeline(path)
    assert ingest_inline(spec).records == 2
    table = table_of(path)
    types = {f.name: str(f.field_type) for f in table.schema().fields if not f.name.startswith("_kafka_")}
    assert {k: types[k] for k in ("id", "big", "status", "at", "wait", "note", "raw", "card", "cash", "coupon", "payment_case")} == {
        "id": "string",
        "big": "decimal(20, 0)",
        "status": "string",
        "at": "timestamptz",
        "wait": "long",
        "note": "string",
        "raw": "binary",
        "card": "string",
        "cash": "long",
        "coupon": "string",
        "payment_case": "string",
    }
    assert types["lines"].startswith("list<struct<") and "qty: optional long" in types["lines"]
    assert types["attrs"].startswith("map<string, string>") and types["total"].startswith("struct<")
    rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert rows["a"]["big"] == Decimal(2**64 - 1) and rows["a"]["status"] == "PAID" and rows["a"]["payment_case"] == "card"
    assert rows["a"]["lines"] == [{"sku": "s", "qty": 4_000_000_000}] and rows["order_b"]["payment_case"] == "cash"
    # the imported file's message came from the registry, where the serializer registered it as a reference
    assert rows["a"]["total"] == {"units": 12, "currency": ""} and rows["order_b"]["total"] is None
    client = SchemaRegistryClient({"url": registry_url})
    latest = client.get_latest_version(f"{topic}-value")
    assert [r.name for r in client.get_schema(latest.schema_id).references] == ["shop/money.proto"]
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]
