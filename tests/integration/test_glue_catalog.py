"""Batches through pyiceberg's Glue catalog against moto's server (Glue, STS and S3: the stand-in for AWS, which
cannot run here). The catalog code runs in the Glue test environment (`make glue-env`, which make test builds): boto3's
botocore requires python-dateutil < 3 and Airflow 3.3's environment has 4.0.0, so boto3 lives in its own virtualenv
with the package, and ``glue_on_moto.py`` runs the steps there. The connection is an ``aws`` one as people write it
(keys, ``region_name``, ``endpoint_url``, ``role_arn``): its role is assumed through moto's STS and the batches commit
with the temporary keys."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, produce_to_partition
from tidewater_dev.sample_data import pizza_events

pytestmark = [pytest.mark.integration]

GLUE_PYTHON = REPO / ".data" / "glue-venv" / "bin" / "python"
SCRIPT = Path(__file__).parent / "glue_on_moto.py"


def _command(command: str, cfg: dict) -> tuple[list[str], dict[str, str]]:
    if not GLUE_PYTHON.is_file():
        pytest.fail(f"{GLUE_PYTHON} is missing: run `make glue-env` (make test does)")
    env = {"PATH": "/usr/bin:/bin", "TIDEWATER_HOME": cfg["home"], "PYTHONPATH": str(REPO / "include"), "GX_ANALYTICS_ENABLED": "false"}
    env.update({k: os.environ[k] for k in ("JAVA_HOME", "SPARK_LOCAL_IP", "TMPDIR") if k in os.environ})  # Spark, for maintain
    return [str(GLUE_PYTHON), str(SCRIPT), command, json.dumps(cfg)], env


def _run(command: str, cfg: dict) -> dict:
    cmd, env = _command(command, cfg)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_batches_and_a_schema_change_through_glue_with_an_assumed_role(broker, s3_endpoint, home, topic):
    """Two batches through the Glue catalog, the second's records carrying a new field. Expected: the table is made in
    Glue with its metadata in the bucket; 30 + 12 rows, each order once; the offsets at the end; the new field a
    column after the second commit; every data file in the bucket; the deep audit clean."""
    from pyarrow import fs

    fs.S3FileSystem(
        endpoint_override=s3_endpoint, scheme="http", access_key="any", secret_key="any", region="us-east-1", allow_bucket_creation=True
    ).create_dir("glue-lake")
    cfg = {"endpoint": s3_endpoint, "bucket": "glue-lake", "home": str(home), "topic": topic, "bootstrap": broker.bootstrap}
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(30, seed=600))
    first = _run("batch", cfg)
    assert (first["status"], first["records"], first["dead_letters"]) == ("committed", 30, 0)
    tipped = [json.dumps({**json.loads(v), "tip": 1.5}).encode() for v in pizza_events(12, seed=601)]
    produce_to_partition(broker.bootstrap, topic, 0, tipped)
    second = _run("batch", cfg)
    assert (second["status"], second["records"]) == ("committed", 12)
    got = _run("report", cfg)
    assert (got["rows"], got["distinct_order_ids"], got["offsets"]) == (42, 42, {topic: {"0": 42}})
    assert "tip" in got["columns"]
    assert got["metadata_location"].startswith("s3://glue-lake/warehouse/")
    assert got["files"] and all(p.startswith("s3://glue-lake/warehouse/") for p in got["files"])
    assert got["audit_clean"], got["audit_errors"]


def test_a_glue_batch_killed_after_its_write_then_rerun_and_retried_commits_once(broker, s3_endpoint, home, topic):
    """The process running a batch through Glue is SIGKILLed after its write step (manifest staged), before
    validation and commit; the rerun plans the same 25 offsets again and commits them, then its commit step runs a
    second time (a retry after success: already committed). Expected: nothing committed by the killed batch, 25 rows
    each once, offsets 25, the deep audit clean."""
    from pyarrow import fs

    fs.S3FileSystem(
        endpoint_override=s3_endpoint, scheme="http", access_key="any", secret_key="any", region="us-east-1", allow_bucket_creation=True
    ).create_dir("glue-kill")
    cfg = {"endpoint": s3_endpoint, "bucket": "glue-kill", "home": str(home), "topic": topic, "bootstrap": broker.bootstrap}
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(25, seed=602))
    cmd, env = _command("write-then-hang", cfg)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "written"
    finally:
        proc.kill()
        proc.wait()
    assert len(list((home / "staging").glob("*/*/manifest.json"))) == 1, "the killed batch's manifest was staged"
    done = _run("batch-twice", cfg)
    assert (done["first"]["status"], done["first"]["records"]) == ("committed", 25)
    assert done["again"]["status"] == "already-committed"
    got = _run("report", cfg)
    assert (got["rows"], got["distinct_order_ids"], got["offsets"]) == (25, 25, {topic: {"0": 25}})
    assert got["audit_clean"], got["audit_errors"]


def test_the_maintenance_actions_compact_and_expire_a_glue_table_through_spark_s_glue_catalog(broker, s3_endpoint, home, topic):
    """The maintenance DAG's code (``maintain``) on a Glue pipeline: Spark's Iceberg GlueCatalog against moto's Glue,
    its S3FileIO against moto's S3, Iceberg's runtime and AWS bundle from Maven (``spark.iceberg_packages``), the
    connection's role assumed through STS and its temporary keys in the Spark driver's environment (Iceberg's Glue
    client reads no keys from settings). Four batches make four files; compaction leaves fewer with the same rows and
    offsets, expiry keeps the tagged snapshot, the next batch commits once on top, and the deep audit is clean.
    Run in the Glue test environment, not through the Airflow task (Airflow's environment cannot hold boto3, see the
    module docstring); the task calls the same function."""
    from pyarrow import fs

    fs.S3FileSystem(
        endpoint_override=s3_endpoint, scheme="http", access_key="any", secret_key="any", region="us-east-1", allow_bucket_creation=True
    ).create_dir("glue-maintain")
    cfg = {"endpoint": s3_endpoint, "bucket": "glue-maintain", "home": str(home), "topic": topic, "bootstrap": broker.bootstrap}
    for b in range(4):
        produce_to_partition(broker.bootstrap, topic, 0, pizza_events(10, seed=620 + b))
        assert _run("batch", cfg)["records"] == 10
    done = _run("maintain", cfg)
    assert done["files_before"] == 4 and done["files_after"] < 4 and done["operation"] == "replace", done
    assert [r["action"] for r in done["reports"]] == ["rewrite_data_files", "expire_snapshots"], done["reports"]
    got = _run("report", cfg)
    assert (got["rows"], got["distinct_order_ids"], got["offsets"]) == (40, 40, {topic: {"0": 40}})
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(5, seed=625))
    assert _run("batch", cfg)["records"] == 5
    got = _run("report", cfg)
    assert (got["rows"], got["distinct_order_ids"], got["offsets"]) == (45, 45, {topic: {"0": 45}})
    assert got["files"] and all(p.startswith("s3://glue-maintain/warehouse/") for p in got["files"])
    assert got["audit_clean"], got["audit_errors"]
