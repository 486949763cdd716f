"""`tidewater audit` and the ledger it reads, against the real broker and catalog (batches written in this
process with the task code Spark runs, `write.job.run_inline`; maintenance through Spark)."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import ingest_changes, ingest_inline, produce_to_partition, stage_inline, table_of, write_pipeline
from tidewater.audit import ledger
from tidewater.config.parse import load_pipeline
from tidewater.runtime.cli import main
from tidewater.table.catalog import load_catalog
from tidewater.table.summary import BATCH_ID, OFFSETS, RANGES, RECORDS, committed_state
from tidewater_dev.sample_data import pizza_events

pytestmark = [pytest.mark.integration]


def _audit(path, capsys) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["audit", "--pipeline", str(path), "--json"])
    return code, json.loads(capsys.readouterr().out)


def _setup(broker, home, topic):
    """Two batches of 30 and 20 records on one partition, then an operator skip of [55, 57) (which ingests
    [50, 55) first) and a batch of the rest: 60 records read, 58 rows, 2 dead letters."""
    from tidewater.ops.skip import SkipRequest, skip

    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    spec = load_pipeline(path)
    events = pizza_events(60, seed=190)
    produce_to_partition(broker.bootstrap, topic, 0, events[:30])
    ingest_inline(spec)
    produce_to_partition(broker.bootstrap, topic, 0, events[30:50])
    ingest_inline(spec)
    produce_to_partition(broker.bootstrap, topic, 0, events[50:])
    done = skip(spec, SkipRequest(topic=topic, partition=0, start_offset=55, end_offset=57, reason="bad deploy", by="alice"))
    assert done["status"] == "committed"
    ingest_inline(spec)
    return spec, path


def test_a_clean_table_audits_clean_and_an_operator_skip_is_explained(broker, home, topic, capsys):
    """Ranges contiguous from offset 0 to 60 over five batches (the skip's two), every batch's counts add up, the
    committed offset is the log end: exit 0. The skip is reported as explained, naming who and why; the text
    output says "clean"."""
    spec, path = _setup(broker, home, topic)
    code, doc = _audit(path, capsys)
    assert code == 0 and doc["clean"], doc
    assert doc["batches"] == 5
    assert doc["partitions"] == [{"topic": topic, "partition": 0, "committed": 60, "log_start": 0, "log_end": 60, "lag": 0}]
    explained = [f for f in doc["findings"] if f["severity"] == "explained"]
    assert [(f["start"], f["end"]) for f in explained] == [(55, 57)] and "alice: bad deploy" in explained[0]["message"]
    assert not [f for f in doc["findings"] if f["severity"] == "error"]
    ranges = sorted((r["start_offset"], r["end_offset"]) for r in ledger.read(load_catalog(spec), spec).to_pylist())
    assert ranges == [(0, 30), (30, 50), (50, 55), (55, 57), (57, 60)]
    assert main(["audit", "--pipeline", str(path)]) == 0 and capsys.readouterr().out.strip().endswith("clean")


def test_an_audit_checks_the_batches_since_the_last_clean_one_and_full_checks_all(broker, home, topic, capsys):
    """Clean over five batches, then a sixth: the next audit checks that one only, from where the checked ranges
    ended (60). Two hand-made commits (summaries edited to look like batches): [65, 68), offsets committed twice below
    the checked end 70, and [75, 78), a hole from 70. Each audit after names both at their offsets, however often it
    runs: an audit with errors keeps the last clean audit's mark. `--full` checks all eight batches."""
    spec, path = _setup(broker, home, topic)
    code, doc = _audit(path, capsys)
    assert code == 0 and doc["batches"] == 5 and doc["since"] is None, doc
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(10, seed=192))
    ingest_inline(spec)
    code, doc = _audit(path, capsys)
    assert code == 0 and doc["batches"] == 1 and doc["since"], doc
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(10, seed=193))
    for batch, rng in (("twice", [65, 68]), ("after-a-hole", [75, 78])):
        rows = table_of(path).scan(limit=3).to_arrow()
        table_of(path).append(
            rows,
            snapshot_properties={
                BATCH_ID: batch,
                RANGES: json.dumps([[topic, 0, *rng]]),
                OFFSETS: json.dumps({topic: {"0": rng[1]}}),
                RECORDS: "3",
            },
        )
    for _ in range(2):
        code, doc = _audit(path, capsys)
        assert code == 1 and doc["batches"] == 2 and doc["since"], doc
        errors = {
            (f["start"], f["end"], f["batch_id"]): f["message"]
            for f in doc["findings"]
            if f["check"] == "coverage" and f["severity"] == "error"
        }
        assert errors == {
            (65, 68, "twice"): "offsets committed twice: below 70, where the batches the last clean audit checked end",
            (70, 75, "after-a-hole"): "offsets never committed: between the batches the last clean audit checked and this one",
        }, errors
    capsys.readouterr()
    assert main(["audit", "--pipeline", str(path), "--full", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["batches"] == 8 and doc["since"] is None
    assert {(f["start"], f["end"]) for f in doc["findings"] if f["check"] == "coverage" and f["severity"] == "error"} == {
        (65, 68),
        (70, 75),
    }


def test_rows_written_outside_tidewater_and_a_hole_in_the_committed_ranges_are_named(broker, home, topic, capsys):
    """A duplicate of 5 committed rows appended with pyiceberg by the test, and a hand-made commit whose ranges
    start past the committed offset (a summary edited to look like a batch): exit 1, the outside append named by
    its snapshot and row count, the hole by topic, partition, offsets and the batch at fault."""
    spec, path = _setup(broker, home, topic)
    table = table_of(path)
    table.append(table.scan(limit=5).to_arrow())
    outside = table_of(path).current_snapshot().snapshot_id
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(10, seed=191))
    rows = table_of(path).scan(limit=3).to_arrow()
    table_of(path).append(
        rows,
        snapshot_properties={
            BATCH_ID: "hand-made",
            RANGES: json.dumps([[topic, 0, 65, 68]]),
            OFFSETS: json.dumps({topic: {"0": 68}}),
            RECORDS: "3",
        },
    )
    code, doc = _audit(path, capsys)
    assert code == 1 and not doc["clean"]
    errors = {
        (f["check"], f.get("start"), f.get("end"), f.get("batch_id"), f.get("snapshot_id")): f["message"]
        for f in doc["findings"]
        if f["severity"] == "error"
    }
    assert ("outside-write", None, None, None, outside) in errors
    assert "5 rows added" in errors[("outside-write", None, None, None, outside)]
    hole = [k for k in errors if k[0] == "coverage"]
    assert [(k[1], k[2], k[3]) for k in hole] == [(60, 65, "hand-made")]


def test_a_recreated_topic_leaves_committed_offsets_beyond_its_log_end(broker, home, topic, capsys):
    """The topic is deleted and created again with fewer records: the committed offset 60 is past the new log end
    (3), an error naming the partition and range. Records deleted by retention before they were read are the
    same check against the log start; the embedded broker cannot delete records (DeleteRecords fails, and
    retention is not applied: STACK.md), so that case is covered by tests/unit/test_audit.py."""
    from confluent_kafka.admin import AdminClient

    _, path = _setup(broker, home, topic)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept: its futures die with it
    admin.delete_topics([topic], operation_timeout=30)[topic].result()
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(3, seed=192))
    code, doc = _audit(path, capsys)
    assert code == 1
    kafka = [f for f in doc["findings"] if f["check"] == "kafka"]
    assert [(f["partition"], f["start"], f["end"]) for f in kafka] == [(0, 3, 60)] and "recreated" in kafka[0]["message"]


def test_the_ledger_outlives_expired_snapshots_and_catches_up_after_a_failed_entry(broker, home, topic, capsys, monkeypatch):
    """The ledger entry of every batch fails after its commit (as if killed between the two commits): the batches
    are committed, their entries missing. Compaction and snapshot expiry (`tidewater maintain`, Spark, every
    snapshot but those expiry keeps) follow; expiry records the entries first, so afterwards the table has one
    file and two snapshots and the audit still sees five batches, clean, the deep audit too (every offset is a row of the
    compacted file or a dead letter); `tidewater sql` reads the ledger as a table."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    real = ledger.sync
    monkeypatch.setattr(ledger, "sync", lambda *a, **k: (_ for _ in ()).throw(OSError("killed")))
    spec, path = _setup(broker, home, topic)
    monkeypatch.setattr(ledger, "sync", real)
    assert ledger.read(load_catalog(spec), spec).num_rows == 0, "every entry failed: the commits landed without them"
    spec = load_pipeline(
        write_pipeline(
            home,
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            maintenance={"expire_snapshots": {"older_than_hours": 0, "retain_last": 1}, "rewrite_data_files": {"min_input_files": 2}},
        )
    )
    files = len(table_of(path).inspect.files())
    tidewater = str(Path(sys.executable).parent / "tidewater")
    env = {**os.environ, "TIDEWATER_HOME": str(home)}
    done = subprocess.run(
        [tidewater, "maintain", "--pipeline", str(path), "--actions", "rewrite_data_files,expire_snapshots"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(table_of(path).inspect.files()) == 1 < files, "compacted"
    assert len(table_of(path).snapshots()) == 2  # the compaction's, and the newest batch's (it holds the offsets)
    assert len(load_catalog(spec).load_table(ledger.identifier(spec)).snapshots()) == 1, "the ledger's history expired"
    sql = subprocess.run(
        [
            tidewater,
            "sql",
            "--pipeline",
            str(path),
            f"SELECT count(DISTINCT batch_id) AS batches FROM {spec.catalog.name}.{ledger.identifier(spec)}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert sql.returncode == 0 and "5" in sql.stdout.split("batches", 1)[-1], sql.stdout + sql.stderr[-2000:]
    code, doc = _audit(path, capsys)
    assert code == 0 and doc["batches"] == 5, doc
    code, doc = _audit_deep(path, capsys)
    assert code == 0 and doc["clean"], doc


def _transactional(bootstrap: str, topic: str, values: list[bytes], abort: bool = False) -> None:
    """Each value in a transaction of its own, committed (or aborted): Kafka puts a marker at an offset after each."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx"})
    p.init_transactions(30)
    for v in values:
        p.begin_transaction()
        p.produce(topic, v, partition=0)
        if abort:
            p.flush(30)
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)


def test_the_deep_audit_accounts_for_every_offset_and_names_duplicates_and_lost_rows(broker, home, topic, capsys):
    """Metadata columns on. A record (offset 0), two records in transactions of their own (1 and 3; their commit
    markers take 2 and 4), then a good, an undecodable and a good record (5, 6, 7): 5 rows and a dead letter.
    The deep audit is clean: every offset is a row or a dead letter, and Kafka holds no record at the marker offsets
    (reported as such); its progress goes to stderr, its document alone to stdout. Then the test appends a copy of
    the rows of offsets 0 and 1 and deletes the row of offset 3 with pyiceberg: the deep audit names offsets [0, 2)
    as in the table twice and offset 3 as a record in Kafka with
    neither a row nor a dead letter, and exits 1."""
    from pyiceberg.expressions import EqualTo, In

    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, format={"metadata": "prefixed"})
    events = pizza_events(5, seed=193)
    produce_to_partition(broker.bootstrap, topic, 0, [events[0]])  # creates the topic; offset 0, no marker
    _transactional(broker.bootstrap, topic, events[1:3])  # 1 and 3, markers at 2 and 4
    produce_to_partition(broker.bootstrap, topic, 0, [events[3], b'{"order_id": ', events[4]])
    spec = load_pipeline(path)
    done = ingest_inline(spec)
    assert (done.records, done.dead_letters) == (6, 1)
    table = table_of(path)
    offsets = sorted(table.scan(selected_fields=("_kafka_offset",)).to_arrow().column(0).to_pylist())
    markers = sorted(set(range(offsets[-1] + 1)) - set(offsets) - {offsets[-1] - 1})
    assert len(markers) == 2, (offsets, "the commit markers take an offset each")
    capsys.readouterr()
    assert main(["audit", "--pipeline", str(path), "--deep", "--json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)  # stdout: the document alone; the deep audit's progress goes to stderr
    assert doc["clean"], doc
    assert [f["message"] for f in doc["findings"] if f["check"] == "deep"] == [
        "2 offsets hold no record in Kafka (transaction markers or compaction)"
    ]
    progress = out.err.splitlines()
    assert "reading the source offsets of rpc.orders over 1 merged range(s) ..." in progress, out.err
    assert any(re.fullmatch(r"read 5 offsets of rpc\.orders in [0-9.]+ s", line) for line in progress), out.err
    assert f"[1/1] checked through {topic}[0] [0, {offsets[-1] + 1})" in progress, out.err

    twice = table.scan(row_filter=In("_kafka_offset", offsets[:2])).to_arrow()
    table.append(twice)
    table_of(path).delete(EqualTo("_kafka_offset", offsets[2]))
    capsys.readouterr()
    assert main(["audit", "--pipeline", str(path), "--deep", "--json"]) == 1
    deep = {
        (f["start"], f["end"], f["message"])
        for f in json.loads(capsys.readouterr().out)["findings"]
        if f["check"] == "deep" and f["severity"] == "error"
    }
    assert offsets[:3] == [0, 1, 3]
    assert deep == {(0, 2, "offsets in the table twice"), (3, 4, "records in Kafka with no row and no dead letter")}


def test_the_deep_audit_of_a_change_table_finds_a_key_held_twice(broker, home, topic, capsys):
    """A change table (Debezium, upserts by `id`) after two change batches equal to the reference model audits
    clean, deep included (its rows' offsets are each once; offsets of superseded changes have no row by design).
    A copy of one row appended outside Tidewater: the key is named as held twice (and its offset as in the
    table twice), exit 1."""
    path = write_pipeline(
        home,
        name="prices",
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        format={"value": "debezium", "metadata": "prefixed"},
        validation={"not_null": ["id"]},
        table={"identifier": "rpc.prices", "id_columns": ["id"], "upsert": True},
    )
    model = ingest_changes(broker, topic, load_pipeline(path), batches=2, changes=40, keys=12, seed=210)
    table = table_of(path)
    assert {r["id"]: r["item"] for r in table.scan(selected_fields=("id", "item")).to_arrow().to_pylist()} == {
        k: v["item"] for k, v in model.items()
    }
    code, doc = _audit_deep(path, capsys)
    assert code == 0 and doc["clean"], doc
    one = table.scan(limit=1).to_arrow()
    table.append(one)
    code, doc = _audit_deep(path, capsys)
    keys = [f["message"] for f in doc["findings"] if f["check"] == "deep" and f["severity"] == "error"]
    assert code == 1 and sorted(keys) == [f"key {{'id': {one.column('id')[0].as_py()}}} has 2 rows", "offsets in the table twice"], doc


def _audit_deep(path, capsys) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["audit", "--pipeline", str(path), "--deep", "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_lag_beyond_retention_is_a_warning_naming_the_partition_and_the_setting(broker, home, topic, capsys):
    """A topic with retention.ms one hour and a retention.bytes, whose records were written 55 minutes ago
    (CreateTime set by the producer). After a batch of 2 of its 10 records (batch.max_records 2) the audit is
    still clean (exit 0) but warns twice on the partition's unread range [2, 10): the oldest unread record is
    0.9 h old against 1.0 h of retention.ms, and the 8 unread records are 80% of the retained log against
    retention.bytes. Once everything is read, no warning. (The embedded broker keeps records past retention,
    STACK.md, so the records are not actually deleted here: the check reads the settings and timestamps only.)"""
    import time

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    created = admin.create_topics([NewTopic(topic, 1, 1, config={"retention.ms": "3600000", "retention.bytes": "1048576"})])
    created[topic].result(15)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    written = int(time.time() * 1000) - 55 * 60_000
    for i, value in enumerate(pizza_events(10, seed=191)):
        producer.produce(topic, value, partition=0, timestamp=written + i)
        if i == 8:
            producer.flush(15)  # the last record in its own request (the embedded broker's high watermark)
    producer.flush(15)
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, batch={"max_records": 2})
    ingest_inline(load_pipeline(path))
    code, doc = _audit(path, capsys)
    assert code == 0 and doc["clean"], doc
    warnings = [f for f in doc["findings"] if f["severity"] == "warning"]
    assert [(f["topic"], f["partition"], f["start"], f["end"]) for f in warnings] == [(topic, 0, 2, 10)] * 2
    assert "the oldest unread record is 0.9 h old and retention.ms is 1.0 h" in warnings[0]["message"]
    assert "8 unread records are 80% of the partition's retained log (retention.bytes 1048576)" in warnings[1]["message"]
    write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap})
    ingest_inline(load_pipeline(path))
    code, doc = _audit(path, capsys)
    assert code == 0 and not [f for f in doc["findings"] if f["severity"] == "warning"], doc


def test_a_data_file_removed_outside_tidewater_is_named_by_its_snapshot_and_rows(broker, home, topic, capsys):
    """One of the table's data files deleted with pyiceberg (a delete snapshot that drops the file, as an operator
    cleaning up by hand would): exit 1, the snapshot named with the rows it removed, and nothing else at fault."""
    spec, path = _setup(broker, home, topic)
    table = table_of(path)
    victim = next(t.file for t in table.scan().plan_files() if t.file.record_count > 0)
    with table.transaction() as tx, tx.update_snapshot().overwrite() as overwrite:
        overwrite.delete_data_file(victim)
    assert victim.file_path not in {t.file.file_path for t in table_of(path).scan().plan_files()}
    removed = table_of(path).current_snapshot().snapshot_id
    code, doc = _audit(path, capsys)
    assert code == 1 and not doc["clean"]
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert [(f["check"], f["snapshot_id"]) for f in errors] == [("outside-write", removed)]
    assert f"0 rows added, {victim.record_count} removed" in errors[0]["message"]


def test_the_ledger_is_compacted_into_one_file_and_keeps_recording_after(broker, home, topic, capsys):
    """Five batches (four commits) leave a ledger of one small file per sync; compaction (what snapshot expiry runs once there
    are 32) rewrites them into one file with the same entries, and the next batch's entry follows it: the
    audit is clean over six batches."""
    spec, path = _setup(broker, home, topic)
    catalog = load_catalog(spec)
    before = ledger.read(catalog, spec).sort_by([("batch_id", "ascending"), ("start_offset", "ascending")])
    ledger_table = catalog.load_table(ledger.identifier(spec))
    files = len(list(ledger_table.scan().plan_files()))
    assert files >= 4  # the skip's two batches are one commit
    assert ledger.compact(catalog, spec, at_files=files + 1) == 0  # below the threshold: untouched
    assert ledger.compact(catalog, spec, at_files=3) == files
    assert len(list(catalog.load_table(ledger.identifier(spec)).scan().plan_files())) == 1
    assert ledger.read(catalog, spec).sort_by([("batch_id", "ascending"), ("start_offset", "ascending")]).equals(before)
    produce_to_partition(broker.bootstrap, topic, 0, pizza_events(7, seed=192))
    ingest_inline(spec)
    assert ledger.read(catalog, spec).num_rows == before.num_rows + 1
    code, doc = _audit(path, capsys)
    assert code == 0 and doc["clean"] and doc["batches"] == 6, doc


def test_an_aborted_transaction_leaves_offsets_the_deep_audit_explains(broker, home, topic, capsys):
    """A record, a transaction of one record that is aborted, then two records. On Kafka a read_committed
    consumer never sees the aborted record: its offset and the abort marker's hold no committed record, and the
    deep audit asks Kafka and reports them as such (clean). The embedded broker delivers aborted records to
    read_committed consumers (STACK.md), so here the aborted record becomes a row; what is checked is what holds
    on both: the audit is clean, every offset of the range is a row or is reported as holding no record, and
    at least the abort marker is among the latter."""
    path = write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, format={"metadata": "prefixed"})
    events = pizza_events(4, seed=194)
    produce_to_partition(broker.bootstrap, topic, 0, [events[0]])
    _transactional(broker.bootstrap, topic, [events[1]], abort=True)
    produce_to_partition(broker.bootstrap, topic, 0, events[2:])
    spec = load_pipeline(path)
    ingest_inline(spec)
    table = table_of(path)
    offsets = sorted(table.scan(selected_fields=("_kafka_offset",)).to_arrow().column(0).to_pylist())
    end = committed_state(table).offsets[topic][0]
    assert offsets[0] == 0 and offsets[-1] == end - 1 and 3 <= len(offsets) <= 4
    capsys.readouterr()
    assert main(["audit", "--pipeline", str(path), "--deep", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["clean"], doc
    holes = end - len(offsets)
    assert holes >= 1
    assert [f["message"] for f in doc["findings"] if f["check"] == "deep"] == [
        f"{holes} offset{'s' if holes > 1 else ''} hold{'' if holes > 1 else 's'} no record in Kafka (transaction markers or compaction)"
    ]


def _routed(home, broker, a: str, b: str) -> tuple:
    """A routed pipeline: topic ``a`` to rpc.a, topic ``b`` to rpc.b, rows carrying their source offsets."""
    path = write_pipeline(
        home,
        topics=[a, b],
        kafka={"bootstrap_servers": broker.bootstrap},
        table={"identifier": ""},
        validation={"not_null": []},
        format={"metadata": "prefixed"},
        routing={"namespace": "rpc"},
        tables=[{"identifier": "rpc.a", "topics": [a]}, {"identifier": "rpc.b", "topics": [b]}],
    )
    return load_pipeline(path), path


def _errors(doc: dict) -> set[tuple]:
    return {(f["check"], f["table"], f["batch_id"], f["start"], f["end"]) for f in doc["findings"] if f["severity"] == "error"}


def test_a_routed_pipeline_is_audited_from_its_checkpoint_and_each_target_table(broker, home, topic, capsys, monkeypatch):
    """Topic A to rpc.a, topic B to rpc.b. Batch 1 (10 and 7 records) commits with its ledger entry failing (a kill
    between the two commits); batch 2 (3 records to A; 2 good and 1 undecodable record to B) records both. The audit
    reads the checkpoint's ranges and counts (read = routed + dead letters + skipped) and each table's commits: clean,
    deep too, for the pipeline and for one table (`--table`); an unknown table is an error (exit 2). A single-table
    view (maintenance's) syncs the pipeline's ledger, and after every old snapshot of the tables is expired the audit
    (`--full`) still sees both batches. Batch 2's lineage: both topics' ranges in, each table's rows and the dead letter out.
    Then two faults, each named with its table: 2 rows of rpc.a appended with pyiceberg (an
    outside write; the deep audit: offsets in the table twice), and a batch 3 whose commit to rpc.b is lost while the
    checkpoint commits (the checkpoint's batch is missing from rpc.b; the deep audit: B's records have no row); the
    audit's lineage fails each table's assertion for its own fault only."""
    from datetime import datetime, timedelta, timezone

    from pyiceberg.expressions import In

    from tidewater.commit import batch as committing
    from tidewater.runtime import lineage
    from tidewater.steps.lifecycle import commit_step, validate_step

    a, b = topic + "-a", topic + "-b"
    spec, path = _routed(home, broker, a, b)
    produce_to_partition(broker.bootstrap, a, 0, [json.dumps({"id": i}).encode() for i in range(10)])
    produce_to_partition(broker.bootstrap, b, 0, [json.dumps({"id": i}).encode() for i in range(7)])
    real = ledger.sync
    monkeypatch.setattr(ledger, "sync", lambda *a, **k: (_ for _ in ()).throw(OSError("killed")))
    first = ingest_inline(spec)
    monkeypatch.setattr(ledger, "sync", real)
    assert ledger.read(load_catalog(spec), spec).num_rows == 0
    produce_to_partition(broker.bootstrap, a, 0, [json.dumps({"id": i}).encode() for i in range(10, 13)])
    produce_to_partition(broker.bootstrap, b, 0, [b'{"id": 7}', b'{"id": ', b'{"id": 9}'])
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    second = commit_step(spec, plan, manifest)
    assert (second.records, second.dead_letters) == (6, 1)
    entries = ledger.read(load_catalog(spec), spec).to_pylist()
    cp = [
        (e["batch_id"], e["topic"], e["start_offset"], e["end_offset"], e["records"], e["rows"], e["dead_letters"])
        for e in entries
        if e["table"] == spec.checkpoint_table()
    ]
    assert sorted(cp) == sorted(
        [
            (first.batch_id, a, 0, 10, 17, 17, 0),
            (first.batch_id, b, 0, 7, 17, 17, 0),
            (second.batch_id, a, 10, 13, 6, 5, 1),
            (second.batch_id, b, 7, 10, 6, 5, 1),
        ]
    )
    assert {(e["table"], e["batch_id"], e["rows"]) for e in entries if e["table"] == "rpc.b"} == {
        ("rpc.b", first.batch_id, 7),
        ("rpc.b", second.batch_id, 2),
    }
    code, doc = _audit_args(["--deep"], path, capsys)
    assert code == 0 and doc["clean"] and doc["batches"] == 2 and doc["tables"] == ["rpc.a", "rpc.b"], doc
    assert sorted((p["topic"], p["committed"], p["lag"]) for p in doc["partitions"]) == [(a, 13, 0), (b, 10, 0)]
    code, one = _audit_args(["--table", "rpc.b"], path, capsys)
    assert code == 0 and one["table"] == "rpc.b" and one["tables"] == ["rpc.b"]
    assert main(["audit", "--pipeline", str(path), "--table", "rpc.nope"]) == 2
    assert "rpc.nope" in capsys.readouterr().err

    catalog = load_catalog(spec)
    assert ledger.sync(catalog, spec.for_table("rpc.a")) == 0, "a view syncs the pipeline's ledger (nothing new)"
    assert catalog.table_exists("rpc.a_ledger") is False
    for ident in ("rpc.a", "rpc.b", spec.checkpoint_table()):
        t = catalog.load_table(ident)
        t.maintenance.expire_snapshots().older_than(datetime.now(timezone.utc) + timedelta(seconds=1)).commit()
        assert len(catalog.load_table(ident).snapshots()) == 1
    code, doc = _audit_args(["--deep"], path, capsys)
    assert code == 0 and doc["batches"] == 0 and doc["since"], ("nothing new since the last clean deep audit", doc)
    code, doc = _audit_args(["--deep", "--full"], path, capsys)
    assert code == 0 and doc["batches"] == 2 and doc["since"] is None, doc

    table_a = catalog.load_table("rpc.a")
    table_a.append(table_a.scan(row_filter=In("_kafka_offset", [3, 4])).to_arrow())
    lose = []

    def lost_commit(catalog, plan, out, *args, **kw):
        if out.table == "rpc.b":  # the table's commit reported done, never made
            lose.append(plan.batch_id)
            return "committed"
        return real_commit(catalog, plan, out, *args, **kw)

    real_commit = committing.commit_table_output
    monkeypatch.setattr(committing, "commit_table_output", lost_commit)
    produce_to_partition(broker.bootstrap, b, 0, [json.dumps({"id": i}).encode() for i in range(20, 24)])
    third = ingest_inline(spec)
    assert lose == [third.batch_id]
    code, doc = _audit_args(["--deep"], path, capsys)
    assert code == 1 and not doc["clean"]
    outside = next(f["snapshot_id"] for f in doc["findings"] if f["check"] == "outside-write")
    assert outside == table_a.refresh().current_snapshot().snapshot_id
    assert _errors(doc) == {
        ("deep", None, third.batch_id, 10, 14),
        ("deep", "rpc.a", None, 3, 5),
        ("outside-write", "rpc.a", None, None, None),
        ("routed", "rpc.b", third.batch_id, None, None),
    }
    missing = next(f for f in doc["findings"] if f["check"] == "routed")
    assert "no commit of it" in missing["message"] and missing["topic"] is None
    assert main(["audit", "--pipeline", str(path)]) == 1
    text = capsys.readouterr().out
    assert "rpc.b: " in text and "rpc.a: " in text, text
    # lineage last: importing Airflow's OpenLineage provider sets up its logging on stdout in this process
    from tidewater.audit.pipeline import audit

    batch = lineage.batch_lineage(spec, plan, manifest, second)
    assert [
        (i.name, [(r["partition"], r["start"], r["end"]) for r in i.inputFacets["tidewater_offsetRanges"].ranges]) for i in batch.inputs
    ] == sorted([(a, [(0, 10, 13)]), (b, [(0, 7, 10)])])
    assert {o.facets["symlinks"].identifiers[0].name: o.outputFacets["outputStatistics"].rowCount for o in batch.outputs} == {
        "rpc.a": 3,
        "rpc.b": 2,
        spec.dead_letter_table(): 1,
    }
    inputs = lineage.audit_lineage(spec, audit(spec), deep=False).inputs
    verdicts = {
        i.facets["symlinks"].identifiers[0].name: {x.assertion: x.success for x in i.facets["dataQualityAssertions"].assertions}
        for i in inputs
    }
    assert verdicts["rpc.a"]["tidewater_audit_outside-write"] is False and verdicts["rpc.a"]["tidewater_audit_routed"]
    assert verdicts["rpc.b"]["tidewater_audit_routed"] is False and verdicts["rpc.b"]["tidewater_audit_outside-write"]


def _audit_args(args: list[str], path, capsys) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["audit", "--pipeline", str(path), "--json", *args])
    out = capsys.readouterr()
    assert out.out.startswith("{"), out
    return code, json.loads(out.out)


def test_a_compacted_topic_is_not_warned_about_retention_and_its_offsets_are_accounted_for(broker, home, topic, capsys):
    """A topic with cleanup.policy compact (and a retention.ms of one hour, which Kafka does not apply to a topic
    that only compacts): 9 keyed records over 3 keys, written 55 minutes ago. After a batch of 3 the audit is clean,
    with no lag-beyond-retention warning (retention deletes nothing here) and a note naming the partition's unread
    range: compaction may remove a superseded unread record first. On Kafka, an offset the log cleaner emptied
    holds no record, and the deep audit asks Kafka and reports it as such (the check the aborted-transaction test
    exercises); the embedded broker runs no log cleaner (STACK.md: it applies no retention either), so here every
    offset keeps its record, and once all are read the deep audit is clean with no offset unaccounted for."""
    import time

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    created = admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact", "retention.ms": "3600000"})])
    created[topic].result(15)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    written = int(time.time() * 1000) - 55 * 60_000
    for i, value in enumerate(pizza_events(9, seed=195)):
        producer.produce(topic, value, key=f"k{i % 3}".encode(), partition=0, timestamp=written + i)
        if i == 7:
            producer.flush(15)  # the last record in its own request (the embedded broker's high watermark)
    producer.flush(15)
    path = write_pipeline(
        home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, batch={"max_records": 3}, format={"metadata": "prefixed"}
    )
    ingest_inline(load_pipeline(path))
    code, doc = _audit(path, capsys)
    assert code == 0 and doc["clean"], doc
    assert not [f for f in doc["findings"] if f["severity"] == "warning"], doc
    notes = [f for f in doc["findings"] if f["check"] == "kafka" and f["severity"] == "info"]
    assert [(f["topic"], f["partition"], f["start"], f["end"]) for f in notes] == [(topic, 0, 3, 9)], doc
    assert "compacted topic" in notes[0]["message"] and "min.compaction.lag.ms" in notes[0]["message"]
    write_pipeline(home, topics=[topic], kafka={"bootstrap_servers": broker.bootstrap}, format={"metadata": "prefixed"})
    ingest_inline(load_pipeline(path))
    code, doc = _audit_deep(path, capsys)
    assert code == 0 and doc["clean"] and doc["partitions"][0]["committed"] == 9, doc
    assert [f for f in doc["findings"] if f["check"] in ("deep", "kafka")] == [], doc
    assert len(table_of(path).scan().to_arrow()) == 9
