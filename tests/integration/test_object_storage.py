"""Warehouse on S3-compatible object storage through pyiceberg's FileIO (`s3.*` catalog properties), against a
local S3 endpoint (moto's server: a stand-in for MinIO/S3, which cannot run here). The write job's tasks write
Parquet to the bucket from Python; change tables put their delete files there too; the Spark side (maintenance,
`tidewater sql`) needs Iceberg's AWS bundle, which is not available offline: its absence is a clear error."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ingest_changes, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.errors import ConfigError
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEY, SECRET = "tidewater-test-key", "tidewater-test-secret-value"


def _bucket(url: str, name: str) -> None:
    from pyarrow import fs

    s3 = fs.S3FileSystem(
        endpoint_override=url, scheme="http", access_key=KEY, secret_key=SECRET, region="us-east-1", allow_bucket_creation=True
    )
    s3.create_dir(name)


def _catalog(home, url: str, bucket: str, monkeypatch) -> dict:
    monkeypatch.setenv("TEST_S3_KEY", KEY)
    monkeypatch.setenv("TEST_S3_SECRET", SECRET)
    return {
        "name": "tidewater",
        "properties": {
            "type": "sql",
            "uri": f"sqlite:///{home}/catalog.db",
            "warehouse": f"s3://{bucket}/warehouse",
            "s3.endpoint": url,
            "s3.access-key-id": "${TEST_S3_KEY}",
            "s3.secret-access-key": "${TEST_S3_SECRET}",
            "s3.region": "us-east-1",
        },
    }


def test_batches_land_in_the_bucket_through_spark_submit_and_secrets_stay_out(broker, home, topic, s3_endpoint, monkeypatch):
    """`tidewater run` (spark-submit): the executors write the data files into the bucket, the commit lands
    every record once with exact offsets, and the secret key is in no staged file, log line or snapshot."""
    from tidewater.runtime.progress import BatchProgress
    from tidewater.steps.lifecycle import run_once

    _bucket(s3_endpoint, "lake")
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, catalog=_catalog(home, s3_endpoint, "lake", monkeypatch)
    )
    events = pizza_events(90, seed=501)
    produce(broker.bootstrap, topic, events, partitions=3)
    lines: list[str] = []
    result = run_once(path, progress=BatchProgress(lines.append))
    assert result["records"] == 90
    spec = load_pipeline(path)
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert table.scan().to_arrow().num_rows == 90
    assert committed_state(table).offsets == {topic: {0: 30, 1: 30, 2: 30}}
    paths = [f["file_path"] for f in table.inspect.files().to_pylist()]
    assert paths and all(p.startswith("s3://lake/warehouse/") for p in paths)
    assert table.metadata_location.startswith("s3://lake/warehouse/")
    staged = [p.read_bytes() for p in spec.staging_dir().rglob("*") if p.is_file()]
    assert staged and not any(SECRET.encode() in b for b in staged)
    assert not any(SECRET in line for line in lines)
    assert f"[4/4] commit   {spec.table.identifier}: rows appended, the offsets in the same snapshot" in lines, lines
    assert not any(SECRET in json.dumps(dict(s.summary.additional_properties)) for s in table.snapshots())


def test_a_change_table_in_the_bucket_equals_its_source(broker, home, topic, s3_endpoint, monkeypatch):
    """Debezium changes in two batches: the row images and the position delete files go to the bucket, and the
    table equals the reference model."""
    _bucket(s3_endpoint, "changes")
    spec = load_pipeline(
        write_pipeline(
            home,
            name="prices",
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            format={"value": "debezium"},
            validation={"not_null": ["id"]},
            catalog=_catalog(home, s3_endpoint, "changes", monkeypatch),
            table={"identifier": "rpc.prices", "id_columns": ["id"], "upsert": True},
        )
    )
    model = ingest_changes(broker, topic, spec, batches=2, changes=80, keys=25, seed=90)
    table = load_table(load_catalog(spec), spec.table.identifier)
    rows = {r["id"]: r["item"] for r in table.scan(selected_fields=("id", "item")).to_arrow().to_pylist()}
    assert rows == {k: v["item"] for k, v in model.items()}
    files = table.inspect.files().to_pylist()
    assert any(f["content"] == 1 for f in files) and all(f["file_path"].startswith("s3://changes/") for f in files)


def test_spark_on_object_storage_names_the_aws_bundle_it_needs(home, s3_endpoint, monkeypatch):
    """Maintenance and `tidewater sql` run Iceberg in Spark, whose S3FileIO needs the AWS SDK bundle: without
    it (no Maven here) the session is refused before the JVM starts, naming the artifact and the setting."""
    from tidewater.spark import conf as spark_conf_module
    from tidewater.spark import session as spark_session

    spec = load_pipeline(write_pipeline(home, catalog=_catalog(home, s3_endpoint, "lake2", monkeypatch)))
    conf = spark_conf_module.catalog_conf(spec)
    assert conf["spark.sql.catalog.tidewater.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert conf["spark.sql.catalog.tidewater.s3.endpoint"] == s3_endpoint
    assert conf["spark.sql.catalog.tidewater.client.region"] == "us-east-1"
    with pytest.raises(ConfigError, match="iceberg-aws-bundle") as e:
        spark_session.session(spec, app_name="tidewater-test-s3")
    assert "spark.iceberg_packages" in str(e.value) and SECRET not in str(e.value)
