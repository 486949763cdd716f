"""Message keys, headers and Kafka coordinates as columns (format.key, format.headers, format.metadata),
from the real broker through the write step, with a dead letter in the middle of the chunk."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import ingest_inline, table_of, write_pipeline
from tidewater.config.parse import load_pipeline

pytestmark = [pytest.mark.integration]


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, list | None]]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    p = Producer({"bootstrap.servers": bootstrap})
    for key, value, headers in records[:-1]:
        p.produce(topic, value, key=key, headers=headers, partition=0, timestamp=1_700_000_000_000)
    p.flush(30)
    key, value, headers = records[-1]
    p.produce(topic, value, key=key, headers=headers, partition=0, timestamp=1_700_000_000_000)
    p.flush(30)


def test_key_headers_and_prefixed_metadata_columns_skip_the_dead_letter(broker, home, topic):
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"key": "string", "headers": True, "metadata": "prefixed"},
    )
    records = [(f"k{i}".encode(), json.dumps({"order_id": f"o{i}", "n": i}).encode(), [("src", f"h{i}".encode())]) for i in range(6)]
    records[3] = (b"k3", b"{broken", [("src", b"h3")])
    records[4] = (None, records[4][1], None)
    _produce(broker.bootstrap, topic, records)
    result = ingest_inline(load_pipeline(path))
    assert (result.records, result.dead_letters) == (6, 1)
    t = table_of(path).scan().to_arrow().sort_by("_kafka_offset")
    assert t.column("_kafka_offset").to_pylist() == [0, 1, 2, 4, 5]
    assert t.column("_kafka_key").to_pylist() == ["k0", "k1", "k2", None, "k5"]
    assert t.column("_kafka_headers").to_pylist() == [[("src", b"h0")], [("src", b"h1")], [("src", b"h2")], None, [("src", b"h5")]]
    assert set(t.column("_kafka_topic").to_pylist()) == {topic} and set(t.column("_kafka_partition").to_pylist()) == {0}
    assert t.column("_kafka_timestamp").type == pa.timestamp("us", tz="UTC")
    assert t.column("_kafka_timestamp")[0].as_py().timestamp() == 1_700_000_000
    assert t.column("order_id").to_pylist() == ["o0", "o1", "o2", "o4", "o5"]
    schema = table_of(path).schema()
    assert str(schema.find_field("_kafka_headers").field_type).startswith("map<string, binary>")

    # a second batch decodes against the table schema that now has the source columns
    p = Producer({"bootstrap.servers": broker.bootstrap})
    p.produce(topic, json.dumps({"order_id": "o6", "n": 6}).encode(), key=b"k6", partition=0)
    p.flush(30)
    assert ingest_inline(load_pipeline(path)).records == 1
    t = table_of(path).scan().to_arrow()
    assert t.num_rows == 6 and sorted(t.column("_kafka_offset").to_pylist()) == [0, 1, 2, 4, 5, 6]


def test_metadata_struct_column(broker, home, topic):
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, format={"metadata": "struct"})
    _produce(broker.bootstrap, topic, [(None, json.dumps({"order_id": f"o{i}"}).encode(), None) for i in range(3)])
    ingest_inline(load_pipeline(path))
    t = table_of(path).scan().to_arrow()
    assert [r["offset"] for r in t.column("_kafka").to_pylist()] == [0, 1, 2]
    assert str(table_of(path).schema().find_field("_kafka").field_type).startswith("struct<")


@pytest.mark.parametrize("kind", ["string", "bytes"])
def test_plain_string_and_raw_bytes_values(broker, home, topic, kind):
    """`string`: invalid UTF-8 is a dead letter, a tombstone lands as a null value; `bytes`: everything lands."""
    from tidewater.table.catalog import load_catalog, load_table

    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"value": kind, "metadata": "prefixed"},
        validation={"not_null": []},
    )
    _produce(
        broker.bootstrap,
        topic,
        [(None, b"line one", None), (None, b"\xff\xfe bad", None), (None, None, None), (None, "línea".encode(), None)],
    )
    spec = load_pipeline(path)
    result = ingest_inline(spec)
    t = table_of(path).scan().to_arrow().sort_by("_kafka_offset")
    if kind == "string":
        assert result.dead_letters == 1
        assert t.column("value").to_pylist() == ["line one", None, "línea"]
        assert t.column("_kafka_offset").to_pylist() == [0, 2, 3]
        dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow()
        assert dlq.column("value").to_pylist() == [b"\xff\xfe bad"] and dlq.column("error_class").to_pylist() == ["InvalidUtf8"]
    else:
        assert result.dead_letters == 0
        assert t.column("value").to_pylist() == [b"line one", b"\xff\xfe bad", None, "línea".encode()]


def test_dead_letters_keep_key_and_headers_when_they_are_not_columns(broker, home, topic):
    """Keys and headers are not read on the hot path unless they become columns; a dead letter still
    gets its raw key and headers (read again by offset on the error path)."""
    from tidewater.table.catalog import load_catalog, load_table

    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    records = [(f"k{i}".encode(), json.dumps({"order_id": f"o{i}"}).encode(), [("trace", f"t{i}".encode())]) for i in range(8)]
    records[2] = (b"bad-key", b"{oops", [("trace", b"t2"), ("retry", b"1")])
    records[6] = (None, b"[]", None)
    _produce(broker.bootstrap, topic, records)
    spec = load_pipeline(path)
    assert ingest_inline(spec).dead_letters == 2
    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().sort_by("offset").to_pylist()
    assert [(d["offset"], d["key"], d["headers"] or None) for d in dlq] == [
        (2, b"bad-key", [{"key": "trace", "value": b"t2"}, {"key": "retry", "value": b"1"}]),
        (6, None, None),  # no headers: stored as an empty or null list
    ]
