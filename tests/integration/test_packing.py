"""Packing short partition ranges into one write task (``write/packing.py``), with the real embedded broker, real
Spark (spark-submit, local[2]) and the real SQLite catalog: fewer files, and the same rows, offsets, dead letters and
exactly-once as one task per partition. Every test counts rows and checks offsets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ingest_inline, produce_to_partition, table_of, write_pipeline
from tests.integration.test_exactly_once import WRITE_THEN_HANG
from tidewater.config.parse import load_pipeline
from tidewater.plan.ingest import plan_batch
from tidewater.steps.lifecycle import run_once
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import committed_state
from tidewater_dev.sample_data import pizza_events, produce

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 60
PER_PARTITION = 12
BAD = {7, 130, 611}  # indexes of undecodable records: round-robin puts index i at (i % 60, i // 60)


def many_partitions(broker, topic: str) -> list[tuple[int, int]]:
    """720 pizza events over 60 partitions (12 each), three of them undecodable; returns the bad ones' (partition,
    offset)."""
    values = pizza_events(PARTITIONS * PER_PARTITION, seed=42)
    for i in BAD:
        values[i] = b"{not json"
    produce(broker.bootstrap, topic, values, partitions=PARTITIONS)
    return sorted((i % PARTITIONS, i // PARTITIONS) for i in BAD)


def coordinates(table, *names: str) -> list[tuple]:
    t = table.scan(selected_fields=names).to_arrow()
    return sorted(zip(*(t.column(n).to_pylist() for n in names), strict=True))


def data_files(table) -> list[str]:
    return [task.file.file_path for task in table.scan().plan_files()]


def test_sixty_short_ranges_are_two_tasks_with_the_rows_offsets_and_dead_letters_of_sixty(broker, home, topic):
    """60 partitions of 12 records through spark-submit on local[2]: packed into 2 tasks, the batch commits 2 data
    files (one task per partition wrote 60 before). The same records written one task per partition (packing off,
    inline) give the same rows by (partition, offset), the same dead letters with their coordinates, and the same
    offsets: 717 rows, 3 dead letters, 12 per partition."""
    bad = many_partitions(broker, topic)
    kafka = {"bootstrap_servers": broker.bootstrap}
    packed = write_pipeline(home, name="packed", topics=[topic], kafka=kafka, table={"identifier": "rpc.packed"})
    result = run_once(packed)
    assert result["status"] == "committed" and result["records"] == 720
    apart = load_pipeline(
        write_pipeline(home, name="apart", topics=[topic], kafka=kafka, table={"identifier": "rpc.apart"}, batch={"pack_ranges": False})
    )
    assert ingest_inline(apart).status == "committed"

    catalog = load_catalog(load_pipeline(packed))
    tables = {name: load_table(catalog, f"rpc.{name}") for name in ("packed", "apart")}
    assert len(data_files(tables["packed"])) == 2
    assert len(data_files(tables["apart"])) == PARTITIONS
    rows = {name: coordinates(t, "_kafka_partition", "_kafka_offset") for name, t in tables.items()}
    assert len(rows["packed"]) == PARTITIONS * PER_PARTITION - len(BAD)
    assert rows["packed"] == rows["apart"]
    assert not set(bad) & set(rows["packed"])
    for name in tables:
        letters = load_table(catalog, f"rpc.{name}_dead_letters")
        assert [(p, o) for _, p, o in coordinates(letters, "topic", "partition", "offset")] == bad, name
        assert committed_state(tables[name]).offsets == {topic: dict.fromkeys(range(PARTITIONS), PER_PARTITION)}


def test_a_packed_batch_killed_after_its_write_then_rerun_lands_each_record_once(broker, home, topic):
    """A batch of 60 short ranges (2 packed tasks) is SIGKILLed after its write step, before validation and commit.
    Expected: nothing committed; the rerun commits every good record once (717 rows, distinct offsets), the offsets
    end at 12 per partition, none of the killed batch's files is committed, and a third run is empty."""
    many_partitions(broker, topic)
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    env = {**os.environ, "TIDEWATER_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITE_THEN_HANG, str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "written"
    proc.kill()
    proc.wait()
    killed = [m.parent.name for m in (home / "staging").glob("*/*/manifest.json")]
    assert len(killed) == 1 and table_of(path).snapshots() == []

    result = run_once(path)
    assert result["status"] == "committed" and result["batch_id"] != killed[0]
    table = table_of(path)
    rows = coordinates(table, "_kafka_partition", "_kafka_offset")
    assert len(rows) == len(set(rows)) == PARTITIONS * PER_PARTITION - len(BAD)
    assert committed_state(table).offsets == {topic: dict.fromkeys(range(PARTITIONS), PER_PARTITION)}
    assert not any(killed[0] in f for f in data_files(table))
    assert run_once(path)["status"] == "empty"


def test_partitions_a_topic_gains_are_read_from_their_log_start_by_the_next_plan(broker, home, topic):
    """A topic grows from 3 to 6 partitions between two batches (a real CreatePartitions on the broker). Expected:
    the first batch commits partitions 0-2; the next plan reads partitions 3-5 from their log start and 0-2 from their
    committed offsets, and the table ends with every record once."""
    from confluent_kafka.admin import AdminClient, NewPartitions

    produce(broker.bootstrap, topic, pizza_events(30, seed=5), partitions=3)
    spec = load_pipeline(write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}))
    assert ingest_inline(spec).records == 30
    assert committed_state(table_of(spec.source_path)).offsets == {topic: {0: 10, 1: 10, 2: 10}}

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_partitions([NewPartitions(topic, 6)])[topic].result(timeout=30)  # the topic grows
    produce(broker.bootstrap, topic, pizza_events(6, seed=6), partitions=6, create=False)  # one a partition
    for partition in (3, 4, 5):  # nine more each: the new partitions hold 10 records, offsets 0-9
        produce_to_partition(broker.bootstrap, topic, partition, pizza_events(9, seed=7 + partition))
    plan, _ = plan_batch(spec)
    assert [(r.partition, r.start, r.end) for r in plan.ranges] == [
        (0, 10, 11),
        (1, 10, 11),
        (2, 10, 11),
        (3, 0, 10),
        (4, 0, 10),
        (5, 0, 10),
    ]
    assert ingest_inline(spec).records == 33
    table = table_of(spec.source_path)
    rows = coordinates(table, "_kafka_partition", "_kafka_offset")
    assert len(rows) == len(set(rows)) == 63
    assert committed_state(table).offsets == {topic: {0: 11, 1: 11, 2: 11, 3: 10, 4: 10, 5: 10}}
