"""Run by tests/integration/test_glue_catalog.py in the Glue test environment (`make glue-env`: the package with boto3,
which cannot be installed beside Airflow 3.3's python-dateutil 4.0.0), against moto's server (Glue, STS and S3: the
stand-in for AWS, which cannot run here). Not a test module: ``python glue_on_moto.py COMMAND CONFIG_JSON``.

The table is ``<bucket>.orders`` (the bucket's name with ``_`` for ``-``): one Glue database per test on the session's
moto server.

- ``batch``: an ``aws`` connection (keys, region_name, endpoint_url, role_arn) mapped to pyiceberg's Glue catalog
  properties (the role assumed through moto's STS), the pipeline file written with them, one whole batch
  (the write task's code inline, validation, commit); prints the commit's summary as JSON.
- ``batch-twice``: the same, then its commit step again (a retry after success); prints both summaries.
- ``write-then-hang``: plans and writes a batch (its manifest staged as the write step stages it), prints
  ``written`` and sleeps, for the test to SIGKILL it before validation and commit.
- ``maintain``: the maintenance DAG's actions (``tidewater.ops.maintenance.maintain``: compaction, then snapshot expiry)
  through Spark's Glue catalog (Iceberg's runtime and AWS bundle from Maven: ``spark.iceberg_packages``), the role's
  temporary keys in the driver JVM's environment; prints the files before and after and the actions' reports.
- ``report``: the table's rows, offsets, columns, the Glue table's metadata location and the deep audit, as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import yaml

ROLE = "arn:aws:iam::123456789012:role/tidewater-ingest"
# Spark's Glue catalog: Iceberg's runtime and its AWS bundle (the AWS SDK), as the production page says to set them
SPARK_PACKAGES = "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.12.0,org.apache.iceberg:iceberg-aws-bundle:1.12.0"


def properties(cfg: dict) -> dict[str, str]:
    from tidewater.config.connections import glue_properties_of

    conn = SimpleNamespace(
        conn_id="lake_glue",
        login="AKIAGLUETESTKEY00000",
        password="glue-secret-value",
        extra_dejson={"region_name": "us-east-1", "endpoint_url": cfg["endpoint"], "role_arn": ROLE},
    )
    props = glue_properties_of(conn)
    assert props["client.access-key-id"] != conn.login, "the role's temporary keys replace the connection's"
    return {
        **props,
        "warehouse": f"s3://{cfg['bucket']}/warehouse",
        "s3.region": "us-east-1",
        "s3.access-key-id": props["client.access-key-id"],
        "s3.secret-access-key": props["client.secret-access-key"],
        "s3.session-token": props["client.session-token"],
    }


def pipeline(cfg: dict):
    from tidewater.config.parse import load_pipeline

    path = Path(cfg["home"]) / "orders.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "orders",
                "topics": [cfg["topic"]],
                "schedule": None,
                "kafka": {"bootstrap_servers": cfg["bootstrap"], "read_timeout_seconds": 20},
                "table": {"identifier": cfg["bucket"].replace("-", "_") + ".orders"},
                "batch": {"max_records": 100000, "chunk_records": 400},
                "validation": {"not_null": ["order_id"]},
                "spark": {"master": "local[1]", "iceberg_packages": SPARK_PACKAGES},
                "maintenance": {"rewrite_data_files": {"min_input_files": 2}},
                "catalog": {"name": "glue", "properties": properties(cfg)},
            }
        )
    )
    return load_pipeline(path)


def batch(cfg: dict) -> dict:
    from tidewater.plan.ingest import plan_batch
    from tidewater.source.kafka import kafka_settings
    from tidewater.steps.lifecycle import commit_step, validate_step
    from tidewater.write.job import run_inline

    spec = pipeline(cfg)
    plan, _ = plan_batch(spec)
    manifest = run_inline(plan, spec, kafka_settings(spec))
    validate_step(spec, plan, manifest)
    return commit_step(spec, plan, manifest).summary()


def batch_twice(cfg: dict) -> dict:
    from tidewater.plan.ingest import plan_batch
    from tidewater.source.kafka import kafka_settings
    from tidewater.steps.lifecycle import commit_step, validate_step
    from tidewater.write.job import run_inline

    spec = pipeline(cfg)
    plan, _ = plan_batch(spec)
    manifest = run_inline(plan, spec, kafka_settings(spec))
    validate_step(spec, plan, manifest)
    return {"first": commit_step(spec, plan, manifest).summary(), "again": commit_step(spec, plan, manifest).summary()}


def write_then_hang(cfg: dict) -> dict:
    import time

    from tidewater.batch import manifest_path, write_json_atomic
    from tidewater.plan.ingest import plan_batch
    from tidewater.source.kafka import kafka_settings
    from tidewater.write.job import run_inline

    spec = pipeline(cfg)  # the write task's code inline (no Spark in this environment), staged as the write step does
    plan, path = plan_batch(spec)
    write_json_atomic(manifest_path(path), run_inline(plan, spec, kafka_settings(spec)).to_json())
    print("written", flush=True)
    time.sleep(600)
    return {}


def maintain(cfg: dict) -> dict:
    from tidewater.ops.maintenance import maintain as run_maintenance
    from tidewater.table.catalog import load_catalog, load_table

    spec = pipeline(cfg)
    before = len(load_table(load_catalog(spec), spec.table.identifier).inspect.files())
    reports = run_maintenance(spec, actions=["rewrite_data_files", "expire_snapshots"])
    after = load_table(load_catalog(spec), spec.table.identifier)
    return {
        "files_before": before,
        "files_after": len(after.inspect.files()),
        "operation": after.current_snapshot().summary.operation.value,
        "reports": [r.metadata() for r in reports],
    }


def report(cfg: dict) -> dict:
    from tidewater.audit.pipeline import audit
    from tidewater.table.catalog import load_catalog, load_table
    from tidewater.table.summary import committed_state

    spec = pipeline(cfg)
    table = load_table(load_catalog(spec), spec.table.identifier)
    rows = table.scan().to_arrow()
    found = audit(spec, deep=True)
    return {
        "rows": rows.num_rows,
        "distinct_order_ids": len(set(rows.column("order_id").to_pylist())),
        "offsets": committed_state(table).offsets,
        "columns": [f.name for f in table.schema().fields],
        "metadata_location": table.metadata_location,
        "files": [f["file_path"] for f in table.inspect.files().to_pylist()],
        "audit_errors": [f.text() for f in found.findings if f.severity == "error"],
        "audit_clean": found.clean,
    }


if __name__ == "__main__":
    command, config = sys.argv[1], json.loads(sys.argv[2])
    print(
        "RESULT "
        + json.dumps(
            {"batch": batch, "batch-twice": batch_twice, "write-then-hang": write_then_hang, "maintain": maintain, "report": report}[
                command
            ](config),
            default=str,
        ),
        flush=True,
    )
