"""Concurrent and uncertain commits, against the real catalog and broker.

The write step runs in-process here (``write.job.run_inline``: the same per-range task code that
Spark runs) so that several batches can be staged quickly; the Spark path is covered in
test_exactly_once.py.
"""

from __future__ import annotations

import threading

import pytest

from tests.conftest import race, stage_inline, table_of
from tidewater.commit.batch import commit_batch
from tidewater.config.parse import load_pipeline
from tidewater.errors import OffsetsMovedError
from tidewater.table.catalog import load_catalog
from tidewater.table.summary import committed_state
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.integration]


def test_two_committers_of_one_batch_race_one_commits_the_other_finds_it(broker, pipeline_file, topic):
    """Two committers (separate catalog connections) commit the same staged batch at once.

    Expected: exactly one 'committed', the other 'already-committed'; 300 rows, one snapshot."""
    spec = load_pipeline(pipeline_file)
    produce(broker.bootstrap, topic, pizza_events(300, seed=11), partitions=3)
    plan, manifest = stage_inline(spec)
    results = race(
        lambda: commit_batch(load_catalog(spec), plan, manifest),
        lambda: commit_batch(load_catalog(spec), plan, manifest),
    )
    statuses = sorted(r.status for r in results)  # type: ignore[union-attr]
    assert statuses == ["already-committed", "committed"]
    table = table_of(pipeline_file)
    assert table.scan().to_arrow().num_rows == 300
    assert len(table.snapshots()) == 1
    assert committed_state(table).offsets == {topic: {0: 100, 1: 100, 2: 100}}


def test_two_batches_planned_from_the_same_offsets_race_one_wins_no_duplicates(broker, pipeline_file, topic):
    """Two independent runs planned the same offsets (two batch ids) and commit together, three rounds.

    Expected per round: one commits, the other is refused with OffsetsMovedError naming the moved
    partitions; rows always equal records produced, offsets exact."""
    spec = load_pipeline(pipeline_file)
    produced = 0
    for rnd in range(3):
        produce(broker.bootstrap, topic, pizza_events(150, seed=20 + rnd), partitions=3)
        produced += 150
        a, b = stage_inline(spec), stage_inline(spec)
        assert a[0].batch_id != b[0].batch_id and a[0].ranges == b[0].ranges
        results = race(
            lambda a=a: commit_batch(load_catalog(spec), *a),
            lambda b=b: commit_batch(load_catalog(spec), *b),
        )
        won = [r for r in results if not isinstance(r, Exception)]
        lost = [r for r in results if isinstance(r, Exception)]
        assert len(won) == 1 and won[0].status == "committed"  # type: ignore[union-attr]
        assert len(lost) == 1 and isinstance(lost[0], OffsetsMovedError)
        assert f"{topic}[0]" in str(lost[0])
        table = table_of(pipeline_file)
        assert table.scan().to_arrow().num_rows == produced
        assert committed_state(table).offsets == {topic: {p: produced // 3 for p in range(3)}}
    assert len(table_of(pipeline_file).snapshots()) == 3


def test_commit_landed_but_the_caller_saw_an_error(broker, pipeline_file, topic, monkeypatch):
    """The catalog applies the commit, then the connection fails before the answer arrives.

    Fault injection: the real SqlCatalog commit runs, then an error is raised in its place. Expected:
    the committer refreshes, finds its batch id and reports 'already-committed'; one snapshot, no duplicates."""
    from pyiceberg.catalog.sql import SqlCatalog

    spec = load_pipeline(pipeline_file)
    produce(broker.bootstrap, topic, pizza_events(90, seed=31), partitions=3)
    plan, manifest = stage_inline(spec)
    real_commit = SqlCatalog.commit_table
    calls = []

    def commit_then_lose_the_answer(self, table, requirements, updates):
        calls.append(1)
        real_commit(self, table, requirements, updates)
        if len(calls) == 1:
            raise ConnectionError("connection reset after the commit was applied")
        raise AssertionError("the committer must not commit twice")

    monkeypatch.setattr(SqlCatalog, "commit_table", commit_then_lose_the_answer)
    result = commit_batch(load_catalog(spec), plan, manifest)
    assert result.status == "already-committed"
    assert len(calls) == 1
    table = table_of(pipeline_file)
    assert table.scan().to_arrow().num_rows == 90
    assert len(table.snapshots()) == 1


def test_concurrent_first_writers_create_the_namespace_and_table_once(home):
    """Eight writers find the table missing at the same moment (as parallel Spark tasks of a first batch do).

    Expected: every writer gets the table, none fails on the catalog's unique constraints; the table
    has the union of the fields they saw."""
    import pyarrow as pa

    from tidewater.config.parse import parse_pipeline
    from tidewater.table.evolution import ensure_table

    spec = parse_pipeline({"name": "race", "topics": ["t"], "table": "fresh_ns.orders", "kafka": {"bootstrap_servers": "127.0.0.1:1"}})
    schemas = [pa.schema([("id", pa.int64()), (f"f{i % 2}", pa.string())]) for i in range(8)]
    results = race(*[lambda s=s: ensure_table(load_catalog(spec), spec.table, None, s.empty_table()) for s in schemas])
    errors = [r for r in results if isinstance(r, Exception)]
    assert errors == []
    table = load_catalog(spec).load_table("fresh_ns.orders")
    assert {f.name for f in table.schema().fields} == {"id", "f0", "f1"}


def test_catalog_locked_by_a_reader_during_commit_is_never_reported_as_committed(broker, pipeline_file, topic, home):
    """Another process holds a read transaction on the SQLite catalog (as Spark's JDBC catalog does)
    while the batch commits: every attempt gets "database is locked". The committer must not mistake its
    own rolled-back pointer update for a landed commit: it keeps retrying, and commits once the lock is
    released. Before the fix it returned "already-committed" and the batch was lost."""
    import sqlite3
    import time

    spec = load_pipeline(pipeline_file)
    produce(broker.bootstrap, topic, pizza_events(30, seed=81), partitions=3)
    plan, manifest = stage_inline(spec)
    holder = sqlite3.connect(str(home / "catalog.db"), isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN")
    holder.execute("SELECT count(*) FROM iceberg_tables").fetchall()  # SHARED lock until COMMIT
    release = threading.Timer(8, lambda: holder.execute("COMMIT"))
    release.start()
    started = time.monotonic()
    try:
        result = commit_batch(load_catalog(spec), plan, manifest)
    finally:
        release.join()
        holder.close()
    assert time.monotonic() - started >= 8  # it did wait for the lock instead of giving up or pretending
    assert result.status == "committed"
    table = table_of(pipeline_file)
    assert len(table.scan().to_arrow()) == 30
    assert committed_state(table).offsets == {topic: {0: 10, 1: 10, 2: 10}}
    assert committed_state(table).batch_id == plan.batch_id


def _lock_catalog(db: str, seconds: float) -> threading.Thread:
    """Another process's exclusive lock on the SQLite catalog, held for ``seconds`` (a thread with its
    own connection behaves like one for SQLite's file locks)."""
    import sqlite3
    import time

    ready = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        ready.set()
        time.sleep(seconds)
        conn.execute("ROLLBACK")
        conn.close()

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert ready.wait(10)
    return t


def test_catalog_locked_at_commit_time_is_transient_and_the_commit_lands_after(pipeline_file, broker, topic):
    """The SQLite catalog is exclusively locked by another process when the commit starts. Expected:
    loading the catalog or the table raises TransientError (worth retrying), never a terminal
    configuration error; the commit step retries and, once the lock is gone, commits the batch once
    with its offsets."""
    from tidewater.errors import ConfigError, TransientError
    from tidewater.steps.lifecycle import commit_step

    spec = load_pipeline(pipeline_file)
    produce(broker.bootstrap, topic, pizza_events(60, seed=7), partitions=3)
    plan, manifest = stage_inline(spec)
    db = spec.catalog_properties()["uri"][len("sqlite:///") :]

    import tidewater.table.catalog as catalogs

    catalogs._LOADED.clear()  # a process that has not loaded this catalog yet (the step's stage_inline did)
    holder = _lock_catalog(db, 13)  # longer than the catalog's two 5 s SQLite waits on first load
    with pytest.raises(TransientError) as e:
        load_catalog(spec)
    assert not isinstance(e.value, ConfigError) and "unreachable or busy" in str(e.value)
    holder.join()

    catalog = load_catalog(spec)
    holder = _lock_catalog(db, 4)
    result = commit_step(spec, plan, manifest)  # the primitive's attempts outlast the lock
    holder.join()
    assert result.status == "committed"
    table = table_of(pipeline_file)
    assert table.scan().to_arrow().num_rows == 60
    assert committed_state(table).offsets == plan.end_offsets()
    assert commit_batch(catalog, plan, manifest).status == "already-committed"


def test_catalog_locked_through_every_attempt_fails_transient_and_nothing_lands(pipeline_file, broker, topic):
    """The lock outlasts the commit's attempts. Expected: TransientError naming the table (the Airflow
    task would be retried), nothing committed, and a later retry commits the batch exactly once."""
    from tidewater.errors import TransientError

    spec = load_pipeline(pipeline_file)
    produce(broker.bootstrap, topic, pizza_events(30, seed=8), partitions=3)
    plan, manifest = stage_inline(spec)
    catalog = load_catalog(spec)
    db = spec.catalog_properties()["uri"][len("sqlite:///") :]
    holder = _lock_catalog(db, 14)
    with pytest.raises(TransientError) as e:
        commit_batch(catalog, plan, manifest, max_attempts=2)
    assert spec.table.identifier in str(e.value)
    holder.join()
    table = table_of(pipeline_file)
    assert table is None or table.current_snapshot() is None
    assert commit_batch(load_catalog(spec), plan, manifest).status == "committed"
    assert table_of(pipeline_file).scan().to_arrow().num_rows == 30
