"""Maintenance on the real catalog and Spark (Iceberg procedures), with ingestion committing beside it.

Batches are staged in-process (``write.job.run_inline``, the task code Spark runs) and committed with the
real committer; maintenance runs Iceberg's Spark procedures through a local SparkSession.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.conftest import commit_as_airflow_would, ingest_inline, stage_inline, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.errors import TerminalError, TransientError
from tidewater.ops.maintenance import maintain, run_action
from tidewater.spark import session as spark_session
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import OFFSETS_TAG, committed_state
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAY = 24 * 3600


def _table(spec):
    return load_table(load_catalog(spec), spec.table.identifier)


def _content(table, snapshot_id=None) -> tuple[int, str]:
    """Row count and a checksum of the rows (order-independent)."""
    t = table.scan(snapshot_id=snapshot_id).to_arrow().select(["order_id", "store_id", "date_ordered"])
    rows = sorted(zip(*(c.to_pylist() for c in t.columns)))
    return len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()


@pytest.fixture
def spark_for(request):
    sessions = []

    def make(spec):
        s = spark_session.session(spec, app_name="tidewater-test-maintenance", master="local[2]")
        sessions.append(s)
        return s

    yield make
    for s in sessions:
        s.stop()


def _pipeline(home: Path, broker, topic: str, **maintenance):
    doc = {"rewrite_data_files": {"min_input_files": 2}, **maintenance}
    return load_pipeline(write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, maintenance=doc))


def test_compaction_reduces_files_and_keeps_rows_offsets_and_content(broker, home, topic, spark_for):
    """6 batches over 3 partitions make 18 small files; bin-pack compaction leaves 1 file with the same
    rows, checksum and committed offsets; the next batch commits on top of the compaction snapshot."""
    spec = _pipeline(home, broker, topic)
    for i in range(6):
        produce(broker.bootstrap, topic, pizza_events(60, seed=100 + i), partitions=3)
        assert ingest_inline(spec).records == 60
    table = _table(spec)
    before_rows, before_sum = _content(table)
    offsets = committed_state(table).offsets
    assert before_rows == 360 and offsets == {topic: {0: 120, 1: 120, 2: 120}}

    spark = spark_for(spec)
    dry = run_action(spark, spec, "rewrite_data_files", dry_run=True)
    assert dry.details["candidate_files"] == 18 and dry.after == dry.before
    [report] = maintain(spec, actions=["rewrite_data_files"], spark=spark)
    assert (report.before.data_files, report.after.data_files) == (18, 1)
    assert report.details["rewritten_data_files_count"] == 18 and report.details["added_data_files_count"] == 1
    assert report.after.records == 360

    table = _table(spec)
    assert table.current_snapshot().summary.operation.value == "replace"
    assert _content(table) == (before_rows, before_sum)
    state = committed_state(table)
    assert state.offsets == offsets and state.tidewater_snapshot_id != table.current_snapshot().snapshot_id

    produce(broker.bootstrap, topic, pizza_events(30, seed=200), partitions=3)
    assert ingest_inline(spec).records == 30
    table = _table(spec)
    assert _content(table)[0] == 390
    assert committed_state(table).offsets == {topic: {0: 130, 1: 130, 2: 130}}


def test_ingest_and_compaction_run_concurrently_exactly_once(broker, home, topic, spark_for):
    """An ingest thread commits 4 batches while the test thread compacts in a loop: every produced record
    is in the table exactly once, offsets are exact, and compactions landed between ingest commits. A
    compaction whose commit loses the race for the catalog fails transiently (as its Airflow task would,
    to be retried), never silently."""
    spec = _pipeline(home, broker, topic)
    produced: list[bytes] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def ingest_loop() -> None:
        try:
            for i in range(4):
                batch = pizza_events(40, seed=300 + i)
                produce(broker.bootstrap, topic, batch, partitions=2)
                produced.extend(batch)
                plan, manifest = stage_inline(spec)
                validate_step(spec, plan, manifest)
                commit_as_airflow_would(spec, plan, manifest)  # a commit that lost every attempt is retried
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
        finally:
            done.set()

    produce(broker.bootstrap, topic, pizza_events(40, seed=299), partitions=2)
    ingest_inline(spec)  # the table exists before compaction starts
    spark = spark_for(spec)
    worker = threading.Thread(target=ingest_loop)
    worker.start()
    rewrites = 0
    while not done.is_set():
        try:
            [r] = maintain(spec, actions=["rewrite_data_files"], spark=spark)
        except TransientError:  # a group's commit lost the race for the SQLite catalog: the task would retry
            continue
        rewrites += int(r.details.get("rewritten_data_files_count") or 0) > 0
    worker.join()
    assert not errors, errors
    [r] = maintain(spec, actions=["rewrite_data_files"], spark=spark)

    table = _table(spec)
    ids = table.scan().to_arrow().column("order_id")
    assert len(ids) == 40 * 5
    assert len(pc.unique(ids)) == 40 * 5
    assert committed_state(table).offsets == {topic: {0: 100, 1: 100}}
    ops = [s.summary.operation.value for s in table.snapshots()]
    assert ops.count("append") == 5
    # a compaction committed before the last ingest commit: the two really interleaved
    assert rewrites >= 1
    assert "append" in ops[ops.index("replace") + 1 :]


def test_expiry_keeps_offsets_readable_and_time_travel_to_retained_snapshots(broker, home, topic, spark_for):
    """older_than_hours=0, retain_last=1 after 4 batches and a compaction: the newest snapshot carrying
    offsets and the compaction after it are kept (the cutoff is moved back to it), older ones expire;
    offsets read the same, time travel to the kept batch snapshot returns every row. An expiry that
    removes the offsets' snapshot (another tool) makes planning fail loudly instead of re-reading."""
    spec = _pipeline(home, broker, topic, expire_snapshots={"older_than_hours": 0, "retain_last": 1})
    for i in range(4):
        produce(broker.bootstrap, topic, pizza_events(30, seed=400 + i), partitions=2)
        ingest_inline(spec)
    spark = spark_for(spec)
    maintain(spec, actions=["rewrite_data_files"], spark=spark)
    table = _table(spec)
    state = committed_state(table)
    old_ids = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != state.tidewater_snapshot_id][:-1]
    assert len(table.snapshots()) == 5 and len(old_ids) == 3

    dry = run_action(spark, spec, "expire_snapshots", dry_run=True)
    assert dry.details["snapshots_to_expire"] == 3 and dry.details["kept_for_offsets"] is True
    [report] = maintain(spec, actions=["expire_snapshots"], spark=spark)
    assert (report.before.snapshots, report.after.snapshots) == (5, 2)

    table = _table(spec)
    assert {s.snapshot_id for s in table.snapshots()} == {state.tidewater_snapshot_id, table.current_snapshot().snapshot_id}
    assert not {s.snapshot_id for s in table.snapshots()} & set(old_ids)
    after = committed_state(table)
    assert after.offsets == state.offsets == {topic: {0: 60, 1: 60}}
    assert _content(table, snapshot_id=state.tidewater_snapshot_id) == _content(table)
    n = spark.sql(
        f"SELECT count(*) AS n FROM {spec.catalog.name}.{spec.table.identifier} VERSION AS OF {state.tidewater_snapshot_id}"
    ).collect()[0]["n"]
    assert n == 120
    spark_session.release_catalog(spark, spec)  # Spark's JDBC catalog holds SQLite's read lock until closed

    # Another tool tries to expire the snapshot that carries the offsets: the tag keeps it (Iceberg never expires a
    # referenced snapshot). Only once the tag is removed too is the chain broken: planning refuses, naming the tag.
    assert table.metadata.refs[OFFSETS_TAG].snapshot_id == state.tidewater_snapshot_id
    with pytest.raises(ValueError, match="protected"):
        table.maintenance.expire_snapshots().by_id(state.tidewater_snapshot_id).commit()
    table.manage_snapshots().remove_tag(OFFSETS_TAG).commit()
    _table(spec).maintenance.expire_snapshots().by_id(state.tidewater_snapshot_id).commit()
    with pytest.raises(TerminalError, match=f"committed offsets are unreadable.*the tag {OFFSETS_TAG} .* is missing"):
        committed_state(_table(spec))


def _local(path: str | Path) -> str:
    return str(path).replace("file://", "").replace("file:", "")


def _age(path: str | Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(_local(path), (t, t))


def test_orphan_removal_deletes_abandoned_files_past_the_safe_age_only(broker, home, topic, spark_for):
    """One committed batch, one abandoned staged batch (5 days old), one batch staged now and not yet
    committed with one of its files made 5 days old (a long batch), and a young stray file. Orphan
    removal (72 h) deletes the abandoned batch's files and its staging directory only; the in-flight
    batch then commits and every row is there."""
    spec = _pipeline(home, broker, topic)
    produce(broker.bootstrap, topic, pizza_events(40, seed=500), partitions=2)
    ingest_inline(spec)
    committed_files = {f for f in _table(spec).inspect.files().column("file_path").to_pylist()}

    produce(broker.bootstrap, topic, pizza_events(40, seed=501), partitions=2)
    abandoned_plan, abandoned = stage_inline(spec)
    abandoned_paths = [f.file_path for f in abandoned.data_files]
    staging = spec.staging_dir() / spec.name / abandoned_plan.batch_id
    for p in [*abandoned_paths, *staging.iterdir(), staging]:
        _age(p, 5 * DAY)

    plan, manifest = stage_inline(spec)  # planned from the same offsets: the abandoned batch never committed
    in_flight = [f.file_path for f in manifest.data_files]
    _age(in_flight[0], 5 * DAY)
    stray = Path(_local(in_flight[0])).with_name("young-stray.parquet")
    stray.write_bytes(b"not yet referenced")

    spark = spark_for(spec)
    [dry] = maintain(spec, actions=["remove_orphan_files"], dry_run=True, spark=spark)
    assert {_local(p) for p in dry.details["files"]} == {_local(p) for p in abandoned_paths}
    assert all(Path(_local(p)).exists() for p in abandoned_paths)

    [report] = maintain(spec, actions=["remove_orphan_files"], spark=spark)
    assert report.details["orphan_files"] == len(abandoned_paths)
    assert report.details["kept_in_flight"] == 1
    assert report.details["staging_dirs_removed"] == 1
    assert not any(Path(_local(p)).exists() for p in abandoned_paths)
    assert all(Path(_local(p)).exists() for p in in_flight)
    assert stray.exists()
    assert all(Path(_local(p)).exists() for p in committed_files)
    assert not staging.exists()

    from tidewater.steps.lifecycle import validate_step

    validate_step(spec, plan, manifest)
    commit_step(spec, plan, manifest)
    table = _table(spec)
    assert _content(table)[0] == 80
    assert committed_state(table).offsets == {topic: {0: 40, 1: 40}}


def test_sorted_table_is_compacted_with_sort_and_the_cli_reports_a_dry_run(broker, home, topic, spark_for):
    """strategy auto on a table with a sort order rewrites with `sort`: one file whose store_id values are
    in order. `tidewater maintain --dry-run --json` reports candidates and changes nothing."""
    import json
    import subprocess
    import sys

    from pyiceberg.transforms import IdentityTransform

    spec = _pipeline(home, broker, topic)
    for i in range(3):
        produce(broker.bootstrap, topic, pizza_events(50, seed=600 + i), partitions=2)
        ingest_inline(spec)
    with _table(spec).update_sort_order() as order:
        order.asc("store_id", IdentityTransform())

    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "tidewater"),
            "maintain",
            "--pipeline",
            spec.source_path,
            "--actions",
            "rewrite_data_files,expire_snapshots",
            "--dry-run",
            "--json",
            "--master",
            "local[1]",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    reports = json.loads(out)
    assert [r["action"] for r in reports] == ["rewrite_data_files", "expire_snapshots"]
    assert reports[0]["details"]["strategy"] == "sort" and reports[0]["details"]["candidate_files"] == 6
    assert all(r["dry_run"] and r["before"] == r["after"] for r in reports)
    assert len(_table(spec).inspect.files()) == 6

    [report] = maintain(spec, actions=["rewrite_data_files"], spark=spark_for(spec))
    assert report.details["strategy"] == "sort" and report.after.data_files == 1
    stores = _table(spec).scan().to_arrow().column("store_id").to_pylist()
    assert stores == sorted(stores) and len(stores) == 150


def test_compaction_that_cannot_commit_fails_instead_of_reporting_success(broker, home, topic, spark_for):
    """Another process holds the SQLite catalog's write lock (reads still work) for the whole
    rewrite_data_files: with partial progress Iceberg logs each failed group commit and returns. The action
    must fail, transiently (Airflow retries it), not report "data files 6 -> 6" as a success; the table
    is unchanged and a run after the lock is gone compacts it."""
    import sqlite3

    from tidewater.errors import TransientError

    spec = _pipeline(home, broker, topic, rewrite_data_files={"min_input_files": 2, "partial_progress": True})
    for i in range(2):
        produce(broker.bootstrap, topic, pizza_events(30, seed=300 + i), partitions=3)
        ingest_inline(spec)
    before = _content(_table(spec))
    spark = spark_for(spec)
    holder = sqlite3.connect(str(home / "catalog.db"), isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # RESERVED: readers go on, every commit gets "database is locked"
    try:
        with pytest.raises(
            TransientError,
            match=r"rewrite_data_files: 6 data file\(s\) were not compacted because their "
            r"file groups failed to commit .* 0 file\(s\) were compacted",
        ):
            maintain(spec, actions=["rewrite_data_files"], spark=spark)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    table = _table(spec)
    assert len(table.inspect.files()) == 6 and _content(table) == before
    [report] = maintain(spec, actions=["rewrite_data_files"], spark=spark)
    assert (report.before.data_files, report.after.data_files) == (6, 1) and _content(_table(spec)) == before
