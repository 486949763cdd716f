"""The schema-registry stand-in (``tidewater_dev.sample_data.LocalSchemaRegistry``) answers confluent-kafka's real
clients and serializers as Confluent's registry does: schema types, references, subjects and versions. It stands in
for a registry in the unit tests (no JVM), the demo and the benchmarks, and where a test needs what the real registry
of the integration tests (Apicurio Registry) cannot do here: basic auth, a registry that stops or forgets a schema.
The serializers and the client talking to it are the real ones."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import type_pb2

from tidewater_dev.sample_data import LocalSchemaRegistry

AVRO = {"type": "record", "name": "r", "fields": [{"name": "a", "type": "int"}]}
JSON_SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}


@pytest.fixture
def registry():
    reg = LocalSchemaRegistry({1: AVRO})
    url = reg.start()
    yield reg, url, SchemaRegistryClient({"url": url})
    reg.stop()


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_serializers_register_their_schemas_with_their_types_and_frame_messages_with_the_ids(registry):
    reg, url, client = registry
    framed = JSONSerializer(json.dumps(JSON_SCHEMA), client)({"id": 5}, SerializationContext("t", MessageField.VALUE))
    assert framed == b"\x00" + (2).to_bytes(4, "big") + b'{"id":5}'  # the next id after the given Avro schema's
    proto = ProtobufSerializer(type_pb2.Type, client, {"use.deprecated.format": False})
    message = proto(type_pb2.Type(name="x"), SerializationContext("u", MessageField.VALUE))
    assert message[:5] == b"\x00" + (3).to_bytes(4, "big") and message[5:6] == b"\x00"  # message indexes: the first
    assert _get(f"{url}/schemas/ids/2")["schemaType"] == "JSON"
    assert _get(f"{url}/schemas/ids/3")["schemaType"] == "PROTOBUF"
    assert "schemaType" not in _get(f"{url}/schemas/ids/1"), "Avro's type is left out, as Confluent does"
    assert sorted(client.get_subjects()) == ["t-value", "u-value"]
    assert client.get_latest_version("u-value").schema_id == 3


def test_a_schema_keeps_its_id_and_a_new_one_is_the_subject_s_next_version(registry):
    reg, url, client = registry
    first = client.register_schema("s-value", Schema(json.dumps(JSON_SCHEMA), "JSON"))
    assert client.register_schema("s-value", Schema(json.dumps(JSON_SCHEMA), "JSON")) == first
    wider = {**JSON_SCHEMA, "properties": {**JSON_SCHEMA["properties"], "name": {"type": "string"}}}
    second = client.register_schema("s-value", Schema(json.dumps(wider), "JSON"))
    assert second != first
    assert client.get_versions("s-value") == [1, 2]
    assert (client.get_version("s-value", 1).schema_id, client.get_latest_version("s-value").version) == (first, 2)
    assert client.lookup_schema("s-value", Schema(json.dumps(wider), "JSON")).version == 2


def test_references_are_served_with_the_schema_that_imports_them(registry):
    reg, url, client = registry
    base = 'syntax = "proto3"; package p; message Money { int64 units = 1; }'
    client.register_schema("money.proto", Schema(base, "PROTOBUF"))
    order = 'syntax = "proto3"; package p; import "money.proto"; message Order { p.Money total = 1; }'
    ref = SchemaReference("money.proto", "money.proto", 1)
    sid = client.register_schema("orders-value", Schema(order, "PROTOBUF", [ref]))
    served = _get(f"{url}/schemas/ids/{sid}")
    assert served["references"] == [{"name": "money.proto", "subject": "money.proto", "version": 1}]
    assert _get(f"{url}/subjects/money.proto/versions/1")["schema"] == base
    with pytest.raises(urllib.error.HTTPError) as e:
        _get(f"{url}/subjects/nope/versions/latest")
    assert e.value.code == 404
