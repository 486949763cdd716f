"""`tidewater connect-import`: every key of a Kafka Connect Iceberg sink configuration is mapped or
reported with a reason; secrets are never copied; both spellings of the keys are understood."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tidewater.config.parse import parse_pipeline
from tidewater.errors import ConfigError
from tidewater.interop.connect import convert

APACHE = {
    "name": "events-sink",
    "config": {
        "connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
        "tasks.max": "4",
        "topics": "events,audit",
        "iceberg.tables": "db.events_list,db.events_create",
        "iceberg.tables.route-field": "type",
        "iceberg.table.db.events_list.route-regex": "list",
        "iceberg.table.db.events_create.route-regex": "create|update",
        "iceberg.table.db.events_create.id-columns": "id",
        "iceberg.table.db.events_create.partition-by": "day(ts), bucket(id, 16)",
        "iceberg.table.db.events_list.commit-branch": "staging",
        "iceberg.tables.default-partition-by": "hour(ts)",
        "iceberg.tables.default-id-columns": "event_id",
        "iceberg.tables.auto-create-enabled": "true",
        "iceberg.tables.auto-create-props.format-version": "2",
        "iceberg.tables.write-props.write.parquet.compression-codec": "zstd",
        "iceberg.tables.evolve-schema-enabled": "true",
        "iceberg.tables.schema-force-optional": "true",
        "iceberg.tables.schema-case-insensitive": "true",
        "iceberg.tables.default-commit-branch": "main",
        "iceberg.control.commit.interval-ms": "300000",
        "iceberg.control.topic": "control-iceberg",
        "iceberg.catalog.type": "rest",
        "iceberg.catalog.uri": "https://catalog.example.com",
        "iceberg.catalog.credential": "client:very-secret",
        "iceberg.catalog.warehouse": "analytics",
        "iceberg.kafka.security.protocol": "SASL_SSL",
        "iceberg.kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required;",
        "consumer.override.auto.offset.reset": "earliest",
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "errors.tolerance": "all",
        "errors.deadletterqueue.topic.name": "events-dlq",
        "iceberg.tables.cdc-field": "_cdc_op",
        "iceberg.tables.upsert-mode-enabled": "false",
        "transforms": "flatten",
        "transforms.flatten.type": "org.apache.kafka.connect.transforms.Flatten$Value",
        "some.unknown.key": "1",
    },
}


def test_every_key_is_mapped_or_reported_and_the_result_validates(monkeypatch):
    res = convert(APACHE, bootstrap="broker:9092")
    keys = set(APACHE["config"])
    assert {k for k, _ in res.mapped} | {k for k, _ in res.unmapped} == keys
    unmapped = dict(res.unmapped)
    for k in (
        "iceberg.tables.cdc-field",
        "iceberg.tables.upsert-mode-enabled",
        "transforms",
        "some.unknown.key",
        "iceberg.control.topic",
        "consumer.override.auto.offset.reset",
        "connector.class",
    ):
        assert unmapped[k], k
    p = res.pipeline
    assert p["name"] == "events_sink" and p["topics"] == ["events", "audit"] and p["schedule"] == "*/5 * * * *"
    assert p["routing"] == {"field": "type", "namespace": "db"}
    tables = {t["identifier"]: t for t in p["tables"]}
    assert tables["db.events_list"] == {"identifier": "db.events_list", "route_regex": "list", "branch": "staging"}
    assert tables["db.events_create"]["partition_by"] == ["day(ts)", "bucket(id, 16)"]
    assert tables["db.events_create"]["id_columns"] == ["id"]
    assert p["table"]["partition_by"] == ["hour(ts)"] and p["table"]["case_insensitive"] is True
    assert p["table"]["properties"] == {"format-version": "2", "write.parquet.compression-codec": "zstd"}
    assert p["format"] == {"key": "string", "value": "json", "metadata": "prefixed"}
    assert p["dead_letter"] == {"policy": "dead_letter", "topic": "events-dlq"}
    assert p["spark"] == {"master": "local[4]"}
    assert p["catalog"]["properties"]["type"] == "rest"
    text = yaml.safe_dump(p)
    assert "very-secret" not in text and "PlainLoginModule" not in text
    assert p["catalog"]["properties"]["credential"].startswith("${TIDEWATER_EVENTS_SINK_")
    for _, var in res.env:
        monkeypatch.setenv(var, "x")
    spec = parse_pipeline(p)
    assert spec.routed and spec.table_spec("db.events_create").partition_by == ["day(ts)", "bucket(id, 16)"]
    assert spec.table_spec("db.events_list").partition_by == ["hour(ts)"]  # the default
    assert spec.table_spec("db.events_list").id_columns == ["event_id"]


def test_original_spellings_without_wrapper_and_dynamic_routing():
    original = {
        "topics": "payments",
        "iceberg.tables.dynamic.enabled": "true",
        "iceberg.tables.routeField": "tenant",
        "iceberg.tables.defaultCommitBranch": "main",
        "iceberg.tables.cdcField": "op",
        "iceberg.tables.upsertModeEnabled": "true",
        "iceberg.control.commitIntervalMs": "30000",
        "iceberg.catalog": "lake",
        "iceberg.catalog.catalog-impl": "org.apache.iceberg.rest.RESTCatalog",
    }
    res = convert(original, name="pay")
    p = res.pipeline
    assert p["routing"] == {"dynamic": True, "field": "tenant", "namespace": "default", "table_template": "{value}"}
    # iceberg.catalog is the catalog's NAME in the Connect sink; its class comes from catalog-impl
    assert p["schedule"] == "* * * * *" and p["catalog"] == {"name": "lake", "properties": {"type": "rest"}}
    assert p["format"]["metadata"] == "prefixed"  # replay and backfills work on an imported pipeline
    assert {k for k, _ in res.unmapped} == {"iceberg.tables.cdcField", "iceberg.tables.upsertModeEnabled"}
    assert ("(bootstrap servers)", "KAFKA_BOOTSTRAP_SERVERS") in res.env


def test_no_topics_is_a_clear_error():
    with pytest.raises(ConfigError, match="no `topics`"):
        convert({"iceberg.tables": "db.t"})


def test_the_command_writes_a_file_that_loads(tmp_path: Path):
    src = tmp_path / "connector.json"
    src.write_text(
        json.dumps(
            {
                "name": "one",
                "config": {
                    "topics": "a",
                    "iceberg.tables": "db.a",
                    "iceberg.catalog.type": "rest",
                    "iceberg.catalog.uri": "http://c",
                    "iceberg.catalog.credential": "s3cret",
                },
            }
        )
    )
    out = tmp_path / "one.yaml"
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "tidewater"),
            "connect-import",
            str(src),
            "-o",
            str(out),
            "--bootstrap-servers",
            "127.0.0.1:9092",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "s3cret" not in out.read_text() + proc.stderr
    assert "iceberg.catalog.credential -> ${TIDEWATER_ONE_CATALOG_CREDENTIAL}" in proc.stderr
    doc = yaml.safe_load(out.read_text())
    assert doc["table"] == {"identifier": "db.a"} and doc["topics"] == ["a"]
    assert doc["catalog"]["properties"] == {"type": "rest", "uri": "http://c", "credential": "${TIDEWATER_ONE_CATALOG_CREDENTIAL}"}


def test_shipped_examples_validate(tmp_path: Path):
    """docs/examples: the routed pipeline validates, and the Scenario 1 connector imports into one that does."""
    from tidewater.config.parse import load_pipeline

    examples = Path(__file__).resolve().parents[2] / "docs" / "examples"
    spec = load_pipeline(examples / "payments_by_type.yaml")
    assert spec.routed and [t.identifier for t in spec.tables] == ["payments.debit", "payments.credit", "payments.bank_slip"]
    assert spec.table_spec("payments.debit").partition_by == ["day(created_at)"]
    res = convert(json.loads((examples / "pizzas-connector.json").read_text()), bootstrap="127.0.0.1:19092")
    p = parse_pipeline(res.pipeline)
    assert (p.name, p.table.identifier, p.schedule, p.spark.master) == ("pizzas_sink", "rpc.pizzas", "*/3 * * * *", "local[6]")
    assert p.format.value == "json" and p.format.key == "string"
    assert [k for k, _ in res.unmapped] == ["connector.class"]


def test_import_options_point_the_pipeline_at_another_catalog(tmp_path: Path, monkeypatch):
    """A user moving from a REST/MinIO setup: `--catalog local` drops the connector's catalog settings (the
    local default catalog), `--catalog-uri`/`--warehouse` replace them (a password in the URI becomes an
    environment reference); the result validates and runs as it is."""
    connector = {
        "name": "one",
        "config": {
            "topics": "a",
            "iceberg.tables": "db.a",
            "iceberg.catalog": "prod",
            "iceberg.catalog.type": "rest",
            "iceberg.catalog.uri": "https://rest:8181",
            "iceberg.catalog.warehouse": "s3://bucket/wh",
        },
    }
    local = convert(connector, catalog="local").pipeline
    assert local["catalog"] == {"name": "prod"}
    other = convert(connector, catalog_uri="postgresql+psycopg2://u:pw@db/cat", warehouse="/data/wh")
    props = other.pipeline["catalog"]["properties"]
    assert props == {"type": "sql", "uri": "${TIDEWATER_ONE_CATALOG_URI}", "warehouse": "/data/wh"}
    assert "pw@" not in yaml.safe_dump(other.pipeline) and ("--catalog-uri", "TIDEWATER_ONE_CATALOG_URI") in other.env
    with pytest.raises(ConfigError, match="--catalog: 'remote' is not known"):
        convert(connector, catalog="remote")
    src = tmp_path / "c.json"
    src.write_text(json.dumps(connector))
    out = tmp_path / "one.yaml"
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "tidewater"),
            "connect-import",
            str(src),
            "--catalog",
            "local",
            "--bootstrap-servers",
            "127.0.0.1:9092",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "replaced by the local default catalog" in proc.stderr
    spec = parse_pipeline(yaml.safe_load(out.read_text()))
    assert spec.catalog.name == "prod" and spec.catalog.properties == {} and spec.format.metadata == "prefixed"


def test_a_debezium_upsert_connector_becomes_a_change_pipeline():
    """The Iceberg sink's Debezium transform, cdc-field and upsert mode map to the debezium format with upserts
    by the id columns; the result validates as a change table."""
    res = convert(
        {
            "name": "prices-cdc",
            "config": {
                "topics": "pg.public.prices",
                "iceberg.tables": "db.prices",
                "iceberg.tables.default-id-columns": "id",
                "iceberg.tables.cdc-field": "_cdc.op",
                "iceberg.tables.upsert-mode-enabled": "true",
                "transforms": "debezium",
                "transforms.debezium.type": "org.apache.iceberg.connect.transforms.DebeziumTransform",
                "iceberg.catalog.type": "sql",
                "iceberg.catalog.uri": "sqlite:////tmp/x.db",
            },
        },
        bootstrap="broker:9092",
    )
    assert not [k for k, _ in res.unmapped if "cdc" in k or "upsert" in k or k.startswith("transforms")], res.unmapped
    p = res.pipeline
    assert p["format"]["value"] == "debezium" and p["table"]["upsert"] is True and "op_field" not in p["table"]
    spec = parse_pipeline(p)
    assert spec.applies_changes and spec.op_column() == "_op" and spec.table.id_columns == ["id"]


def test_an_op_field_connector_keeps_its_field():
    res = convert(
        {
            "name": "orders",
            "config": {
                "topics": "orders",
                "iceberg.tables": "db.orders",
                "iceberg.tables.default-id-columns": "order_id",
                "iceberg.tables.cdc-field": "op",
            },
        },
        bootstrap="broker:9092",
    )
    spec = parse_pipeline(res.pipeline)
    assert spec.applies_changes and spec.op_column() == "op"


def test_a_json_schema_converter_reads_its_registry_and_keeps_its_credentials_out_of_the_file(monkeypatch):
    """Confluent's JsonSchemaConverter is the json_schema format; its registry URL is mapped and its basic auth is a
    secret: named as an environment variable, never copied."""
    res = convert(
        {
            "name": "orders-sink",
            "config": {
                "topics": "orders",
                "iceberg.tables": "db.orders",
                "value.converter": "io.confluent.connect.json.JsonSchemaConverter",
                "value.converter.schema.registry.url": "https://registry.example.com",
                "value.converter.basic.auth.user.info": "user:very-secret",
                "iceberg.catalog.type": "sql",
                "iceberg.catalog.uri": "sqlite:////tmp/x.db",
            },
        },
        bootstrap="broker:9092",
    )
    fmt = res.pipeline["format"]
    assert (fmt["value"], fmt["registry_url"]) == ("json_schema", "https://registry.example.com")
    assert fmt["registry_basic_auth"].startswith("${") and "very-secret" not in json.dumps(res.pipeline)
    assert not [k for k, _ in res.unmapped if k.startswith("value.converter")], res.unmapped
    monkeypatch.setenv(fmt["registry_basic_auth"][2:-1], "user:from-the-environment")
    assert parse_pipeline(res.pipeline).format.value == "json_schema"


def test_a_protobuf_converter_is_the_protobuf_format():
    res = convert(
        {
            "name": "events-sink",
            "config": {
                "topics": "events",
                "iceberg.tables": "db.events",
                "value.converter": "io.confluent.connect.protobuf.ProtobufConverter",
                "value.converter.schema.registry.url": "http://registry:8081,http://registry2:8081",
                "iceberg.catalog.type": "sql",
                "iceberg.catalog.uri": "sqlite:////tmp/x.db",
            },
        },
        bootstrap="broker:9092",
    )
    assert (res.pipeline["format"]["value"], res.pipeline["format"]["registry_url"]) == ("protobuf", "http://registry:8081")
    assert parse_pipeline(res.pipeline).format.value == "protobuf"


def test_a_debezium_connector_with_the_protobuf_converter_is_the_debezium_protobuf_format():
    res = convert(
        {
            "name": "prices-cdc",
            "config": {
                "topics": "pg.public.prices",
                "iceberg.tables": "db.prices",
                "iceberg.tables.default-id-columns": "id",
                "iceberg.tables.upsert-mode-enabled": "true",
                "transforms": "debezium",
                "transforms.debezium.type": "org.apache.iceberg.connect.transforms.DebeziumTransform",
                "value.converter": "io.confluent.connect.protobuf.ProtobufConverter",
                "value.converter.schema.registry.url": "http://registry:8081",
                "iceberg.catalog.type": "sql",
                "iceberg.catalog.uri": "sqlite:////tmp/x.db",
            },
        },
        bootstrap="broker:9092",
    )
    spec = parse_pipeline(res.pipeline)
    assert spec.format.value == "debezium_protobuf" and spec.applies_changes and spec.op_column() == "_op"
