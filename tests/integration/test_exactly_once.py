"""Exactly-once with the real embedded broker, real Spark (spark-submit) and the real SQLite catalog.

Every test counts rows and checks the offsets stamped in the table's snapshots.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.conftest import produce_to_partition, table_of, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.errors import BatchWriteError, OffsetGapError
from tidewater.plan.ingest import plan_batch
from tidewater.steps.lifecycle import commit_step, run_once, validate_step
from tidewater.steps.write import run_write_step
from tidewater.table.summary import DAG_RUN_ID, OFFSETS, committed_state
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def unique_ids(table) -> int:
    ids = table.scan(selected_fields=("order_id",)).to_arrow().column("order_id")
    return len(pc.unique(ids))


def test_three_batches_with_new_data_between_land_every_record_once(broker, catalog, pipeline_file, topic):
    """Three batches, 300 new records before each: 900 rows, 3 snapshots, offsets 100/200/300 per partition."""
    for i in range(3):
        produce(broker.bootstrap, topic, pizza_events(300, seed=100 + i), partitions=3)
        result = run_once(pipeline_file)
        assert result["status"] == "committed"
        assert result["records"] == 300
    table = table_of(pipeline_file)
    assert table.scan().to_arrow().num_rows == 900
    assert unique_ids(table) == 900
    snaps = sorted(table.snapshots(), key=lambda s: s.sequence_number)
    assert len(snaps) == 3
    for n, snap in enumerate(snaps, start=1):
        offsets = json.loads(snap.summary.additional_properties[OFFSETS])
        assert offsets == {topic: {"0": 100 * n, "1": 100 * n, "2": 100 * n}}
    assert committed_state(table).offsets == {topic: {0: 300, 1: 300, 2: 300}}
    # caught up: the next run plans nothing and makes no snapshot
    assert run_once(pipeline_file)["status"] == "empty"
    assert len(table_of(pipeline_file).snapshots()) == 3


# The steps of `tidewater run` up to the write (plan, spark-submit), then it waits to be killed: a process
# that dies after the write and before the commit, deterministically (`tidewater run` itself now validates
# and commits within milliseconds of the manifest, too fast to be killed in between reliably).
WRITE_THEN_HANG = """
import sys, time
from tidewater.config.parse import load_pipeline
from tidewater.steps.lifecycle import plan_step
from tidewater.steps.write import run_write_step
spec = load_pipeline(sys.argv[1])
plan, path = plan_step(spec)
run_write_step(spec, path)
print("written", flush=True)
time.sleep(600)
"""


def test_killed_after_write_before_commit_then_rerun_commits_each_record_once(broker, catalog, pipeline_file, topic, home):
    """The process running a batch is SIGKILLed after its write step (manifest staged), before validation
    and commit. Expected: no snapshot and the offsets unmoved after the kill; the rerun plans the same
    offsets under a new batch id and commits all 600 records exactly once. The killed batch's files stay
    uncommitted."""
    produce(broker.bootstrap, topic, pizza_events(600, seed=7), partitions=3)
    env = {**os.environ, "TIDEWATER_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITE_THEN_HANG, str(pipeline_file)], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "written"
    proc.kill()
    proc.wait()
    manifests = list((home / "staging").glob("*/*/manifest.json"))
    assert len(manifests) == 1
    table = table_of(pipeline_file)
    assert table is not None and table.snapshots() == [], "nothing was committed before the kill"
    killed_batch = manifests[0].parent.name

    result = run_once(pipeline_file)
    assert result["status"] == "committed" and result["batch_id"] != killed_batch
    table = table_of(pipeline_file)
    assert table.scan().to_arrow().num_rows == 600
    assert unique_ids(table) == 600
    assert committed_state(table).offsets == {topic: {0: 200, 1: 200, 2: 200}}
    committed_files = {f.file_path for f in table.scan().plan_files() for f in [f.file]}
    assert not any(killed_batch in p for p in committed_files)


def test_commit_step_run_twice_for_one_batch_is_a_no_op(broker, catalog, pipeline_file, topic):
    """Retrying the commit after it succeeded (Airflow retry, a person re-running it): no duplicate rows."""
    produce(broker.bootstrap, topic, pizza_events(240, seed=3), partitions=2)
    spec = load_pipeline(pipeline_file)
    plan, path = plan_batch(spec)
    manifest = run_write_step(spec, path)
    validate_step(spec, plan, manifest)
    first = commit_step(spec, plan, manifest, dag_run_id="manual__1")
    second = commit_step(spec, plan, manifest, dag_run_id="manual__1")
    assert (first.status, second.status) == ("committed", "already-committed")
    assert second.snapshot_id == first.snapshot_id
    table = table_of(pipeline_file)
    assert table.scan().to_arrow().num_rows == 240
    assert len(table.snapshots()) == 1
    assert table.current_snapshot().summary.additional_properties[DAG_RUN_ID] == "manual__1"
    assert committed_state(table).offsets == {topic: {0: 120, 1: 120}}


def test_malformed_json_fails_the_batch_naming_topic_partition_offset(broker, home, topic):
    """dead_letter.policy fail, one truncated JSON value at partition 1 offset 25: the batch fails naming
    it; nothing is committed, the offsets do not move and no data file of the batch remains."""
    pipeline_file = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, dead_letter={"policy": "fail"})
    good = pizza_events(60, seed=5)
    produce_to_partition(broker.bootstrap, topic, 0, good[:30], partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, good[30:55] + [b'{"order_id": "x", "store_id": '] + good[55:])
    with pytest.raises(BatchWriteError) as e:
        run_once(pipeline_file)
    assert (e.value.topic, e.value.partition, e.value.offset) == (topic, 1, 25)
    assert f"topic={topic}, partition=1, offset=25" in str(e.value)
    table = table_of(pipeline_file)
    assert table is None or table.snapshots() == []
    if table is not None:
        data_dir = Path(table.location().removeprefix("file://")) / "data"
        assert list(data_dir.rglob("*.parquet")) == [], "the failed batch's files were removed"


def test_committed_offset_below_log_start_is_a_clear_error(broker, pipeline_file, topic, monkeypatch):
    """Retention deleted records that were never ingested: planning fails naming the partition and the gap.

    Stand-in: the embedded broker implements neither retention nor DeleteRecords, so only the log start
    offset that the broker reports is replaced (committed offsets come from the real table).
    """
    produce(broker.bootstrap, topic, pizza_events(40, seed=9), partitions=2)
    assert run_once(pipeline_file)["records"] == 40
    import tidewater.source.kafka as ks

    real = ks.watermarks

    def retention_moved_log_start(settings, partitions, timeout=15.0):
        wm = real(settings, partitions, timeout)
        return {tp: ((75, hi + 60) if tp == (topic, 1) else (lo, hi)) for tp, (lo, hi) in wm.items()}

    monkeypatch.setattr(ks, "watermarks", retention_moved_log_start)
    with pytest.raises(OffsetGapError) as e:
        plan_batch(load_pipeline(pipeline_file))
    msg = str(e.value)
    assert f"topic={topic}, partition=1" in msg
    assert "committed offset 20 is below the log start offset 75" in msg and "55 records" in msg
    assert committed_state(table_of(pipeline_file)).offsets == {topic: {0: 20, 1: 20}}


def test_unreachable_spark_connect_server_is_a_transient_error(broker, home, topic):
    """With `spark.connect_url` set the write step goes to that server; one that does not answer is a
    transient error naming the setting, within seconds (the client alone would retry for ten minutes),
    and a URL that is not `sc://` is a configuration error."""
    import socket

    from tidewater.errors import ConfigError, TransientError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, spark={"connect_url": f"sc://127.0.0.1:{port}"}
    )
    spec = load_pipeline(path)
    produce(broker.bootstrap, topic, pizza_events(5, seed=96), partitions=1)
    plan, plan_path = plan_batch(spec)
    with pytest.raises(TransientError, match=rf"spark.connect_url: the Spark Connect server 127.0.0.1:{port} is unreachable"):
        run_write_step(spec, plan_path)
    bad = load_pipeline(
        write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, spark={"connect_url": "http://127.0.0.1:15002"})
    )
    with pytest.raises(ConfigError, match="spark.connect_url: 'http://127.0.0.1:15002' is not a Spark Connect URL"):
        run_write_step(bad, plan_path)
    assert table_of(path) is None or table_of(path).current_snapshot() is None


EXECUTOR_ENV_SCRIPT = """
import json, os, sys
driver_home, executor_home = sys.argv[1], sys.argv[2]
os.environ["TIDEWATER_HOME"] = executor_home  # the Spark JVM and its Python workers start with this one
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2]").appName("tidewater-test-executor-env").getOrCreate()
os.environ["TIDEWATER_HOME"] = driver_home  # the driver's own environment from here on
from tidewater.batch import manifest_path, write_json_atomic
from tidewater.config.parse import load_pipeline
from tidewater.plan.ingest import plan_batch
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.source.kafka import kafka_settings
from tidewater.write.job import run
spec = load_pipeline(sys.argv[3])
plan, path = plan_batch(spec)
manifest = run(spark.sparkContext, plan, spec, kafka_settings(spec))
spark.stop()
write_json_atomic(manifest_path(path), manifest.to_json())
validate_step(spec, plan, manifest)
print(json.dumps({"status": commit_step(spec, plan, manifest).status,
                  "files": [f.file_path for f in manifest.data_files]}))
"""


def test_executors_get_the_catalog_and_locations_from_the_driver_not_their_environment(broker, home, topic, tmp_path):
    """The Spark workers run with another TIDEWATER_HOME than the driver (as on a cluster, where executors
    have their own environment): the tasks still write to the driver's catalog and warehouse (the embedded
    default catalog is resolved on the driver and shipped with the tasks). Rows, offsets and file locations
    are the driver's; nothing appears under the executors' home. A separate process, so that its Spark JVM
    starts with the executors' environment."""
    other = tmp_path / "executor-home"
    other.mkdir()
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    produce(broker.bootstrap, topic, pizza_events(120, seed=94), partitions=3)
    proc = subprocess.run(
        [sys.executable, "-c", EXECUTOR_ENV_SCRIPT, str(home), str(other), str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TIDEWATER_HOME": str(home)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] == "committed" and len(out["files"]) == 3
    assert all(f.startswith(f"file://{home}/warehouse/") for f in out["files"]), out["files"]
    assert list(other.iterdir()) == []  # no catalog, warehouse or staging of the executors' own
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 120
    assert committed_state(table).offsets == {topic: {0: 40, 1: 40, 2: 40}}


def test_a_first_batch_creates_its_table_once_before_the_spark_tasks(broker, home, topic, monkeypatch):
    """Six partitions, a table that does not exist yet, the write step through spark-submit: the plan step
    creates the table from the first records of each range (a schema probe that writes no file), so the six
    Spark tasks find it instead of racing to create it (one `00000-*.metadata.json` per racing task before).
    Rows and offsets exact; a field that only later records carry is reported by the tasks that meet it and
    added once by the write job's driver (tagged `driver`), before those tasks run again."""
    from tidewater.steps.lifecycle import plan_step
    from tidewater.write import task

    monkeypatch.setattr(task, "PROBE_RECORDS", 50)  # the probe reads the first 50 records of each partition
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    spec = load_pipeline(path)
    events = [json.loads(e) for e in pizza_events(600, seed=97)]
    for e in events[500:]:
        e["coupon"] = "LATE"  # past the probe's first records of each partition
    produce(broker.bootstrap, topic, [json.dumps(e).encode() for e in events], partitions=6)
    plan, plan_path = plan_step(spec)
    table = table_of(path)
    assert table is not None and table.current_snapshot() is None  # created by the plan step, empty
    assert "coupon" not in table.schema().column_names
    manifest = run_write_step(spec, plan_path, master="local[2]")
    marked = [k for k in table_of(path).properties if k.startswith("tidewater.provisional.")]
    assert marked == [f"tidewater.provisional.{plan.batch_id}.driver"], marked  # no Spark task changed the table
    validate_step(spec, plan, manifest)
    commit_step(spec, plan, manifest)
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 600 and "coupon" in table.schema().column_names
    assert committed_state(table).offsets == {topic: {p: 100 for p in range(6)}}
    location = table.metadata.location.removeprefix("file://")
    created = [p.name for p in (Path(location) / "metadata").glob("00000-*.metadata.json")]
    assert len(created) == 1, created


def test_schema_changes_the_tasks_find_are_made_once_by_the_driver_and_undone_with_an_abandoned_batch(broker, catalog, home, topic):
    """Tasks never change a table (issue 14): three partitions, two write tasks each (`records_per_task`),
    and in the second batch each partition's later records carry a different new field (text, a double,
    a nested object). The write step (inline: the task code and driver loop Spark runs) makes one schema
    change for the whole batch, tagged as the driver's (no task's tag), and runs the reporting tasks again.
    That batch's run dies before its commit: the next plan step removes the fields (no committed data
    holds them); the batch planned anew adds them again, once, and commits. Rows, the new fields'
    values and the offsets are exact."""
    import pyarrow as pa

    from tidewater.batch import manifest_path, write_json_atomic
    from tidewater.source.kafka import kafka_settings
    from tidewater.steps.lifecycle import plan_step
    from tidewater.table.provisional import PREFIX
    from tidewater.write.job import run_inline

    def stage() -> tuple:
        """The plan task (undo abandoned batches, probe a first batch, plan), then the write step."""
        plan, plan_path = plan_step(spec)
        manifest = run_inline(plan, spec, kafka_settings(spec))
        write_json_atomic(manifest_path(plan_path), manifest.to_json())
        return plan, manifest

    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        batch={"max_records": 100000, "chunk_records": 10, "records_per_task": 20},
    )
    spec = load_pipeline(path)
    produce(broker.bootstrap, topic, pizza_events(90, seed=31), partitions=3)  # 30 per partition
    plan, manifest = stage()
    validate_step(spec, plan, manifest)
    assert commit_step(spec, plan, manifest).records == 90
    schemas_before = len(table_of(path).schemas())

    events = [json.loads(e) for e in pizza_events(120, seed=32)]  # 40 per partition, round-robin
    for i, e in enumerate(events):
        late = i // 3 >= 25  # the partition's records from its 26th on: the second task of each partition
        if late and i % 3 == 0:
            e["coupon"] = f"C{i}"
        elif late and i % 3 == 1:
            e["tip"] = 1.5
        elif late:
            e["gift"] = {"wrapped": True}
    produce(broker.bootstrap, topic, [json.dumps(e).encode() for e in events], partitions=3)

    plan, manifest = stage()
    table = table_of(path)
    added = {"coupon", "tip", "gift"}
    assert added <= set(table.schema().column_names)
    assert len(table.schemas()) == schemas_before + 1  # one change for the batch
    markers = {k: v for k, v in table.properties.items() if k.startswith(PREFIX)}
    assert list(markers) == [f"{PREFIX}{plan.batch_id}.driver"], markers  # made by the driver, no task
    assert "schema_changed_1" in manifest.driver_timings and "schema_changed_2" not in manifest.driver_timings
    assert manifest.records == 120 and manifest.data_files

    # the run dies here (no commit): the next plan step undoes the batch's fields, then plans the range anew
    from tidewater.steps.lifecycle import revert_abandoned

    assert revert_abandoned(spec) == [plan.batch_id]
    table = table_of(path)
    assert not added & set(table.schema().column_names)
    assert not [k for k in table.properties if k.startswith(PREFIX)]
    plan, manifest = stage()
    assert len(table_of(path).schemas()) >= schemas_before + 2 and added <= set(table_of(path).schema().column_names)
    validate_step(spec, plan, manifest)
    commit_step(spec, plan, manifest)
    table = table_of(path)
    assert not [k for k in table.properties if k.startswith(PREFIX)]  # confirmed by the commit
    rows = table.scan().to_arrow()
    assert rows.num_rows == 210 and unique_ids(table) == 210
    assert committed_state(table).offsets == {topic: {0: 70, 1: 70, 2: 70}}
    got = rows.filter(pc.is_valid(rows.column("coupon"))).column("coupon").to_pylist()
    assert sorted(got) == sorted(e["coupon"] for e in events if "coupon" in e)
    assert pc.sum(rows.column("tip")).as_py() == 1.5 * sum("tip" in e for e in events)
    assert rows.filter(pc.is_valid(rows.column("gift"))).num_rows == sum("gift" in e for e in events)
    assert pa.types.is_struct(rows.schema.field("gift").type)


def test_a_routed_first_batch_creates_each_table_once_before_the_spark_tasks(broker, home, topic):
    """Dynamic routing by `type` over six partitions, through spark-submit: the plan step's probe creates every
    table the first records name, so each has one `00000-*.metadata.json` (the tasks found it), and rows and
    offsets are exact."""
    from tidewater.steps.lifecycle import plan_step
    from tidewater.table.catalog import load_catalog, load_table

    path = write_pipeline(
        home,
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        table="",
        routing={"namespace": "pay", "field": "type", "dynamic": True, "table_template": "{value}"},
        validation={},
    )
    spec = load_pipeline(path)
    events = [json.dumps({"id": i, "type": ("debit", "credit")[i % 2], "amount": i}).encode() for i in range(300)]
    produce(broker.bootstrap, topic, events, partitions=6)
    plan, plan_path = plan_step(spec)
    catalog = load_catalog(spec)
    for name in ("pay.debit", "pay.credit"):
        made = load_table(catalog, name)
        assert made is not None and made.current_snapshot() is None, name  # created by the plan step, empty
    manifest = run_write_step(spec, plan_path, master="local[2]")
    validate_step(spec, plan, manifest)
    commit_step(spec, plan, manifest)
    for name in ("pay.debit", "pay.credit"):
        table = load_table(catalog, name)
        assert table.scan().to_arrow().num_rows == 150
        created = list((Path(table.metadata.location.removeprefix("file://")) / "metadata").glob("00000-*.metadata.json"))
        assert len(created) == 1, (name, created)
    assert committed_state(load_table(catalog, spec.checkpoint_table())).offsets == {topic: {p: 50 for p in range(6)}}

    # A later batch names a table no batch named before (no probe then): the six tasks report it, the write
    # job's driver creates it once, tagged as the batch's, and runs them again.
    produce(broker.bootstrap, topic, [json.dumps({"id": 300 + i, "type": "refund", "amount": i}).encode() for i in range(60)], partitions=6)
    plan, plan_path = plan_step(spec)
    assert load_table(catalog, "pay.refund") is None
    manifest = run_write_step(spec, plan_path, master="local[2]")
    refund = load_table(catalog, "pay.refund")
    assert refund is not None and refund.properties.get("tidewater.created-by-batch") == plan.batch_id
    created = list((Path(refund.metadata.location.removeprefix("file://")) / "metadata").glob("00000-*.metadata.json"))
    assert len(created) == 1, created
    assert "schema_changed_1" in manifest.driver_timings
    validate_step(spec, plan, manifest)
    commit_step(spec, plan, manifest)
    refund = load_table(catalog, "pay.refund")
    assert sorted(refund.scan().to_arrow().column("id").to_pylist()) == list(range(300, 360))
    assert "tidewater.created-by-batch" not in refund.properties
    assert committed_state(load_table(catalog, spec.checkpoint_table())).offsets == {topic: {p: 60 for p in range(6)}}
