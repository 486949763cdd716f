"""What only Apache Kafka shows, through the embedded broker (Kafka 4.x, KRaft), the write task code, the gate and the
committer: transactions (committed, aborted and still-open ones across partitions), compacted topics with
tombstones and cleaned segments, and records deleted by retention before they were ingested. Every test counts
rows, checks the committed offsets and ends with ``audit --deep`` where a batch committed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as KTP
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import ingest_inline, produce_to_partition, table_of, write_pipeline
from tidewater.audit.pipeline import audit
from tidewater.config.parse import load_pipeline
from tidewater.errors import OffsetGapError, TerminalError
from tidewater.ops.replay import run_replay
from tidewater.ops.status import status
from tidewater.plan.ingest import plan_batch
from tidewater.plan.replay import ReplayRequest
from tidewater.table.summary import DEAD_LETTERS, RECORDS, SKIPPED, committed_state
from tidewater_dev.sample_data import pizza_events

pytestmark = [pytest.mark.integration]


def _events(n: int, seed: int, tag: str) -> list[bytes]:
    """Pizza events whose order ids say which transaction (or batch) produced them."""
    out = []
    for i, raw in enumerate(pizza_events(n, seed=seed)):
        doc = json.loads(raw)
        doc["order_id"] = f"{tag}-{i}"
        out.append(json.dumps(doc).encode())
    return out


def _create(bootstrap: str, topic: str, partitions: int, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the future resolves
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})])[topic].result(30)


def _transactional(bootstrap: str, txn_id: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5})
    p.init_transactions(30)
    return p


def _in_transaction(p: Producer, topic: str, by_partition: dict[int, list[bytes]], outcome: str) -> None:
    """One transaction writing ``by_partition``, then ``outcome``: commit, abort, or open (left running)."""
    p.begin_transaction()
    for partition, values in by_partition.items():
        for v in values:
            p.produce(topic, v, partition=partition)
    p.flush(30)
    if outcome == "commit":
        p.commit_transaction(30)
    elif outcome == "abort":
        p.abort_transaction(30)


def _accounting(table) -> tuple[int, int, int]:
    """(records read, dead letters, skipped) summed over the table's Tidewater snapshots."""
    totals = [0, 0, 0]
    for snap in table.snapshots():
        props = snap.summary.additional_properties if snap.summary else {}
        for i, key in enumerate((RECORDS, DEAD_LETTERS, SKIPPED)):
            totals[i] += int(props.get(key, 0))
    return tuple(totals)


def _order_ids(table) -> list[str]:
    return sorted(table.scan(selected_fields=("order_id",)).to_arrow().column("order_id").to_pylist())


def test_read_committed_batches_hold_the_committed_records_and_an_open_transaction_holds_its_partition(broker, home, topic):
    """Two transactional producers interleave over two partitions: committed, aborted and committed transactions,
    then one left open on partition 1. Expected: the first batch holds exactly the committed records; partition 0
    ends at its high watermark (past its control markers), partition 1 waits at the open transaction's first offset
    (the last stable offset); once that transaction commits, the next batch takes its records and partition 1's
    offsets reach the end. Every record read is a row (nothing dead-lettered or skipped) and audit --deep is
    clean: the markers' and aborted records' offsets are gaps, not losses."""
    _create(broker.bootstrap, topic, 2)
    a, b = _transactional(broker.bootstrap, f"{topic}-a"), _transactional(broker.bootstrap, f"{topic}-b")
    _in_transaction(a, topic, {0: _events(5, 1, "a1"), 1: _events(4, 2, "a1p1")}, "commit")
    _in_transaction(b, topic, {0: _events(3, 3, "b1"), 1: _events(3, 4, "b1p1")}, "abort")
    _in_transaction(a, topic, {0: _events(2, 5, "a2")}, "commit")
    _in_transaction(b, topic, {1: _events(4, 6, "b2")}, "open")
    spec = load_pipeline(write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}))

    first = ingest_inline(spec)
    table = table_of(spec.source_path)
    committed_ids = [f"a1-{i}" for i in range(5)] + [f"a1p1-{i}" for i in range(4)] + ["a2-0", "a2-1"]
    assert _order_ids(table) == sorted(committed_ids) and first.records == 11
    # partition 0: a1 (0-4), its marker (5), b1 aborted (6-8), its marker (9), a2 (10-11), its marker (12)
    # partition 1: a1p1 (0-3), marker (4), b1p1 aborted (5-7), marker (8), b2 open from 9
    assert committed_state(table).offsets == {topic: {0: 13, 1: 9}}
    assert plan_batch(spec)[0].is_empty  # the open transaction holds partition 1
    st = status(spec)  # what `tidewater status` and the view say of it
    assert [(p["partition"], p["end"], p["lag"], p["held"]) for p in st["partitions"]] == [(0, 13, 0, 0), (1, 9, 0, 4)]
    assert len(st["waiting"]) == 1 and st["waiting"][0].startswith(
        f"{topic}[1]: 4 offsets after the last stable offset 9 wait for an open transaction"
    )

    b.commit_transaction(30)
    second = ingest_inline(spec)
    table = table_of(spec.source_path)
    assert second.records == 4 and len(_order_ids(table)) == 15
    assert [i for i in _order_ids(table) if i.startswith("b")] == [f"b2-{i}" for i in range(4)]
    assert committed_state(table).offsets == {topic: {0: 13, 1: 14}}  # b2 at 9-12, its marker at 13
    assert status(spec)["waiting"] == []
    assert _accounting(table) == (15, 0, 0)
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]

    # a replay over every offset, markers and aborted records included, puts back exactly the committed records
    before = sorted(
        table.scan(selected_fields=("_kafka_partition", "_kafka_offset", "order_id")).to_arrow().to_pylist(),
        key=lambda r: (r["_kafka_partition"], r["_kafka_offset"]),
    )
    for partition, end in ((0, 13), (1, 14)):
        replayed = run_replay(
            spec, ReplayRequest(topic=topic, partitions=(partition,), start_offset=0, end_offset=end), out=None, inline=True
        )
        assert replayed["status"] == "committed" and replayed["rows"] == (7 if partition == 0 else 8)
    table = table_of(spec.source_path)
    after = sorted(
        table.scan(selected_fields=("_kafka_partition", "_kafka_offset", "order_id")).to_arrow().to_pylist(),
        key=lambda r: (r["_kafka_partition"], r["_kafka_offset"]),
    )
    assert after == before and committed_state(table).offsets == {topic: {0: 13, 1: 14}}
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def _compacted(bootstrap: str, topic: str) -> dict[bytes, bytes | None]:
    """A compacted topic whose cleaner has run: keys 0-9 written three times over several segments, keys 0-2
    deleted by tombstones; returns the latest value per key (None: deleted). Waits for the cleaner (its check
    runs every 15 s) until fewer records than were produced remain."""
    _create(
        bootstrap,
        topic,
        1,
        {
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "600000",
            "min.compaction.lag.ms": "0",
        },
    )
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    latest: dict[bytes, bytes | None] = {}
    for rnd in range(3):
        for k, v in zip(range(10), _events(10, 10 + rnd, f"r{rnd}"), strict=True):
            p.produce(topic, v, key=str(k).encode())
            latest[str(k).encode()] = v
        p.flush(30)
        time.sleep(0.3)  # the next round rolls a new segment (segment.ms)
    for k in (b"0", b"1", b"2"):
        p.produce(topic, None, key=k)
        latest[k] = None
    p.flush(30)
    time.sleep(0.3)
    for k, v in zip((b"9",), _events(1, 20, "last"), strict=True):  # rolls the tombstones' segment, closing it
        p.produce(topic, v, key=k)
        latest[k] = v
    p.flush(30)
    produced = 34
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if len(_read_all(bootstrap, topic)) < produced:
            return latest
        time.sleep(2)
    pytest.fail(f"the log cleaner did not compact {topic} within 90 s")


def _read_all(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "compaction-check", "enable.partition.eof": True})
    c.assign([KTP(topic, 0, 0)])
    out = []
    try:
        while True:
            m = c.poll(5)
            if m is None or (m.error() and m.error().code() == m.error()._PARTITION_EOF):
                return out
            if not m.error():
                out.append((m.offset(), m.key(), m.value()))
    finally:
        c.close()


def test_a_compacted_topic_with_tombstones_lands_what_survived_and_the_audit_reads_its_gaps_as_compaction(broker, home, topic):
    """``cleanup.policy=compact``, values overwritten over several segments and three keys deleted by tombstones,
    the cleaner run before the first batch. Expected: every record still in the log is read once (values as rows,
    tombstones as dead letters of class Tombstone: a JSON pipeline needs an object), read = written + dead-lettered +
    skipped, the offsets reach the high watermark across the compacted gaps, and audit --deep reports the gaps as
    offsets absent from Kafka, not as a discrepancy."""
    _compacted(broker.bootstrap, topic)
    survivors = _read_all(broker.bootstrap, topic)
    values = [v for _, _, v in survivors if v is not None]
    tombstones = [o for o, _, v in survivors if v is None]
    end = survivors[-1][0] + 1
    spec = load_pipeline(write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}))

    result = ingest_inline(spec)
    table = table_of(spec.source_path)
    assert result.records == len(survivors) < 34
    assert _order_ids(table) == sorted(json.loads(v)["order_id"] for v in values)
    assert result.dead_letters == len(tombstones)
    assert _accounting(table) == (len(survivors), len(tombstones), 0)
    assert committed_state(table).offsets == {topic: {0: end}}
    offsets = sorted(table.scan(selected_fields=("_kafka_offset",)).to_arrow().column("_kafka_offset").to_pylist())
    assert offsets == sorted(o for o, _, v in survivors if v is not None) and offsets[-1] > len(offsets)  # gaps
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def test_records_deleted_unread_stop_the_batch_and_a_skip_records_the_known_loss(broker, home, topic):
    """Retention deletes records before they were ingested (the log start moved past the committed offset; here by
    DeleteRecords, what retention does to a segment). Expected: the plan is refused with a terminal error naming
    the partition, the committed offset, the log start and how many records were lost, and the command that steps
    past them; nothing is committed. That command (`tidewater skip` over the gap) commits the step with the loss in
    the table's history; the next batch reads from the log start, and audit --deep is clean with the skip explained
    as a known loss of 15 records."""
    from confluent_kafka import TopicPartition as DeleteAt

    from tidewater.runtime.cli import main

    produce_to_partition(broker.bootstrap, topic, 0, _events(10, 30, "kept"))
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    spec = load_pipeline(path)
    assert ingest_inline(spec).records == 10
    produce_to_partition(broker.bootstrap, topic, 0, _events(20, 31, "later"))
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_records([DeleteAt(topic, 0, 25)])[DeleteAt(topic, 0, 25)].result(30)
    before = table_of(path).current_snapshot().snapshot_id

    with pytest.raises(OffsetGapError) as refused:
        plan_batch(spec)
    assert isinstance(refused.value, TerminalError) and (refused.value.topic, refused.value.partition) == (topic, 0)
    message = str(refused.value)
    assert "committed offset 10 is below the log start offset 25" in message and "(15 records)" in message
    step = f"tidewater skip --topic {topic} --partition 0 --start-offset 10 --end-offset 25"
    assert step in message
    table = table_of(path)
    assert table.current_snapshot().snapshot_id == before and committed_state(table).offsets == {topic: {0: 10}}

    args = step.split()[1:] + ["--reason", "retention ran before the pipeline", "--by", "ops", "--pipeline", str(path)]
    assert main(args) == 0
    assert committed_state(table_of(path)).offsets == {topic: {0: 25}}
    assert ingest_inline(spec).records == 5
    table = table_of(path)
    assert committed_state(table).offsets == {topic: {0: 30}}
    assert _order_ids(table) == sorted([f"kept-{i}" for i in range(10)] + [f"later-{i}" for i in range(15, 20)])
    assert _accounting(table) == (15, 0, 0)  # the deleted offsets were never read
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]
    explained = [f.text() for f in report.findings if f.severity == "explained"]
    assert len(explained) == 1 and "15 records deleted by retention before they were ingested, a known loss" in explained[0]


def test_a_new_pipeline_starts_at_its_start_time_and_a_plan_without_records_loses_none(broker, home, topic):
    """``kafka.start_from`` a time: records stamped before it are not read, those at or after it are, per partition
    (ListOffsets by time on the broker). A plan made while no record is that new is empty and commits nothing; a
    record produced after it lands with the next batch (the start is a time, so every plan finds the same offsets:
    nothing between two plans is skipped). A plan made again after an abandoned one starts at the same offsets."""
    _create(broker.bootstrap, topic, 2)
    start = 1_780_000_000_000
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for partition in (0, 1):
        for i, v in enumerate(_events(6, 50 + partition, f"old{partition}")):
            p.produce(topic, v, partition=partition, timestamp=start - 60_000 + i)
    p.flush(30)
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap, "start_from": "2026-05-28T20:26:40Z"}
    )  # = start
    spec = load_pipeline(path)
    plan, staged = plan_batch(spec)
    assert plan.is_empty and staged is None
    assert table_of(path) is None

    for i, v in enumerate(_events(4, 60, "new0")):
        p.produce(topic, v, partition=0, timestamp=start + i)
    p.produce(topic, _events(1, 61, "new1")[0], partition=1, timestamp=start)
    p.flush(30)
    first, _ = plan_batch(spec)
    again, _ = plan_batch(spec)  # the first plan abandoned (its write never ran): planned again
    assert [(r.partition, r.start, r.end) for r in first.ranges] == [(0, 6, 10), (1, 6, 7)]
    assert [(r.partition, r.start, r.end) for r in again.ranges] == [(0, 6, 10), (1, 6, 7)]
    assert ingest_inline(spec).records == 5
    table = table_of(path)
    assert _order_ids(table) == sorted([f"new0-{i}" for i in range(4)] + ["new1-0"])
    assert committed_state(table).offsets == {topic: {0: 10, 1: 7}}
    p.produce(topic, _events(1, 62, "later")[0], partition=1, timestamp=start - 120_000)  # committed: read anyway
    p.flush(30)
    assert ingest_inline(spec).records == 1
    assert committed_state(table_of(path)).offsets == {topic: {0: 10, 1: 8}}
    report = audit(spec, deep=True)  # the offsets before the start time were never committed: not a hole
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


# A batch's plan and write (the Spark task code, inline), then it waits to be killed: a process that dies after
# its write, before its commit
PLAN_WRITE_THEN_HANG = """
import sys, time
from tidewater.batch import manifest_path, write_json_atomic
from tidewater.config.parse import load_pipeline
from tidewater.plan.ingest import plan_batch
from tidewater.source.kafka import kafka_settings
from tidewater.write.job import run_inline
spec = load_pipeline(sys.argv[1])
plan, path = plan_batch(spec)
write_json_atomic(manifest_path(path), run_inline(plan, spec, kafka_settings(spec)).to_json())
print(" ".join(f"{r.partition}:{r.start}-{r.end}" for r in plan.ranges), flush=True)
time.sleep(600)
"""


def test_a_latest_pipeline_pins_the_log_end_and_reads_everything_after_it_once_through_a_kill(broker, home, topic):
    """``kafka.start_from: latest`` on the real broker: records already in the topic are not read. The first plan
    finds nothing and pins each partition's log end in the staging area; records produced after it land with the
    next batch (without the pin, that plan's "log end" would have moved past them). That batch's process is SIGKILLed
    after its write, before its commit: nothing committed; the rerun plans from the pin again and commits every new
    record once. A partition the topic gains later is read from its log start. ``audit --deep`` is clean: the
    records before the pin were never committed, so they are no hole."""
    import os
    import signal

    from confluent_kafka.admin import NewPartitions

    from tidewater.plan.ingest import START_PIN

    _create(broker.bootstrap, topic, 2)
    for partition in (0, 1):
        produce_to_partition(broker.bootstrap, topic, partition, _events(3, 80 + partition, f"old{partition}"))
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap, "start_from": "latest"})
    spec = load_pipeline(path)
    plan, staged = plan_batch(spec)
    assert plan.is_empty and staged is None and table_of(path) is None
    pin = home / "staging" / spec.name / START_PIN
    assert json.loads(pin.read_text())["offsets"] == {topic: {"0": 3, "1": 3}}

    produce_to_partition(broker.bootstrap, topic, 0, _events(4, 82, "new0"))
    produce_to_partition(broker.bootstrap, topic, 1, _events(1, 83, "new1"))
    proc = subprocess.Popen(
        [sys.executable, "-c", PLAN_WRITE_THEN_HANG, str(path)],
        env={**os.environ, "TIDEWATER_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().split() == ["0:3-7", "1:3-4"]
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert table_of(path) is None or table_of(path).snapshots() == [], "nothing committed before the kill"

    produce_to_partition(broker.bootstrap, topic, 1, _events(2, 84, "later1"))
    assert ingest_inline(spec).records == 7
    table = table_of(path)
    assert _order_ids(table) == sorted([f"new0-{i}" for i in range(4)] + ["new1-0", "later1-0", "later1-1"])
    assert committed_state(table).offsets == {topic: {0: 7, 1: 6}}
    assert _accounting(table) == (7, 0, 0)

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    produce_to_partition(broker.bootstrap, topic, 2, _events(2, 85, "gained2"))
    assert ingest_inline(spec).records == 2
    table = table_of(path)
    assert committed_state(table).offsets == {topic: {0: 7, 1: 6, 2: 2}}
    assert table.scan().to_arrow().num_rows == 9 and len(set(_order_ids(table))) == 9
    assert json.loads(pin.read_text())["offsets"] == {topic: {"0": 3, "1": 3}}  # pinned once
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def test_a_topic_deleted_and_created_again_is_refused_naming_the_offsets(broker, home, topic):
    """The topic is deleted and created again under the same name with fewer records than were committed. Expected:
    the plan is refused (terminal) naming the partition, the committed offset and the new end offset; nothing is
    committed and the table's offsets stay."""
    produce_to_partition(broker.bootstrap, topic, 0, _events(8, 70, "first-life"))
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    spec = load_pipeline(path)
    assert ingest_inline(spec).records == 8
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 30
    while True:  # the deletion completes in the background
        try:
            _create(broker.bootstrap, topic, 1)
            break
        except KafkaException:  # TOPIC_ALREADY_EXISTS until it does
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    produce_to_partition(broker.bootstrap, topic, 0, _events(3, 71, "second-life"))
    before = table_of(path).current_snapshot().snapshot_id
    with pytest.raises(OffsetGapError, match=r"committed offset 8 is beyond the end offset 3: the topic was recreated") as refused:
        plan_batch(spec)
    assert isinstance(refused.value, TerminalError) and (refused.value.topic, refused.value.partition) == (topic, 0)
    table = table_of(path)
    assert table.current_snapshot().snapshot_id == before and committed_state(table).offsets == {topic: {0: 8}}


OPEN_A_TRANSACTION_THEN_HANG = """
import sys, time
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2], "transaction.timeout.ms": 5000})
p.init_transactions(30)
p.begin_transaction()
for i in range(5):
    p.produce(sys.argv[3], b'{"order_id": "never-%d", "store_id": 1}' % i, partition=0)
p.flush(30)
print("open", flush=True)
time.sleep(600)
"""


def test_a_producer_killed_inside_a_transaction_holds_its_partition_until_the_broker_aborts_it(broker, home, topic):
    """A transactional producer process (``transaction.timeout.ms`` 5 s) writes five records and is SIGKILLed inside
    the transaction. Expected: the status says the partition waits on an open transaction and no batch takes
    anything past it; once the broker aborts the transaction (its timeout, then its cleanup check, 10 s), the
    waiting note is gone, the next batch reads past the aborted records and the marker, no aborted record lands,
    and the offsets reach the end."""
    produce_to_partition(broker.bootstrap, topic, 0, _events(3, 90, "before"))
    proc = subprocess.Popen(
        [sys.executable, "-c", OPEN_A_TRANSACTION_THEN_HANG, broker.bootstrap, f"{topic}-dead", topic],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
    finally:
        proc.kill()
        proc.wait()
    spec = load_pipeline(write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}))
    assert ingest_inline(spec).records == 3
    st = status(spec)
    assert [p["held"] for p in st["partitions"]] == [5] and len(st["waiting"]) == 1
    assert committed_state(table_of(spec.source_path)).offsets == {topic: {0: 3}}

    deadline = time.monotonic() + 90
    while status(spec)["waiting"]:
        assert time.monotonic() < deadline, "the broker did not abort the dead producer's transaction in 90 s"
        time.sleep(1)
    plan, _ = plan_batch(spec)
    assert [(r.start, r.end) for r in plan.ranges] == [(3, 9)]  # five aborted records and the abort marker
    assert ingest_inline(spec).records == 0
    table = table_of(spec.source_path)
    assert _order_ids(table) == [f"before-{i}" for i in range(3)]
    assert committed_state(table).offsets == {topic: {0: 9}}
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]
