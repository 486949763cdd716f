"""Kafka Connect JSON and Debezium through the real broker, write step, gate and committer: typed
columns in the Iceberg table, tombstones counted, accounting read = rows + dead letters + skipped."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ingest_inline, produce_to_partition, table_of, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.table.summary import DEAD_LETTERS, RECORDS, SKIPPED, committed_state

pytestmark = [pytest.mark.integration]


def test_connect_json_lands_with_declared_types(broker, home, topic):
    schema = {
        "type": "struct",
        "fields": [
            {"field": "order_id", "type": "string"},
            {"field": "qty", "type": "int16"},
            {"field": "price", "type": "float64"},
            {"field": "at", "type": "int64", "name": "org.apache.kafka.connect.data.Timestamp"},
        ],
    }
    values = [
        json.dumps({"schema": schema, "payload": {"order_id": f"o{i}", "qty": i, "price": i, "at": 1_700_000_000_000 + i}}).encode()
        for i in range(20)
    ]
    values.insert(7, b'{"schema": null}')  # no payload: a dead letter
    produce_to_partition(broker.bootstrap, topic, 0, values)
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, format={"value": "connect_json", "metadata": "none"}
    )
    result = ingest_inline(load_pipeline(path))
    assert (result.records, result.dead_letters) == (21, 1)
    table = table_of(path)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert types == {"order_id": "string", "qty": "int", "price": "double", "at": "timestamptz"}
    assert sorted(table.scan().to_arrow().column("qty").to_pylist()) == list(range(20))
    # a later batch into the existing table: the logical Timestamp is read as declared and converted (it was
    # read with the table's timestamp type before, which failed every record)
    produce_to_partition(
        broker.bootstrap,
        topic,
        0,
        [json.dumps({"schema": schema, "payload": {"order_id": "o20", "qty": 20, "price": 2.5, "at": 1_700_000_000_020}}).encode()],
    )
    result = ingest_inline(load_pipeline(path))
    assert (result.records, result.dead_letters) == (1, 0)
    at = table_of(path).scan().to_arrow().sort_by("qty").column("at").to_pylist()
    assert at[-1].timestamp() * 1000 == 1_700_000_000_020 and len(at) == 21


def test_debezium_events_land_with_op_column_and_tombstones_skipped(broker, home, topic):
    events = []
    for i in range(10):
        events.append({"before": None, "after": {"order_id": f"o{i}", "status": "new"}, "op": "c", "ts_ms": i})
    events.append({"before": {"order_id": "o1", "status": "new"}, "after": {"order_id": "o1", "status": "paid"}, "op": "u", "ts_ms": 11})
    events.append({"before": {"order_id": "o2", "status": "new"}, "after": None, "op": "d", "ts_ms": 12})
    values: list[bytes | None] = [json.dumps(e).encode() for e in events] + [None, b'{"op": "?"}']
    produce_to_partition(broker.bootstrap, topic, 0, values)
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, format={"value": "debezium", "metadata": "none"}
    )
    result = ingest_inline(load_pipeline(path))
    table = table_of(path)
    rows = table.scan().to_arrow()
    assert rows.num_rows == 12
    assert sorted(rows.column("_op").to_pylist()) == ["c"] * 10 + ["d", "u"]
    deleted = [r for r in rows.to_pylist() if r["_op"] == "d"]
    assert deleted == [{"order_id": "o2", "status": "new", "_op": "d"}]
    props = table.current_snapshot().summary.additional_properties
    assert (int(props[RECORDS]), int(props[DEAD_LETTERS]), int(props[SKIPPED])) == (14, 1, 1)
    assert result.dead_letters == 1
    assert committed_state(table).offsets == {topic: {0: 14}}


def test_date_time_columns_parsed_and_unparseable_values_dead_lettered(broker, home, topic):
    """Scenario 1's date_ordered ("2024-01-04 12:28:13", local time in Oslo) becomes a UTC timestamptz
    column; a record whose date does not parse is a dead letter (ConversionError), the rest land; the
    second batch decodes the column against the table's timestamp type."""
    from tidewater.table.catalog import load_catalog, load_table
    from tidewater_dev.sample_data import pizza_events

    events = pizza_events(20, seed=71)
    bad = json.dumps({**json.loads(events[0]), "date_ordered": "last tuesday"}).encode()
    produce_to_partition(broker.bootstrap, topic, 0, events[:10] + [bad] + events[10:15])
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"timestamps": {"date_ordered": "%Y-%m-%d %H:%M:%S"}, "timezone": "Europe/Oslo"},
    )
    spec = load_pipeline(path)
    assert ingest_inline(spec).dead_letters == 1
    table = table_of(path)
    assert str(table.schema().find_field("date_ordered").field_type) == "timestamptz"
    from datetime import datetime, timezone
    from zoneinfo import ZoneInfo

    sample = json.loads(events[1])
    rows = {r["order_id"]: r["date_ordered"] for r in table.scan().to_arrow().to_pylist()}
    local = datetime.strptime(sample["date_ordered"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=ZoneInfo("Europe/Oslo"))
    assert rows[sample["order_id"]] == local.astimezone(timezone.utc)
    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow()
    assert dlq.column("error_class").to_pylist() == ["ConversionError"]
    assert "last tuesday" in dlq.column("error_message")[0].as_py()

    produce_to_partition(broker.bootstrap, topic, 0, events[15:])
    assert ingest_inline(spec).records == 5
    assert table_of(path).scan().to_arrow().num_rows == 20


def test_date_time_inside_an_object_lands_as_a_timestamp(broker, home, topic):
    """format.timestamps with a dotted path: the field inside the struct column becomes a timestamptz;
    a value that does not parse makes its record a dead letter; a second batch reads the typed table."""
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"timestamps": {"meta.at": "iso8601"}},
        validation={"not_null": ["id"]},
    )
    values = [json.dumps({"id": i, "meta": {"at": f"2024-02-29T12:23:0{i}", "src": "x"}}).encode() for i in range(5)]
    values.append(json.dumps({"id": 9, "meta": {"at": "yesterday"}}).encode())
    produce_to_partition(broker.bootstrap, topic, 0, values)
    spec = load_pipeline(path)
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (6, 1)
    table = table_of(path)
    assert str(table.schema().find_field("meta.at").field_type) == "timestamptz"
    produce_to_partition(broker.bootstrap, topic, 0, [json.dumps({"id": 20, "meta": {"at": "2024-03-01T00:00:00Z"}}).encode()])
    assert ingest_inline(spec).records == 1
    rows = table_of(path).scan().to_arrow().sort_by("id")
    assert [m["at"].isoformat() for m in rows.column("meta").to_pylist()] == [f"2024-02-29T12:23:0{i}+00:00" for i in range(5)] + [
        "2024-03-01T00:00:00+00:00"
    ]
    assert committed_state(table_of(path)).offsets == {topic: {0: 7}}
