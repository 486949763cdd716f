"""Tables created and evolved from the data, through the real broker, writer, gate and committer:
partition specs and sort orders, widening and required -> optional, flattening, map columns, name
matching (name mapping, case-insensitive), and the Kafka dead-letter topic. Row counts, accounting and
offsets are checked in every test."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from tests.conftest import ingest_inline, produce_to_partition, table_of, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.steps.lifecycle import run_once
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.evolution import ensure_table
from tidewater.table.summary import DEAD_LETTER_TOPIC, DEAD_LETTERS, RECORDS, committed_state, find_batch_snapshot
from tidewater_dev.sample_data import pizza_events

pytestmark = [pytest.mark.integration]


def _accounting(table, records: int, dead: int) -> None:
    props = table.current_snapshot().summary.additional_properties
    assert (int(props[RECORDS]), int(props[DEAD_LETTERS])) == (records, dead)


@pytest.mark.slow
def test_partitioned_and_sorted_table_through_spark(broker, home, topic):
    """`tidewater run` (spark-submit, 2 partitions, several tasks) into a table auto-created with
    day(ts), bucket(4, store_id) and truncate(2, sauce) and a sort order: every partition's row count
    matches the events produced, files prune by partition, offsets are exact."""
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        table={
            "identifier": "rpc.orders",
            "partition_by": ["day(date_ordered)", "bucket(4, store_id)", "truncate(2, sauce)"],
            "sort_by": ["date_ordered desc", "store_id"],
        },
        format={"timestamps": {"date_ordered": "%Y-%m-%d %H:%M:%S"}},
        batch={"records_per_task": 150, "chunk_records": 70},
    )
    day1 = pizza_events(300, seed=5, start=datetime(2024, 1, 4, 23, 56))  # runs past midnight
    day2 = pizza_events(200, seed=6, start=datetime(2024, 1, 6, 8, 0))
    produce_to_partition(broker.bootstrap, topic, 0, day1, partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, day2)
    result = run_once(path)
    assert result["records"] == 500

    table = table_of(path)
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [
        ("date_ordered_day", "day"),
        ("store_id_bucket", "bucket[4]"),
        ("sauce_trunc", "truncate[2]"),
    ]
    assert [(table.schema().find_column_name(f.source_id), str(f.direction)) for f in table.sort_order().fields] == [
        ("date_ordered", "DESC"),
        ("store_id", "ASC"),
    ]
    assert committed_state(table).offsets == {topic: {0: 300, 1: 200}}
    _accounting(table, 500, 0)

    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import LongType

    bucket = BucketTransform(4).transform(LongType())
    expected: Counter = Counter()
    for v in day1 + day2:
        e = json.loads(v)
        day = datetime.strptime(e["date_ordered"], "%Y-%m-%d %H:%M:%S").date()
        expected[(day, bucket(e["store_id"]), e["sauce"][:2])] += 1
    partitions = table.inspect.partitions().to_pylist()
    got = Counter(
        {
            (p["partition"]["date_ordered_day"], p["partition"]["store_id_bucket"], p["partition"]["sauce_trunc"]): p["record_count"]
            for p in partitions
        }
    )
    assert got == expected and len({k[0] for k in got}) == 3  # Jan 4, 5 and 6
    files = list(table.scan().plan_files())
    one_store = list(table.scan(row_filter="store_id = 7").plan_files())
    assert 0 < len(one_store) < len(files)
    assert table.scan(row_filter="store_id = 7").to_arrow().num_rows == sum(1 for v in day1 + day2 if json.loads(v)["store_id"] == 7)


def test_partition_by_a_missing_or_unsuitable_column_fails_naming_the_setting(broker, home, topic):
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(5, seed=1))
    for partition_by, message in (
        (["day(shipped_at)"], "table.partition_by[0]: column 'shipped_at' is not in the records"),
        (["store_id", "hour(sauce)"], "table.partition_by[1]: 'hour(sauce)': a hour transform cannot apply"),
    ):
        path = write_pipeline(
            home,
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            table={"identifier": "rpc.orders", "partition_by": partition_by},
        )
        with pytest.raises(Exception, match=re.escape(message)):
            ingest_inline(load_pipeline(path))
        assert table_of(path) is None  # nothing created, nothing committed


def _connect(fields: list[dict], payloads: list[dict]) -> list[bytes]:
    schema = {"type": "struct", "fields": fields}
    return [json.dumps({"schema": schema, "payload": p}).encode() for p in payloads]


def test_widening_and_required_columns_made_optional(broker, home, topic):
    """A table made by another tool with int/float and required columns: Kafka Connect records that
    declare int64/float64 widen them (int -> long, float -> double, also inside a struct), and records
    without a required column make it optional. A required column the records always fill stays required."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import FloatType, IntegerType, NestedField, StringType, StructType

    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"value": "connect_json"},
        validation={"not_null": ["id"]},
    )
    spec = load_pipeline(path)
    catalog = load_catalog(spec)
    catalog.create_namespace_if_not_exists("rpc")
    catalog.create_table(
        "rpc.orders",
        Schema(
            NestedField(1, "id", IntegerType(), required=True),
            NestedField(2, "amount", FloatType(), required=False),
            NestedField(3, "note", StringType(), required=True),
            NestedField(4, "dims", StructType(NestedField(5, "w", IntegerType(), required=True)), required=False),
        ),
    )
    narrow = [
        {"field": "id", "type": "int32"},
        {"field": "amount", "type": "float32"},
        {"field": "note", "type": "string"},
        {"field": "dims", "type": "struct", "fields": [{"field": "w", "type": "int32"}]},
    ]
    produce_to_partition(
        broker.bootstrap, topic, 0, _connect(narrow, [{"id": i, "amount": 1.5, "note": "n", "dims": {"w": i}} for i in range(5)])
    )
    assert ingest_inline(spec).records == 5
    table = table_of(path)
    assert {f.name: (str(f.field_type), f.required) for f in table.schema().fields}["id"] == ("int", True)

    wide = [
        {"field": "id", "type": "int32"},
        {"field": "amount", "type": "float64"},
        {"field": "dims", "type": "struct", "fields": [{"field": "w", "type": "int64"}]},
    ]
    big = 2**40
    produce_to_partition(
        broker.bootstrap, topic, 0, _connect(wide, [{"id": 10 + i, "amount": 0.1, "dims": {"w": big + i}} for i in range(4)])
    )
    assert ingest_inline(spec).records == 4
    table = table_of(path)
    fields = {f.name: (str(f.field_type), f.required) for f in table.schema().fields}
    assert fields["id"] == ("int", True)  # always filled: stays required
    assert fields["amount"] == ("double", False)
    assert fields["note"] == ("string", False)  # missing from the new records: now optional
    assert str(table.schema().find_field("dims.w").field_type) == "long"
    rows = table.scan().to_arrow().sort_by("id")
    assert rows.num_rows == 9
    assert rows.column("note").to_pylist() == ["n"] * 5 + [None] * 4
    assert [d["w"] for d in rows.column("dims").to_pylist()][5:] == [big + i for i in range(4)]
    assert rows.column("amount").to_pylist()[5:] == [0.1] * 4
    assert committed_state(table).offsets == {topic: {0: 9}}


def test_flattening_map_columns_and_case_insensitive_matching(broker, home, topic):
    """format.flatten (depth 2), format.map_columns and table.case_insensitive: nested objects become
    `a_b` columns, deeper ones stay structs, open-ended objects become a map column, `ID`/`Customer`
    fill the columns first seen as `id`/`customer_*`, and a value that cannot take its column's type is
    a TypeMismatch dead letter (its record only)."""
    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"flatten": True, "flatten_max_depth": 2, "map_columns": ["attrs"], "metadata": "none"},
        table={"identifier": "rpc.orders", "case_insensitive": True},
        validation={"not_null": ["id"]},
    )
    spec = load_pipeline(path)
    first = [
        json.dumps(
            {
                "id": i,
                "customer": {"name": f"c{i}", "address": {"zip": 1000 + i, "geo": {"lat": 59.9}}},
                "attrs": {f"k{i}": "v", "color": "red"},
            }
        ).encode()
        for i in range(6)
    ]
    produce_to_partition(broker.bootstrap, topic, 0, first)
    assert ingest_inline(spec).records == 6
    table = table_of(path)
    types = {
        f.name: str(f.field_type).split(": ", 1)[-1] if "struct" in str(f.field_type) else str(f.field_type) for f in table.schema().fields
    }
    assert types == {
        "id": "long",
        "customer_name": "string",
        "customer_address_zip": "long",
        "customer_address_geo": "lat: optional double>",
        "attrs": "map<string, string>",
    }
    rows = table.scan().to_arrow().sort_by("id")
    assert dict(rows.column("attrs").to_pylist()[2]) == {"k2": "v", "color": "red"}

    second = [json.dumps({"ID": 10 + i, "Customer": {"Name": f"d{i}", "vip": True}, "attrs": {"n": i}}).encode() for i in range(4)]
    second.insert(2, json.dumps({"ID": "not-a-number", "Customer": {"Name": "x"}}).encode())
    produce_to_partition(broker.bootstrap, topic, 0, second)
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (5, 1)
    table = table_of(path)
    names = [f.name for f in table.schema().fields]
    assert "ID" not in names and "Customer_Name" not in names and "customer_vip" not in names
    assert "Customer_vip" in names  # a new field keeps its spelling
    # the table's struct column (an object below flatten_max_depth) is not flattened again into new columns
    assert "customer_address_geo_lat" not in names and "customer_address_geo" in names
    rows = table.scan().to_arrow().sort_by("id")
    assert rows.num_rows == 10
    assert rows.column("customer_name").to_pylist()[6:] == ["d0", "d1", "d2", "d3"]
    assert [dict(m) for m in rows.column("attrs").to_pylist()[6:]] == [{"n": str(i)} for i in range(4)]
    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow()
    assert dlq.column("error_class").to_pylist() == ["TypeMismatch"] and dlq.column("offset").to_pylist() == [8]
    assert "not-a-number" in dlq.column("error_message")[0].as_py()
    _accounting(table, 5, 1)
    assert committed_state(table).offsets == {topic: {0: 11}}

    # A batch where the field is text throughout (Arrow reads it as a string column): the cast to the
    # table's long column fails for that record only.
    produce_to_partition(broker.bootstrap, topic, 0, [json.dumps({"ID": "oops"}).encode(), json.dumps({"ID": "21"}).encode()])
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (2, 1)
    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().sort_by("offset")
    assert dlq.column("offset").to_pylist() == [8, 11]
    assert dlq.column("error_message").to_pylist()[1] == "column 'id': 'oops' is not a int64 value"
    assert 21 in table_of(path).scan().to_arrow().column("id").to_pylist()
    assert committed_state(table_of(path)).offsets == {topic: {0: 13}}


def test_name_mapping_aliases_fill_the_mapped_columns(broker, home, topic):
    """A table whose name mapping (`schema.name-mapping.default`) gives `custId` and `amt` as aliases:
    records using the aliases fill `customer_id` and `amount`; no new columns appear."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, LongType, NestedField

    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        validation={"not_null": ["customer_id"]},
        format={"metadata": "none"},
    )
    spec = load_pipeline(path)
    catalog = load_catalog(spec)
    catalog.create_namespace_if_not_exists("rpc")
    mapping = [{"field-id": 1, "names": ["customer_id", "custId"]}, {"field-id": 2, "names": ["amount", "amt"]}]
    catalog.create_table(
        "rpc.orders",
        Schema(NestedField(1, "customer_id", LongType()), NestedField(2, "amount", DoubleType())),
        properties={"schema.name-mapping.default": json.dumps(mapping)},
    )
    values = [json.dumps({"custId": i, "amt": i * 2.5}).encode() for i in range(7)]
    values += [json.dumps({"customer_id": 100, "amount": 1.0}).encode()]
    produce_to_partition(broker.bootstrap, topic, 0, values)
    assert ingest_inline(spec).records == 8
    table = table_of(path)
    assert [f.name for f in table.schema().fields] == ["customer_id", "amount"]
    rows = table.scan().to_arrow().sort_by("customer_id")
    assert rows.column("customer_id").to_pylist() == [0, 1, 2, 3, 4, 5, 6, 100]
    assert rows.column("amount").to_pylist()[:3] == [0.0, 2.5, 5.0]
    assert committed_state(table).offsets == {topic: {0: 8}}


def test_racing_evolutions_keep_every_new_field(home):
    """Four writers add different fields (and one widens a column) to the same table at once: every
    change lands, none is lost to a conflict."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import IntegerType, NestedField

    spec = load_pipeline(write_pipeline(home))
    catalog = load_catalog(spec)
    catalog.create_namespace_if_not_exists("rpc")
    catalog.create_table("rpc.orders", Schema(NestedField(1, "n", IntegerType())))
    datas = [pa.table({"n": pa.array([1], pa.int32()), f"f{i}": [i]}) for i in range(3)]
    datas.append(pa.table({"n": pa.array([2**40], pa.int64())}))
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(datas))

    def evolve(d: pa.Table) -> None:
        try:
            barrier.wait()
            ensure_table(load_catalog(spec), spec.table, load_table(load_catalog(spec), "rpc.orders"), d)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=evolve, args=(d,)) for d in datas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    fields = {f.name: str(f.field_type) for f in load_table(load_catalog(spec), "rpc.orders").schema().fields}
    assert fields == {"n": "long", "f0": "long", "f1": "long", "f2": "long"}


def test_dead_letters_also_go_to_a_kafka_topic_once(broker, home, topic):
    """dead_letter.topic: the batch's dead letters are sent with their raw value and headers naming the
    source record and the error; a retried commit step does not send them again."""
    from confluent_kafka import Consumer

    from tidewater.steps.lifecycle import commit_step

    dlq_topic = topic + "-dlq"
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, dead_letter={"topic": dlq_topic})
    spec = load_pipeline(path)
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(dlq_topic, 1, 1)])[dlq_topic].result(15)
    good = pizza_events(10, seed=3)
    values = good[:4] + [b"{broken", b'"just a string"'] + good[4:]
    produce_to_partition(broker.bootstrap, topic, 0, values)
    from tests.conftest import stage_inline
    from tidewater.steps.lifecycle import validate_step

    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    result = commit_step(spec, plan, manifest)
    assert (result.records, result.dead_letters) == (12, 2)
    again = commit_step(spec, plan, manifest)  # a retry after success
    assert again.status == "already-committed"

    dlq_table = load_table(load_catalog(spec), spec.dead_letter_table())
    assert find_batch_snapshot(dlq_table, plan.batch_id).summary.additional_properties[DEAD_LETTER_TOPIC] == dlq_topic
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "t-" + dlq_topic, "auto.offset.reset": "earliest"})
    c.subscribe([dlq_topic])
    got = []
    deadline = datetime.now(timezone.utc).timestamp() + 30
    while datetime.now(timezone.utc).timestamp() < deadline and len(got) < 3:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m)
        elif got and m is None:
            break
    c.close()
    assert len(got) == 2  # exactly the two dead letters, not again after the retried commit
    heads = [dict((k, v.decode()) for k, v in m.headers()) for m in got]
    assert [m.value() for m in got] == [b"{broken", b'"just a string"']
    assert [h["tidewater.offset"] for h in heads] == ["4", "5"]
    assert [h["tidewater.error.class"] for h in heads] == ["InvalidJson", "TypeMismatch"]
    assert {h["tidewater.topic"] for h in heads} == {topic} and {h["tidewater.batch-id"] for h in heads} == {plan.batch_id}
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 10
    assert committed_state(table).offsets == {topic: {0: 12}}


def test_partitioned_batch_failure_leaves_no_files_and_a_retried_commit_adds_nothing(broker, home, topic):
    """Partitioned writer, failure paths: a task that fails on a record (policy fail) after writing files
    into several partitions removes them all and nothing is committed; the batch re-planned with the
    dead-letter policy commits once, and running its commit step again adds no rows."""

    from tests.conftest import stage_inline
    from tidewater.errors import TidewaterError
    from tidewater.steps.lifecycle import commit_step, validate_step

    settings = dict(
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        table={"identifier": "rpc.orders", "partition_by": ["hour(date_ordered)", "store_id"]},
        format={"timestamps": {"date_ordered": "%Y-%m-%d %H:%M:%S"}},
        batch={"chunk_records": 20},
    )
    path = write_pipeline(home, dead_letter={"policy": "fail"}, **settings)
    good = pizza_events(120, seed=9, start=datetime(2024, 3, 1, 10, 59))
    produce_to_partition(broker.bootstrap, topic, 0, good[:60], partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, good[60:85] + [b'{"order_id": "x", "store_id": '] + good[85:])
    with pytest.raises(TidewaterError, match="offset=25"):
        ingest_inline(load_pipeline(path))
    assert table_of(path) is None, "the table the failed batch created is dropped again (nothing committed)"
    assert list((home / "warehouse").rglob("*.parquet")) == [], "every partition file of the failed batch was removed"

    path = write_pipeline(home, **settings)
    spec = load_pipeline(path)
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    first, second = commit_step(spec, plan, manifest), commit_step(spec, plan, manifest)
    assert (first.status, second.status) == ("committed", "already-committed")
    table = table_of(path)
    rows = table.scan().to_arrow()
    assert rows.num_rows == 120 and len(set(rows.column("order_id").to_pylist())) == 120
    assert len(table.snapshots()) == 1
    assert sum(p["record_count"] for p in table.inspect.partitions().to_pylist()) == 120
    assert len({p["partition"]["date_ordered_hour"] for p in table.inspect.partitions().to_pylist()}) == 2
    assert committed_state(table).offsets == {topic: {0: 60, 1: 61}}
    _accounting(table, 121, 1)


def test_columns_of_mostly_distinct_values_are_written_without_a_dictionary_with_the_same_rows_and_metrics(home, monkeypatch):
    """The writer leaves Parquet's dictionary out for columns whose values are mostly distinct (ids, offsets, times:
    write.parquet.DISTINCT_SHARE): the same 60,000 pizza events written with a dictionary for every column (as before)
    and with the choice give the same rows, and the same Iceberg metrics but the sizes (value, null and NaN counts,
    lower and upper bounds); the chosen files are smaller, and their encodings show the choice."""
    import io

    import pyarrow.json as pj
    import pyarrow.parquet as pq

    import tidewater.write.parquet as parquet

    path = write_pipeline(home, topics=["t"], kafka={"bootstrap_servers": "127.0.0.1:1"}, table={"identifier": "rpc.dict"})
    spec = load_pipeline(path)
    events = pj.read_json(io.BytesIO(b"\n".join(pizza_events(60_000, seed=34))))
    table = ensure_table(load_catalog(spec), spec.table, None, events)

    def written(prefix: str) -> tuple[list[dict], pa.Table]:
        writer = parquet.DataFileWriter(table, prefix)
        for batch in parquet.to_table_schema(table, events).to_batches(max_chunksize=20_000):
            writer.write(pa.Table.from_batches([batch]))
        files = writer.close()
        rows = pa.concat_tables(pq.read_table(f["file_path"].removeprefix("file://")) for f in files)
        return files, rows.sort_by("order_id")

    assert parquet.dictionary_columns(parquet.to_table_schema(table, events)) == [
        "store_id",
        "sauce",
        "cheese",
        "meats",
        "veggies",
    ]  # order_id and date_ordered: mostly distinct
    chosen, chosen_rows = written("chosen")
    monkeypatch.setattr(parquet, "dictionary_columns", lambda rows: True)  # every column: the writer before the choice
    every, every_rows = written("every")
    assert chosen_rows.equals(every_rows) and chosen_rows.num_rows == 60_000
    same = ("record_count", "value_counts", "null_value_counts", "nan_value_counts", "lower_bounds", "upper_bounds")
    assert [{k: f[k] for k in same} for f in chosen] == [{k: f[k] for k in same} for f in every]
    assert sum(f["file_size_in_bytes"] for f in chosen) < sum(f["file_size_in_bytes"] for f in every)
    meta = pq.ParquetFile(chosen[0]["file_path"].removeprefix("file://")).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    assert "RLE_DICTIONARY" not in encodings["order_id"] and "RLE_DICTIONARY" in encodings["sauce"], encodings
