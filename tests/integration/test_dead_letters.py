"""Bad input never fails silently and never loses a record: the corpus below goes through the real
broker, Spark (spark-submit) and catalog; every record ends as a row or a dead letter (or a counted
skip), and records read = rows + dead letters + skipped in every test."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ingest_inline, produce_to_partition, stage_inline, table_of, write_pipeline
from tidewater.commit.batch import commit_batch
from tidewater.config.parse import load_pipeline
from tidewater.errors import TransientError
from tidewater.ops.status import status
from tidewater.steps.lifecycle import commit_step, run_once, validate_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import DEAD_LETTERS, RECORDS, SKIPPED, committed_state
from tidewater_dev.sample_data import pizza_events

pytestmark = [pytest.mark.integration]


def _deep(depth: int) -> dict:
    d: dict = {"leaf": 1}
    for _ in range(depth):
        d = {"n": d}
    return d


# (value, expected outcome): a class name for a dead letter, "row" for a record that lands
CORPUS: list[tuple[bytes | None, str]] = [
    (b'{"order_id": "trunc", "store_id": ', "InvalidJson"),
    (b'{"order_id": "wrong-type", "store_id": "seven"}', "TypeMismatch"),
    (b'\xff\xfe{"order_id": "latin", "store_id": 3}', "InvalidUtf8"),
    (b"", "EmptyValue"),
    (b"   ", "EmptyValue"),
    (None, "Tombstone"),
    (b"[1, 2, 3]", "TypeMismatch"),
    (b'"just a string"', "TypeMismatch"),
    (b"not json at all", "InvalidJson"),
    (json.dumps({"order_id": "big", "store_id": 5, "note": "x" * 5_000_000}).encode(), "row"),
    (json.dumps({"order_id": "deep", "store_id": 6, "nested": _deep(40)}).encode(), "row"),
]


@pytest.mark.slow
def test_bad_input_corpus_lands_in_rows_and_dead_letters_through_spark(broker, home, topic):
    """30 good records, then the corpus, then 30 good records, on one partition, through `tidewater run`
    (spark-submit): every bad record is a dead letter with its raw bytes, offset and error class; the
    5 MB value and the 40-deep object land as rows; offsets move past all of them; status counts them."""
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, validation={"not_null": ["order_id"]})
    good = pizza_events(60, seed=61)
    values = good[:30] + [v for v, _ in CORPUS] + good[30:]
    produce_to_partition(broker.bootstrap, topic, 0, values, producer_settings={"message.max.bytes": 10_000_000})
    result = run_once(path)
    bad = {30 + i: kind for i, (_, kind) in enumerate(CORPUS) if kind != "row"}
    assert result["records"] == len(values)

    spec = load_pipeline(path)
    table = table_of(path)
    rows = table.scan().to_arrow()
    assert rows.num_rows == len(values) - len(bad)
    assert {"big", "deep"} <= set(rows.column("order_id").to_pylist())
    props = table.current_snapshot().summary.additional_properties
    assert (int(props[RECORDS]), int(props[DEAD_LETTERS]), int(props[SKIPPED])) == (len(values), len(bad), 0)
    assert committed_state(table).offsets == {topic: {0: len(values)}}

    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().sort_by("offset")
    assert dlq.column("offset").to_pylist() == sorted(bad)
    assert dlq.column("error_class").to_pylist() == [bad[o] for o in sorted(bad)]
    assert dlq.column("value").to_pylist() == [values[o] for o in sorted(bad)]
    assert set(dlq.column("topic").to_pylist()) == {topic} and set(dlq.column("partition").to_pylist()) == {0}
    assert set(dlq.column("batch_id").to_pylist()) == {result["batch_id"]}
    assert all(m for m in dlq.column("error_message").to_pylist())
    assert rows.num_rows + dlq.num_rows == len(values)

    st = status(spec)
    assert (st["dead_letters"], st["last_batch_dead_letters"], st["total_lag"]) == (len(bad), len(bad), 0)


def test_skip_policy_counts_and_writes_no_dead_letters(broker, home, topic):
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, dead_letter={"policy": "skip"})
    spec = load_pipeline(path)
    good = pizza_events(20, seed=62)
    produce_to_partition(broker.bootstrap, topic, 0, good[:10] + [b"{broken", None] + good[10:])
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    commit_step(spec, plan, manifest)
    table = table_of(path)
    props = table.current_snapshot().summary.additional_properties
    assert (int(props[RECORDS]), int(props[DEAD_LETTERS]), int(props[SKIPPED])) == (22, 0, 2)
    assert table.scan().to_arrow().num_rows == 20
    assert load_table(load_catalog(spec), spec.dead_letter_table()) is None
    assert committed_state(table).offsets == {topic: {0: 22}}


def test_first_batch_entirely_bad_still_moves_the_offsets(broker, home, topic):
    """No good record to create the table from: the table is created without columns so the offsets
    move; the dead letters are committed; the next good batch adds the columns."""
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    spec = load_pipeline(path)
    produce_to_partition(broker.bootstrap, topic, 0, [b"nope", b"{", None])
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    assert commit_step(spec, plan, manifest).dead_letters == 3
    assert committed_state(table_of(path)).offsets == {topic: {0: 3}}
    assert load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().num_rows == 3

    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(5, seed=63))
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    commit_step(spec, plan, manifest)
    table = table_of(path)
    assert table.scan().to_arrow().num_rows == 5 and "order_id" in table.schema().column_names
    assert committed_state(table).offsets == {topic: {0: 8}}


def test_failure_between_the_batch_commit_and_the_dead_letter_commit_is_repaired_by_a_retry(broker, home, topic, monkeypatch):
    """The batch commits, then the dead-letter commit fails (fault injected): the commit step raises a
    transient error; retrying it finds the batch committed and commits the dead letters exactly once."""
    import tidewater.commit.holders as committing

    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    spec = load_pipeline(path)
    good = pizza_events(10, seed=64)
    produce_to_partition(broker.bootstrap, topic, 0, good[:5] + [b"{bad", b"[]"] + good[5:])
    plan, manifest = stage_inline(spec)
    real = committing.commit_dead_letters
    calls = []

    def fail_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise TransientError("catalog unreachable (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(committing, "commit_dead_letters", fail_once)
    with pytest.raises(TransientError):
        commit_batch(load_catalog(spec), plan, manifest)
    assert committed_state(table_of(path)).offsets == {topic: {0: 12}}
    assert load_table(load_catalog(spec), spec.dead_letter_table()).current_snapshot() is None
    for _ in range(2):  # the retry, and one more: still exactly once
        assert commit_batch(load_catalog(spec), plan, manifest).status == "already-committed"
    dlq = load_table(load_catalog(spec), spec.dead_letter_table())
    assert dlq.scan().to_arrow().num_rows == 2 and len(dlq.snapshots()) == 1
    assert table_of(path).scan().to_arrow().num_rows == 10


def test_a_task_whose_working_directory_was_removed_still_writes_its_dead_letters(broker, home, topic, tmp_path, monkeypatch):
    """A Spark Connect server reuses Python workers across sessions and removes a closed session's directory, where
    a worker may still sit (seen once in a full test run). Here a write task (the code Spark runs) starts in a
    working directory that is gone, with bad records that make it create the dead-letter table. Expected: the task
    reports no error, its 8 records are 6 rows and 2 dead letters in its files (before the fix: a bare ENOENT from
    pyiceberg's configuration lookup, reported as an unreachable catalog)."""
    from tidewater.plan.ingest import plan_batch
    from tidewater.source.kafka import kafka_settings
    from tidewater.write.task import write_ranges

    spec = load_pipeline(write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})).for_executors()
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(3, seed=6))
    ingest_inline(spec)  # the table exists (tasks never create it); the dead-letter table does not yet
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(5, seed=7) + [b"{bad", b"\xff"] + pizza_events(1, seed=8))
    plan, _ = plan_batch(spec)
    gone = tmp_path / "removed"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    result = write_ranges(spec, kafka_settings(spec), plan.batch_id, 0, (plan.ranges[0],))
    assert "error" not in result, result.get("error")
    assert [(st["records"], st["dead_letters"]) for st in result["stats"]] == [(8, 2)]
    assert sum(f["record_count"] for f in result["files"]) == 6 and result["dead_letter_files"]
