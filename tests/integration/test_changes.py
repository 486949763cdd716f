"""Change streams applied to the table (issue 13): the table equals a reference model of the source after every
batch, through the real broker, the task code, the quality gate and the catalog; reads through pyiceberg and
Spark SQL; exactly once under retries, a crash before the commit and a concurrent compaction."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import pytest

from tests.conftest import commit_as_airflow_would, ingest_inline, produce_to_partition, registered_avro, stage_inline, write_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.errors import OffsetsMovedError, TransientError
from tidewater.spark import session as spark_session
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import CHANGES, committed_state
from tidewater_dev.changes import apply, change_stream, encode

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 3
STYLES = {
    "debezium": {"format": {"value": "debezium"}, "table": {"identifier": "rpc.prices", "id_columns": ["id"], "upsert": True}},
    "debezium_schema": {"format": {"value": "debezium"}, "table": {"identifier": "rpc.prices", "id_columns": ["id"], "upsert": True}},
    "op_field": {"table": {"identifier": "rpc.prices", "id_columns": ["id"], "op_field": "op"}},
    "upsert": {"table": {"identifier": "rpc.prices", "id_columns": ["id"], "upsert": True}},
}


def _spec(home, broker, topic, style, **more):
    validation = {"not_null": ["id"], **more.pop("validation", {})}
    return load_pipeline(
        write_pipeline(
            home,
            name="prices",
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            validation=validation,
            **STYLES[style],
            **more,
        )
    )


def _produce(broker, topic, records) -> None:
    """Each id to partition id % PARTITIONS, in order (keys partitioned by key, as Debezium does)."""
    by_part: dict[int, list] = defaultdict(list)
    for key, value in records:
        by_part[key % PARTITIONS].append(value)
    for p, values in sorted(by_part.items()):
        produce_to_partition(broker.bootstrap, topic, p, values, partitions=PARTITIONS)


def _rows(table) -> dict[int, dict]:
    t = table.scan(selected_fields=("id", "item", "price")).to_arrow().to_pylist()
    out = {r["id"]: r for r in t}
    assert len(out) == len(t), "a key is in the table twice"
    return out


def _table(spec):
    return load_table(load_catalog(spec), spec.table.identifier)


def _close(a: dict, b: dict) -> bool:
    """Rows equal, prices compared as float32 (the inferred column type)."""
    import numpy as np

    if a.keys() != b.keys():
        return False
    return all(a[k]["item"] == b[k]["item"] and np.float32(a[k]["price"] or 0) == np.float32(b[k]["price"] or 0) for k in a)


@pytest.mark.parametrize("style", ["debezium", "debezium_schema", "op_field", "upsert"])
def test_change_stream_table_equals_the_source_after_every_batch(broker, home, topic, style):
    """Debezium JSON (plain, and inside Connect's schema/payload wrapper), op-field and plain upsert streams.
    Four batches of 150 generated changes over 60 keys (inserts, updates of present and absent keys, deletes,
    re-inserts, deletes of absent keys, tombstones): after every batch the table equals the reference model,
    each key once; the snapshot's counts add up (read = inserted + updated + deleted + no-op + dead letters +
    skipped), tombstones are skipped, and the batch's staged change files are gone after the commit."""
    spec = _spec(home, broker, topic, style)
    model: dict[int, dict] = {}
    totals: dict[str, int] = defaultdict(int)
    produced: dict[int, int] = defaultdict(int)
    for b in range(4):
        changes = change_stream(model, 150, keys=60, seed=b, deletes=style != "upsert")
        records = encode(changes, model, style)
        _produce(broker, topic, records)
        for key, _ in records:
            produced[key % PARTITIONS] += 1
        plan, manifest = stage_inline(spec)
        validate_step(spec, plan, manifest)
        result = commit_step(spec, plan, manifest)
        model = apply(model, changes)
        table = _table(spec)
        assert _close(_rows(table), model), f"batch {b}: table differs from the source"
        summary = table.current_snapshot().summary
        counts = json.loads(summary[CHANGES])
        tombstones = len(records) - len(changes)
        assert int(summary["tidewater.records"]) == len(records) == result.records
        assert int(summary["tidewater.skipped"]) == tombstones
        assert counts["inserted"] + counts["updated"] + counts["deleted"] + counts["noop"] == len(changes)
        assert counts["cross_partition_keys"] == 0
        for k in ("inserted", "updated", "deleted", "noop"):
            totals[k] += counts[k]
        assert manifest.data_files and not any(table.io.new_input(f.file_path).exists() for f in manifest.data_files)
    assert committed_state(_table(spec)).offsets[topic] == dict(produced)
    # what operators see: status, history and the Airflow view's batches carry the last batch's counts
    from tidewater.ops.overview import recent_batches
    from tidewater.ops.status import history, status

    assert status(spec)["last_batch_changes"] == counts
    assert [h["changes"] for h in history(spec) if h["changes"]][-1] == counts
    assert [b["changes"] for b in recent_batches(spec, _table(spec), 10)][0] == counts
    assert totals["updated"] > 0 and (style == "upsert" or (totals["deleted"] > 0 and totals["noop"] > 0))


def _batch(broker, topic, spec, model, seed, n=120):
    """Produce one generated batch of Debezium changes; returns the model after it."""
    changes = change_stream(model, n, keys=40, seed=seed)
    _produce(broker, topic, encode(changes, model, "debezium"))
    return apply(model, changes)


def test_a_change_batch_applies_once_when_its_commit_is_retried_or_it_is_replanned_after_a_crash(broker, catalog, home, topic):
    """Debezium changes. (1) Write, crash before the commit, then the commit step runs twice (Airflow's retry
    after a commit that landed): applied once, one snapshot carries the batch. (2) A batch is written and its
    process dies; the next run plans the same range anew and commits it; the dead batch's commit is then
    refused (offsets moved) and the table still equals the source: no change is applied twice."""
    spec = _spec(home, broker, topic, "debezium")
    model = _batch(broker, topic, spec, {}, seed=10)
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    first = commit_step(spec, plan, manifest)
    again = commit_step(spec, plan, manifest)
    assert (first.status, again.status) == ("committed", "already-committed")
    table = _table(spec)
    assert _close(_rows(table), model)
    assert sum(1 for s in table.snapshots() if s.summary.additional_properties.get("tidewater.batch-id") == plan.batch_id) == 1

    model = _batch(broker, topic, spec, model, seed=11)
    dead_plan, dead_manifest = stage_inline(spec)  # written, never committed: its process died
    validate_step(spec, dead_plan, dead_manifest)
    assert ingest_inline(spec).status == "committed"  # the next run: same range, new batch
    with pytest.raises(OffsetsMovedError):
        commit_step(spec, dead_plan, dead_manifest)
    table = _table(spec)
    assert _close(_rows(table), model)
    assert committed_state(table).offsets == committed_state(_table(spec)).offsets


def test_two_change_batches_racing_for_one_range_commit_once(broker, catalog, home, topic):
    """Two batches planned from the same offsets commit at the same time: one lands, the other is refused
    (offsets moved), and the table equals the source with every key once."""
    spec = _spec(home, broker, topic, "debezium")
    model = _batch(broker, topic, spec, {}, seed=20)
    ingest_inline(spec)
    model = _batch(broker, topic, spec, model, seed=21)
    staged = [stage_inline(spec) for _ in range(2)]
    for plan, manifest in staged:
        validate_step(spec, plan, manifest)
    outcomes: list = []
    start = threading.Barrier(2)

    def commit(plan, manifest) -> None:
        start.wait()
        try:
            outcomes.append(commit_step(spec, plan, manifest).status)
        except (OffsetsMovedError, TransientError) as e:
            outcomes.append(type(e).__name__)

    threads = [threading.Thread(target=commit, args=s) for s in staged]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["OffsetsMovedError", "committed"], outcomes
    assert _close(_rows(_table(spec)), model)


def test_compaction_racing_change_batches_never_resurrects_or_double_deletes_a_row(broker, home, topic):
    """Change batches (updates and deletes of rows in files the compaction rewrites) commit while Spark
    compacts in a loop. Either side may lose a round (Iceberg's validation of the rewrite against new delete
    files; our row delta's check that the table did not move): the loser is retried as its Airflow task
    would be. After the race the table equals the source through pyiceberg and through Spark SQL, and a last
    compaction folds every delete file away."""
    from tidewater.ops.maintenance import maintain

    spec = _spec(home, broker, topic, "debezium", maintenance={"rewrite_data_files": {"min_input_files": 2, "delete_file_threshold": 1}})
    model = _batch(broker, topic, spec, {}, seed=30, n=200)
    ingest_inline(spec)
    spark = spark_session.session(spec, app_name="tidewater-test-changes", master="local[2]")
    errors: list[BaseException] = []
    done = threading.Event()
    final: dict[str, dict] = {}

    def changes() -> None:
        m = model
        try:
            for i in range(3):
                m = _batch(broker, topic, spec, m, seed=31 + i, n=80)
                plan, manifest = stage_inline(spec)
                validate_step(spec, plan, manifest)
                commit_as_airflow_would(spec, plan, manifest)  # a commit that lost every attempt is retried
                # let a compaction round end before the next commit, so both sides land some of the time
                seen = len(rounds)
                deadline = time.monotonic() + 60
                while len(rounds) == seen and time.monotonic() < deadline:
                    time.sleep(0.1)
            final["model"] = m
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
        finally:
            done.set()

    rounds: list[str] = []
    try:
        worker = threading.Thread(target=changes)
        worker.start()
        while not done.is_set():
            try:
                [r] = maintain(spec, actions=["rewrite_data_files"], spark=spark)
                rounds.append(f"rewrote {r.details.get('rewritten_data_files_count') or 0}")
            except TransientError as e:
                rounds.append(f"lost: {e}"[:200])
        worker.join()
        assert not errors, errors
        model = final["model"]
        table = _table(spec)
        assert _close(_rows(table), model)
        ident = f"{spec.catalog.name}.{spec.table.identifier}"
        spark.sql(f"REFRESH TABLE {ident}")
        seen = {
            r["id"]: {"id": r["id"], "item": r["item"], "price": r["price"]}
            for r in spark.sql(f"SELECT id, item, price FROM {ident}").collect()
        }
        assert _close(seen, model)
        assert any(r.startswith("rewrote") and r != "rewrote 0" for r in rounds), rounds
        # the maintenance actions fold the deletes away: compaction rewrites the files that have deletes
        # (delete_file_threshold 1 here) and the position delete rewrite drops the deletes left dangling
        reports = maintain(spec, actions=["rewrite_data_files", "rewrite_position_delete_files"], spark=spark)
        assert reports[0].before.delete_files > 0 and reports[-1].after.delete_files == 0, [r.text() for r in reports]
        assert "delete files" in reports[0].text()
        table = _table(spec)
        assert _close(_rows(table), model)
        assert [t for t in table.scan().plan_files() if t.delete_files] == []
    finally:
        spark.stop()


def test_bad_changes_are_dead_letters_naming_their_record_through_spark(broker, home, topic):
    """Through `tidewater run` (spark-submit): an unknown operation and a change without its key are dead letters
    with topic, partition, offset and class; the good changes apply (a delete of a key inserted in the same
    batch leaves nothing), and the snapshot's counts add up to the records read."""
    from tidewater.steps.lifecycle import run_once

    path = write_pipeline(
        home,
        name="prices",
        topics=[topic],
        kafka={"bootstrap_servers": broker.bootstrap},
        validation={"not_null": ["id"]},
        **STYLES["op_field"],
    )
    values = [
        json.dumps(v).encode()
        for v in (
            {"id": 1, "item": "a", "price": 1.0, "op": "I"},
            {"id": 2, "item": "b", "price": 2.0, "op": "I"},
            {"id": 1, "item": "a2", "price": 1.5, "op": "X"},  # unknown operation
            {"item": "c", "price": 3.0, "op": "I"},  # no key
            {"id": 2, "op": "D"},
            {"id": 3, "item": "c", "price": 3.0, "op": "U"},  # update of an absent key: an insert
            {"id": 4, "op": "D"},  # delete of an absent key: a no-op
        )
    ]
    produce_to_partition(broker.bootstrap, topic, 0, values)
    result = run_once(path)
    assert result["records"] == 7
    spec = load_pipeline(path)
    table = _table(spec)
    assert _close(_rows(table), {1: {"id": 1, "item": "a", "price": 1.0}, 3: {"id": 3, "item": "c", "price": 3.0}})
    summary = table.current_snapshot().summary
    counts = json.loads(summary[CHANGES])
    assert (counts["inserted"], counts["updated"], counts["deleted"], counts["noop"]) == (3, 0, 1, 1)
    assert int(summary["tidewater.dead-letters"]) == 2 and int(summary["tidewater.records"]) == 7
    dlq = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().sort_by("offset").to_pylist()
    assert [(d["topic"], d["partition"], d["offset"], d["error_class"]) for d in dlq] == [
        (topic, 0, 2, "UnknownOp"),
        (topic, 0, 3, "MissingId"),
    ]
    assert "'X'" in dlq[0]["error_message"]
    assert committed_state(table).offsets == {topic: {0: 7}}


VALUE = {
    "type": "record",
    "name": "Value",
    "namespace": "pg.public.prices",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "item", "type": ["null", "string"], "default": None},
        {"name": "price", "type": ["null", "float"], "default": None},
    ],
}
VALUE2 = {**VALUE, "fields": [*VALUE["fields"], {"name": "currency", "type": ["null", "string"], "default": None}]}


def _envelope(value: dict) -> dict:
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": "pg.public.prices",
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {"name": "after", "type": ["null", "pg.public.prices.Value"], "default": None},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
        ],
    }


def test_scenario_4_debezium_avro_example_pipeline_equals_the_source(broker, home, topic, monkeypatch, registry_url):
    """docs/examples/prices_debezium_avro.yaml as shipped (only the topic, the broker and the registry pointed
    at this test's): Debezium Avro envelopes under two registered schema versions (the second adds a column),
    with deletes and tombstones, end equal to the source table; the new column is added. The schemas are
    registered in the session's real registry."""
    import io
    import struct

    import fastavro
    import yaml

    from tests.conftest import REPO

    schemas = {1: _envelope(VALUE), 2: _envelope(VALUE2)}
    ids = registered_avro(registry_url, f"{topic}-value", schemas)
    doc = yaml.safe_load((REPO / "docs" / "examples" / "prices_debezium_avro.yaml").read_text())
    doc["topics"] = [topic]
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap)
    monkeypatch.setenv("SCHEMA_REGISTRY_URL", registry_url)
    path = home / "prices.yaml"
    path.write_text(yaml.safe_dump(doc))
    spec = load_pipeline(path)
    assert spec.applies_changes and spec.op_column() == "_op"

    def framed(schema_id: int, before: dict | None, after: dict | None, op: str) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(
            buf, fastavro.parse_schema(schemas[schema_id]), {"before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_000}
        )
        return b"\x00" + struct.pack(">I", ids[schema_id]) + buf.getvalue()

    model: dict[int, dict] = {}
    for batch, schema_id in ((0, 1), (1, 1), (2, 2)):
        changes = change_stream(model, 90, keys=30, seed=40 + batch)
        records = []
        for c in changes:
            key = c.id
            before = model.get(key)
            extra = {"currency": "EUR"} if schema_id == 2 else {}
            op = {"insert": "c", "update": "u", "delete": "d"}[c.op]
            after = None if c.op == "delete" else {**c.row(), **extra}
            before_img = (
                ({**before, **extra} if before else {"id": key, "item": None, "price": None, **extra}) if c.op != "insert" else None
            )
            records.append((key, framed(schema_id, before_img, after, op)))
            if c.op == "delete":
                records.append((key, None))
                model.pop(key, None)
            else:
                model[key] = c.row()
        _produce(broker, topic, records)
        ingest_inline(spec)
        table = _table(spec)
        assert _close(_rows(table), model), f"batch {batch}"
    assert "currency" in table.schema().column_names
    assert set(table.scan(selected_fields=("currency",)).to_arrow().column("currency").to_pylist()) <= {"EUR", None}


def test_a_composite_key_identifies_rows(broker, home, topic):
    """id_columns [region, id]: the same id in two regions is two rows; an update and a delete touch only the
    row with both values (the lookup joins on every id column)."""
    spec = load_pipeline(
        write_pipeline(
            home,
            name="prices",
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            validation={"not_null": ["id"]},
            table={"identifier": "rpc.prices", "id_columns": ["region", "id"], "op_field": "op"},
        )
    )

    def send(*rows: dict) -> None:
        produce_to_partition(broker.bootstrap, topic, 0, [json.dumps(r).encode() for r in rows])
        ingest_inline(spec)

    send(
        {"region": "eu", "id": 1, "item": "a", "price": 1.0, "op": "I"},
        {"region": "us", "id": 1, "item": "b", "price": 2.0, "op": "I"},
        {"region": "eu", "id": 2, "item": "c", "price": 3.0, "op": "I"},
    )
    send({"region": "us", "id": 1, "item": "b2", "price": 2.5, "op": "U"}, {"region": "eu", "id": 2, "op": "D"})
    rows = sorted((r["region"], r["id"], r["item"]) for r in _table(spec).scan().to_arrow().to_pylist())
    assert rows == [("eu", 1, "a"), ("us", 1, "b2")]
    counts = json.loads(_table(spec).current_snapshot().summary[CHANGES])
    assert (counts["updated"], counts["deleted"], counts["position_deletes"]) == (1, 1, 2)


def test_the_quality_gate_judges_new_row_images_not_delete_records(broker, home, topic):
    """validation.not_null [item]: delete records carry their key alone and pass; an insert without `item`
    fails the batch (nothing committed, offsets unchanged)."""
    from tidewater.errors import ValidationFailedError

    spec = load_pipeline(
        write_pipeline(
            home,
            name="prices",
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            validation={"not_null": ["id", "item"]},
            **STYLES["op_field"],
        )
    )

    def send(*rows: dict) -> None:
        produce_to_partition(broker.bootstrap, topic, 0, [json.dumps(r).encode() for r in rows])

    send({"id": 1, "item": "a", "price": 1.0, "op": "I"}, {"id": 2, "item": "b", "price": 2.0, "op": "I"}, {"id": 1, "op": "D"})
    assert ingest_inline(spec).status == "committed"
    assert sorted(_rows(_table(spec))) == [2]
    send({"id": 3, "price": 3.0, "op": "I"})
    with pytest.raises(ValidationFailedError, match="item"):
        ingest_inline(spec)
    table = _table(spec)
    assert sorted(_rows(table)) == [2] and committed_state(table).offsets == {topic: {0: 3}}


def _produce_keyed(broker, topic, records, partitions: int = PARTITIONS) -> None:
    """(key bytes, value bytes or None) per record, to partition id % partitions in order."""
    from confluent_kafka import Producer

    from tidewater_dev.sample_data import ensure_topic

    ensure_topic({"bootstrap.servers": broker.bootstrap}, topic, partitions)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for part in range(partitions):
        mine = [(k, v, i) for k, v, i in records if i % partitions == part]
        for n, (k, v, _) in enumerate(mine):
            if n == len(mine) - 1:
                p.flush(30)  # the last record of a partition in its own request (the embedded broker's watermark)
            p.produce(topic, v, key=k, partition=part)
        p.flush(30)


@pytest.mark.parametrize("key_style", ["json_object", "plain"])
def test_upserts_keyed_by_the_message_key_and_tombstones_delete(broker, home, topic, key_style):
    """table.key_source: message_key: values without their id land under the key's id, a later value replaces
    it, a tombstone (null value) deletes the key, a tombstone of an absent key is a no-op, and a record without
    a key is a dead letter (MissingId). Against the reference model, over two batches."""
    spec = load_pipeline(
        write_pipeline(
            home,
            name="prices",
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            validation={"not_null": ["id"]},
            table={"identifier": "rpc.prices", "id_columns": ["id"], "upsert": True, "key_source": "message_key"},
        )
    )

    def key(k: int) -> bytes:
        return json.dumps({"id": k}).encode() if key_style == "json_object" else str(k).encode()

    model: dict[int, dict] = {}
    for b in range(2):
        changes = change_stream(model, 120, keys=30, seed=60 + b)
        records = []
        for c in changes:
            value = None if c.op == "delete" else json.dumps({"item": c.item, "price": c.price}).encode()
            records.append((key(c.id), value, c.id))
        records.append((None, json.dumps({"item": "x", "price": 1.0}).encode(), 0))  # no key: a dead letter
        _produce_keyed(broker, topic, records)
        result = ingest_inline(spec)
        model = apply(model, changes)
        table = _table(spec)
        assert result.records == len(records), result
        assert _close(_rows(table), model), f"batch {b}"
        counts = json.loads(table.current_snapshot().summary[CHANGES])
        assert counts["inserted"] + counts["updated"] + counts["deleted"] + counts["noop"] == len(changes)
        assert result.dead_letters == 1
    assert counts["deleted"] > 0 and counts["noop"] >= 0


def test_debezium_events_keyed_by_the_message_key_count_their_tombstones_once(broker, home, topic):
    """`format.value: debezium` with `key_source: message_key`: Debezium's tombstones follow its deletes; keyed by
    the message key they are deletes (a no-op after the event's own delete), not skipped records as well, so the
    accounting adds up (it counted them twice and failed every batch) and the table equals the source."""
    spec = load_pipeline(
        write_pipeline(
            home,
            name="prices",
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            format={"value": "debezium"},
            validation={"not_null": ["id"]},
            table={"identifier": "rpc.prices", "id_columns": ["id"], "upsert": True, "key_source": "message_key"},
        )
    )
    model: dict[int, dict] = {}
    for b in range(2):
        changes = change_stream(model, 60, keys=15, seed=90 + b)
        records = [(json.dumps({"id": k}).encode(), v, k) for k, v in encode(changes, model, "debezium")]
        _produce_keyed(broker, topic, records)
        result = ingest_inline(spec)
        model = apply(model, changes)
        counts = json.loads(_table(spec).current_snapshot().summary[CHANGES])
        assert result.records == len(records) and result.dead_letters == 0
        assert sum(counts[k] for k in ("inserted", "updated", "deleted", "noop")) == len(records)
        assert counts["deleted"] > 0 and counts["noop"] >= counts["deleted"]  # each delete's tombstone: a no-op
        assert _close(_rows(_table(spec)), model), f"batch {b}"


def test_replaying_a_committed_change_range_restores_damage_and_otherwise_changes_nothing(broker, home, topic):
    """Three Debezium batches, then (1) a replay (mode reapply) of the first batch's range leaves the table equal
    to the source, with every key counted as reapplied, superseded, absent or no-op, and the offsets unchanged;
    (2) a row damaged by another writer (its image changed, its source offsets kept) is restored by replaying the
    range holding its latest change, and nothing else changes; (3) append-table modes are refused by name."""
    from pyiceberg.expressions import EqualTo

    from tidewater.errors import ConfigError
    from tidewater.ops.replay import run_replay
    from tidewater.plan.replay import ReplayRequest

    spec = _spec(home, broker, topic, "debezium")
    model: dict[int, dict] = {}
    ends = []
    for b in range(3):
        model = _batch(broker, topic, spec, model, seed=70 + b, n=90)
        ingest_inline(spec)
        ends.append(committed_state(_table(spec)).offsets[topic])
    offsets = committed_state(_table(spec)).offsets

    def replay(partition: int, start: int, end: int) -> dict:
        req = ReplayRequest(topic=topic, partitions=(partition,), start_offset=start, end_offset=end, mode="reapply")
        return run_replay(spec, req, inline=True, out=None)

    first = replay(0, 0, ends[0][0])
    assert first["status"] == "committed"
    assert sum(first["changes"][k] for k in ("reapplied", "restored", "superseded", "absent", "noop")) > 0
    table = _table(spec)
    assert _close(_rows(table), model) and committed_state(table).offsets == offsets

    # damage a row whose latest change is in partition 1's last batch, keeping its source columns
    rows = table.scan(row_filter=EqualTo("_kafka_partition", 1)).to_arrow()
    latest = rows.filter(rows.column("_kafka_offset").to_numpy() >= ends[1][1]).slice(0, 1)
    key = latest.column("id")[0].as_py()
    damaged = latest.set_column(latest.column_names.index("item"), "item", [["damaged"]])
    table.overwrite(damaged.cast(table.schema().as_arrow()), overwrite_filter=EqualTo("id", key))
    assert _rows(_table(spec))[key]["item"] == "damaged"
    fixed = replay(1, ends[1][1], ends[2][1])
    assert fixed["changes"]["reapplied"] >= 1
    table = _table(spec)
    assert _close(_rows(table), model) and committed_state(table).offsets == offsets

    with pytest.raises(ConfigError, match="replayed with mode reapply"):
        run_replay(spec, ReplayRequest(topic=topic, start_offset=0, end_offset=1, mode="replace"), inline=True, out=None)


def test_upserts_keyed_by_avro_message_keys_through_the_registry(broker, home, topic, registry_url):
    """format.value avro with table.key_source message_key: Confluent-framed Avro keys (a record with the id, as
    Debezium's Avro converter writes them) identify the rows, a tombstone deletes its key. The schemas are registered
    in the session's real registry."""
    import io
    import struct

    import fastavro

    schemas = {
        1: {"type": "record", "name": "Value", "fields": [{"name": "item", "type": "string"}, {"name": "price", "type": "double"}]},
        2: {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "long"}]},
    }
    ids = {
        **registered_avro(registry_url, f"{topic}-value", {1: schemas[1]}),
        **registered_avro(registry_url, f"{topic}-key", {2: schemas[2]}),
    }

    def framed(schema_id: int, record: dict) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(schemas[schema_id]), record)
        return b"\x00" + struct.pack(">I", ids[schema_id]) + buf.getvalue()

    spec = load_pipeline(
        write_pipeline(
            home,
            name="prices",
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            format={"value": "avro", "registry_url": registry_url},
            validation={"not_null": ["id"]},
            table={"identifier": "rpc.prices", "id_columns": ["id"], "upsert": True, "key_source": "message_key"},
        )
    )
    model: dict[int, dict] = {}
    for b in range(2):
        changes = change_stream(model, 90, keys=25, seed=80 + b)
        records = [
            (framed(2, {"id": c.id}), None if c.op == "delete" else framed(1, {"item": c.item, "price": c.price}), c.id) for c in changes
        ]
        _produce_keyed(broker, topic, records)
        ingest_inline(spec)
        model = apply(model, changes)
        assert _close(_rows(_table(spec)), model), f"batch {b}"


def test_a_quarantined_change_batch_waits_for_publish_or_drop_and_applies_in_order(broker, home, topic):
    """validation.on_failure quarantine on a change table. A batch the suite refuses lands as a whole row delta on
    its quarantine branch while main keeps its rows and moves its offsets on; the commit step fails with the report
    (again when retried, adding nothing); the next batch is not planned until the quarantined one is decided.
    Publishing applies its changes to main once (main then equals the source); a later batch applies after it. A
    second quarantined batch is dropped: main keeps the source without its changes, and planning goes on."""
    from tidewater.audit.pipeline import audit
    from tidewater.errors import TerminalError, ValidationFailedError
    from tidewater.ops import quarantine
    from tidewater.plan.ingest import plan_batch

    # items are item-<key>-<seed>-<i>: batches of seeds 31 and 33 fail the suite
    (home / "strict.json").write_text(
        json.dumps(
            {
                "expectations": [
                    {"type": "expect_column_values_to_not_match_regex", "kwargs": {"column": "item", "regex": "^item-[0-9]+-(?:31|33)-"}}
                ]
            }
        )
    )
    spec = _spec(home, broker, topic, "debezium", validation={"not_null": ["id"], "suite": "strict.json", "on_failure": "quarantine"})
    model = _batch(broker, topic, spec, {}, seed=30)
    assert ingest_inline(spec).status == "committed"
    before = dict(model)
    model = _batch(broker, topic, spec, model, seed=31)
    plan, manifest = stage_inline(spec)
    assert not validate_step(spec, plan, manifest).success
    for _ in range(2):
        with pytest.raises(ValidationFailedError, match=f"quarantined on branch quarantine-{plan.batch_id}"):
            commit_step(spec, plan, manifest)
    table = _table(spec)
    assert _close(_rows(table), before) and committed_state(table).offsets[topic] == plan.end_offsets()[topic]
    with pytest.raises(TerminalError, match=f"batch {plan.batch_id} of change table rpc.prices is quarantined"):
        plan_batch(spec)
    assert quarantine.publish(spec, plan.batch_id)["status"] == "published"
    assert quarantine.publish(spec, plan.batch_id)["status"] == "published"  # again: nothing more
    assert _close(_rows(_table(spec)), model)
    model = _batch(broker, topic, spec, model, seed=32)
    assert ingest_inline(spec).status == "committed"
    assert _close(_rows(_table(spec)), model)

    kept = dict(model)
    _batch(broker, topic, spec, model, seed=33)
    plan2, manifest2 = stage_inline(spec)
    validate_step(spec, plan2, manifest2)
    with pytest.raises(ValidationFailedError):
        commit_step(spec, plan2, manifest2)
    assert quarantine.drop(spec, plan2.batch_id)["status"] == "dropped"
    assert _close(_rows(_table(spec)), kept) and not plan_batch(spec)[0].ranges
    assert quarantine.list_quarantined(spec, _table(spec)) == []
    report = audit(spec)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]


def test_publishing_a_quarantined_change_batch_is_refused_once_main_has_moved(broker, home, topic):
    """A quarantined change batch whose table's main changed afterwards (here an outside append) cannot be
    published: its position deletes and order no longer hold. The refusal is terminal, names the batch and what to
    do, and changes nothing."""
    import pyarrow as pa

    from tidewater.errors import TerminalError, ValidationFailedError
    from tidewater.ops import quarantine

    (home / "strict.json").write_text(
        json.dumps(
            {
                "expectations": [
                    {"type": "expect_column_values_to_not_match_regex", "kwargs": {"column": "item", "regex": "^item-[0-9]+-41-"}}
                ]
            }
        )
    )
    spec = _spec(home, broker, topic, "debezium", validation={"not_null": ["id"], "suite": "strict.json", "on_failure": "quarantine"})
    _batch(broker, topic, spec, _batch(broker, topic, spec, {}, seed=40), seed=41)
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    with pytest.raises(ValidationFailedError):
        commit_step(spec, plan, manifest)
    table = _table(spec)
    table.append(
        pa.Table.from_pylist(
            [{"id": 10_000, "item": "outside", "_op": "c", "_kafka_topic": "x", "_kafka_partition": 0, "_kafka_offset": 0}],
            schema=table.schema().as_arrow(),
        )
    )
    head = _table(spec).current_snapshot().snapshot_id
    with pytest.raises(TerminalError, match=f"moved past quarantined batch {plan.batch_id}.*Drop it, then replay"):
        quarantine.publish(spec, plan.batch_id)
    assert _table(spec).current_snapshot().snapshot_id == head


def _files_of(table) -> set[str]:
    """Every data and delete file any snapshot of ``table`` references."""
    out = set()
    for snap in table.snapshots():
        for m in snap.manifests(table.io):
            out |= {e.data_file.file_path for e in m.fetch_manifest_entry(table.io, discard_deleted=False)}
    return out


def _on_disk(table) -> set[str]:
    root = table.location().removeprefix("file://")
    from pathlib import Path

    return {f"file://{p}" if table.location().startswith("file://") else str(p) for p in Path(root).rglob("*.parquet")}


def test_a_lost_commit_attempt_leaves_none_of_its_files_behind(broker, home, topic, monkeypatch):
    """A change batch and a reapply replay whose first commit attempt loses a conflict (the catalog refuses it as
    it does when another writer committed first: pyiceberg's CommitFailedException, raised here by a stand-in on
    the first attempt of each commit, since two real writers cannot be made to collide on cue). The next attempt
    writes its own position deletes (and, for the replay, its own row images) against the table as it is then; the
    lost attempt's are removed, so every Parquet file under the table is one a snapshot references. The table
    equals the source after each, and the offsets are the batch's."""
    from pyiceberg.exceptions import CommitFailedException

    from tidewater.commit import primitive
    from tidewater.ops.replay import run_replay
    from tidewater.plan.replay import ReplayRequest

    spec = _spec(home, broker, topic, "debezium")
    model = _batch(broker, topic, spec, {}, seed=40, n=120)
    ingest_inline(spec)
    real, lost = primitive.apply_change, []

    def first_attempt_loses(tx, view, change):
        if change.deletes and not lost:
            lost.append(len(change.deletes))
            raise CommitFailedException("stand-in: another writer committed first")
        return real(tx, view, change)

    monkeypatch.setattr(primitive, "apply_change", first_attempt_loses)
    model = _batch(broker, topic, spec, model, seed=41, n=80)
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    assert commit_step(spec, plan, manifest).status == "committed"
    assert lost, "the batch had position deletes, and its first attempt lost"
    table = _table(spec)
    assert _close(_rows(table), model)
    assert committed_state(table).offsets == {topic: {r.partition: r.end for r in plan.ranges}}
    assert _on_disk(table) - _files_of(table) == set(), "a lost attempt's files were left behind"

    lost.clear()  # a replay of partition 0 from its start, mode reapply: its row images are table-dependent
    offsets = committed_state(_table(spec)).offsets
    report = run_replay(
        spec,
        ReplayRequest(topic=topic, partitions=(0,), start_offset=0, end_offset=offsets[topic][0], mode="reapply"),
        inline=True,
        out=None,
    )
    assert report["status"] == "committed" and lost, report
    table = _table(spec)
    assert committed_state(table).offsets == offsets
    assert _close(_rows(table), model)
    assert _on_disk(table) - _files_of(table) == set(), "a lost replay attempt's files were left behind"
