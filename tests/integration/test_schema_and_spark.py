"""Tables created from the data keep nested structs and lists, and Spark reads them through the same catalog."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ingest_inline, produce_to_partition, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.spark import session as spark_session
from tidewater.table.catalog import load_catalog, load_table

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_nested_types_evolution_and_spark_read(broker, home, topic):
    """Batch 1 creates the table (long, double, boolean, string, struct, list); batch 2 adds a top-level
    field and a field inside the struct. Spark SQL on the JDBC catalog sees every row and the new fields."""
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, validation={"not_null": ["id"]}, format={"metadata": "none"}
    )
    spec = load_pipeline(path)
    first = [
        json.dumps(
            {
                "id": i,
                "amount": i * 1.5,
                "paid": i % 2 == 0,
                "payer": f"p{i}",
                "address": {"city": "Oslo", "zip": 1000 + i},
                "items": [{"sku": "a", "qty": i}],
            }
        ).encode()
        for i in range(10)
    ]
    produce_to_partition(broker.bootstrap, topic, 0, first)
    assert ingest_inline(spec).records == 10
    table = load_table(load_catalog(spec), spec.table.identifier)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert types["id"] == "long" and types["amount"] == "double" and types["paid"] == "boolean"
    assert types["payer"] == "string"
    assert types["address"].startswith("struct<") and "city: optional string" in types["address"]
    assert types["items"].startswith("list<struct<")

    second = [
        json.dumps({"id": 10 + i, "payer": "q", "channel": "web", "address": {"city": "Rome", "country": "IT"}}).encode() for i in range(5)
    ]
    produce_to_partition(broker.bootstrap, topic, 0, second)
    assert ingest_inline(spec).records == 5
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert table.schema().find_field("channel") and table.schema().find_field("address.country")

    spark = spark_session.session(spec, app_name="tidewater-test", master="local[1]")
    try:
        rows = spark.sql(
            f"SELECT count(*) AS n, count(channel) AS web, count(address.country) AS countries, "
            f"sum(size(items)) AS items FROM {spec.catalog.name}.rpc.orders"
        ).collect()[0]
    finally:
        spark.stop()
    assert (rows["n"], rows["web"], rows["countries"], rows["items"]) == (15, 5, 5, 10)


def test_evolution_off_ignores_new_fields_and_reports_them(broker, home, topic):
    """table.evolve_schema false: a batch with a new top-level field and a new field inside a struct lands
    without them; the schema is unchanged and the snapshot names the ignored fields."""
    from tidewater.table.summary import IGNORED_FIELDS

    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        table={"identifier": "rpc.orders", "evolve_schema": False},
        validation={"not_null": ["id"]},
        format={"metadata": "none"},
    )
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, [json.dumps({"id": i, "address": {"city": "Oslo"}}).encode() for i in range(3)])
    ingest_inline(spec)  # creates the table (auto_create is on)
    produce_to_partition(
        broker.bootstrap,
        topic,
        0,
        [json.dumps({"id": 10 + i, "coupon": "X", "address": {"city": "Rome", "zip": 100}}).encode() for i in range(4)],
    )
    assert ingest_inline(spec).records == 4
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert [f.name for f in table.schema().fields] == ["id", "address"]
    assert table.schema().find_field("address").field_type.fields[0].name == "city"
    assert len(table.schema().find_field("address").field_type.fields) == 1
    rows = table.scan().to_arrow().sort_by("id").to_pylist()
    assert len(rows) == 7 and rows[-1] == {"id": 13, "address": {"city": "Rome"}}
    assert table.current_snapshot().summary.additional_properties[IGNORED_FIELDS] == "address.zip,coupon"
