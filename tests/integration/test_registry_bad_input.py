"""Bad input of the schema-registry formats (``json_schema``, ``protobuf``): each kind a dead letter of its own class with
its coordinates, alone in a chunk and mixed with good neighbours, never a failed batch, and the accounting adds up
(read = rows + dead letters + skipped); an unreachable registry stops the batch as transient and commits nothing.
Through the real broker, write task code and catalog; good messages come from confluent-kafka's real serializers
through a real registry (the session's Apicurio Registry). The unreachable registry is the stand-in
(``LocalSchemaRegistry``), stopped by the test: the session's real one serves other tests."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tests.conftest import UNKNOWN_SCHEMA_ID, ingest_inline, produce_to_partition, stage_inline, table_of, write_pipeline
from tests.integration.test_bad_input import _dead_letter_classes
from tidewater.config.parse import load_pipeline
from tidewater.errors import TransientBatchWriteError
from tidewater.table.summary import committed_state

pytestmark = [pytest.mark.integration]

ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "store_id": {"type": "integer"},
        "at": {"type": ["string", "null"], "format": "date-time"},
    },
    "required": ["order_id"],
}


def _order_class():
    """``bad.Order {string order_id = 1; int64 store_id = 2;}`` in a pool of its own; ``bad.Newer`` adds field 3."""
    F = descriptor_pb2.FieldDescriptorProto
    pool = descriptor_pool.DescriptorPool()
    fd = descriptor_pb2.FileDescriptorProto(name="bad/order.proto", package="bad", syntax="proto3")
    for name, extra in (("Order", False), ("Newer", True)):
        m = fd.message_type.add(name=name)
        m.field.add(name="order_id", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        m.field.add(name="store_id", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
        if extra:
            m.field.add(name="note", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    pool.Add(fd)
    return [message_factory.GetMessageClass(pool.FindMessageTypeByName(f"bad.{n}")) for n in ("Order", "Newer")]


def _json_schema_corpus(url: str, topic: str) -> tuple:
    ser = JSONSerializer(json.dumps(ORDER), SchemaRegistryClient({"url": url}), conf={"validate": False})

    def framed(doc: dict) -> bytes:
        return ser(doc, SerializationContext(topic, MessageField.VALUE))

    good = framed({"order_id": "g", "store_id": 1})
    head = good[:5]
    corpus = [
        ("unknown schema id", b"\x00" + UNKNOWN_SCHEMA_ID.to_bytes(4, "big") + b'{"order_id": "u"}', "UnknownSchemaId"),
        ("wrong magic byte", b"\x01" + good[1:], "NotConfluentJsonSchema"),
        ("too short for a frame", b"\x00\x00", "NotConfluentJsonSchema"),
        ("a string for an integer", framed({"order_id": "s", "store_id": "many"}), "SchemaViolation"),
        ("a required field missing", framed({"store_id": 2}), "SchemaViolation"),
        ("not a date-time", framed({"order_id": "d", "at": "yesterday"}), "SchemaViolation"),
        ("integer beyond 64 bits", head + b'{"order_id": "b", "store_id": 99999999999999999999}', "NumberOutOfRange"),
        ("not JSON after the frame", head + b"not json", "InvalidJson"),
        ("tombstone", None, "Tombstone"),
        ("a field the schema does not name", framed({"order_id": "x", "extra": [1, 2]}), "row"),
    ]
    return {"value": "json_schema"}, lambda i: framed({"order_id": f"ok{i}", "store_id": i}), corpus


def _protobuf_corpus(url: str, topic: str) -> tuple:
    order, newer = _order_class()
    client = SchemaRegistryClient({"url": url})
    conf = {"use.deprecated.format": False}

    def framed(cls, **kw: object) -> bytes:
        return ProtobufSerializer(cls, client, conf)(cls(**kw), SerializationContext(topic, MessageField.VALUE))

    good = framed(order, order_id="g", store_id=1)
    head = good[:5]
    corpus = [
        ("unknown schema id", b"\x00" + UNKNOWN_SCHEMA_ID.to_bytes(4, "big") + good[5:], "UnknownSchemaId"),
        ("wrong magic byte", b"\x01" + good[1:], "NotConfluentProtobuf"),
        ("too short for a frame", b"\x00\x00", "NotConfluentProtobuf"),
        ("message index out of range", head + b"\x02\x08" + good[6:], "MessageIndexOutOfRange"),
        ("truncated bytes", good[:-1], "InvalidProtobuf"),
        ("corrupt bytes", head + b"\x00" + b"\xff\xff\xff\xff", "InvalidProtobuf"),
        ("tombstone", None, "Tombstone"),
        ("a field the message type does not name", framed(newer, order_id="n", store_id=3, note="x"), "row"),
    ]
    return {"value": "protobuf"}, lambda i: framed(order, order_id=f"ok{i}", store_id=i), corpus


CORPORA = {"json_schema": _json_schema_corpus, "protobuf": _protobuf_corpus}


@pytest.mark.parametrize("chunk_records", [1, 1000], ids=["alone", "mixed"])
@pytest.mark.parametrize("fmt", sorted(CORPORA))
def test_every_kind_of_bad_input_of_a_registry_format_has_its_outcome_alone_or_mixed(broker, home, topic, registry_url, fmt, chunk_records):
    url = registry_url
    settings, good, corpus = CORPORA[fmt](url, topic)
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        batch={"chunk_records": chunk_records},
        validation={"not_null": []},
        format={**settings, "registry_url": url, "metadata": "none"},
    )
    spec = load_pipeline(path)
    values: list[bytes | None] = []
    for i, (_, value, _) in enumerate(corpus):
        values += [good(i), value]
    produce_to_partition(broker.bootstrap, topic, 0, values)
    plan, manifest = stage_inline(spec)
    got = _dead_letter_classes(manifest)
    outcomes = {name: got.get(2 * i + 1, "row") for i, (name, _, _) in enumerate(corpus)}
    assert outcomes == {name: expected for name, _, expected in corpus}
    assert not any(2 * i in got for i in range(len(corpus))), "good neighbours are rows"
    assert manifest.records == len(values) == manifest.rows_in_files + manifest.dead_letters + manifest.skipped
    from tidewater.steps.lifecycle import commit_step, validate_step

    validate_step(spec, plan, manifest)
    assert commit_step(spec, plan, manifest).status == "committed"
    rows = sum(expected == "row" for _, _, expected in corpus) + len(corpus)
    assert table_of(path).scan().to_arrow().num_rows == rows == manifest.rows_in_files
    produce_to_partition(broker.bootstrap, topic, 0, [good(100)])
    ingest_inline(spec)
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == rows + 1
    assert committed_state(table).offsets == {topic: {0: len(values) + 1}}


@pytest.mark.parametrize("fmt", sorted(CORPORA))
def test_an_unreachable_registry_stops_the_batch_as_transient_and_commits_nothing(broker, home, topic, schema_registry, fmt):
    reg, url = schema_registry
    _, good, _ = CORPORA[fmt](url, topic)
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"value": fmt, "registry_url": url, "metadata": "none", "registry_settings": {"max.retries": "0", "timeout": "2"}},
    )
    produce_to_partition(broker.bootstrap, topic, 0, [good(i) for i in range(3)])
    reg.stop()
    with pytest.raises(TransientBatchWriteError, match="unreachable"):
        ingest_inline(load_pipeline(path))
    table = table_of(path)
    assert table is None or table.current_snapshot() is None
