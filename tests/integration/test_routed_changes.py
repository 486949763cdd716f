"""Change streams of a whole database in one routed pipeline (issue 24): one Debezium topic per source table,
one change table per topic, through the real broker, the task code, the quality gate and the catalog. After
every batch each table equals a reference model of its source table (each key once, values equal, deleted keys
absent), and the accounting adds up per table and for the pipeline."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from tests.conftest import produce_to_partition, registered_avro, stage_inline, write_pipeline
from tidewater.audit.pipeline import audit
from tidewater.commit import batch as committing
from tidewater.config.parse import load_pipeline
from tidewater.errors import TransientError
from tidewater.plan.ingest import plan_batch
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.steps.write import run_write_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import CHANGES, DEAD_LETTERS, RECORDS, SKIPPED, committed_state
from tidewater_dev.changes import apply, change_stream, encode

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 2


def database_pipeline(home, broker, topics: list[str], truncate: dict[int, str] | None = None, name: str = "inventory", **more):
    """One pipeline over the topics of a database's tables: `rpc.src<i>` applies the changes of topic i (``truncate``:
    table index -> its `table.truncate`)."""
    tables = [
        {
            "identifier": f"rpc.src{i}",
            "topics": [t],
            "id_columns": ["id"],
            "upsert": True,
            **({"truncate": truncate[i]} if truncate and i in truncate else {}),
        }
        for i, t in enumerate(topics)
    ]
    settings = {"format": {"value": "debezium"}, "validation": {"not_null": ["id"]}, **more}
    return load_pipeline(
        write_pipeline(
            home,
            name=name,
            topics=topics,
            kafka={"bootstrap_servers": broker.bootstrap},
            table={"identifier": ""},
            tables=tables,
            routing={"namespace": "rpc"},
            **settings,
        )
    )


class Source:
    """One source table: its reference model, and its changes encoded as Debezium JSON. From ``note_from`` on,
    the source table has a new column `note` (every row image written from then carries it)."""

    def __init__(self, topic: str, note_from: int | None = None, key_style: str | None = None, source: dict | None = None) -> None:
        self.topic, self.note_from, self.key_style, self.source = topic, note_from, key_style, source
        self.model: dict[int, dict] = {}
        self.records = 0

    def produce(self, broker, batch: int, n: int, seed: int, snapshot: bool = False, truncate: str | None = None) -> int:
        """``n`` generated changes (snapshot reads `r` instead of creates with ``snapshot``; with ``truncate``, a
        truncate of the source table first, which the table applies or dead-letters: `apply`, `dead_letter`);
        returns records sent."""
        changes = change_stream(self.model, n, keys=12, seed=seed)
        noted = self.note_from is not None and batch >= self.note_from
        by_part: dict[int, list] = defaultdict(list)
        keys: dict[int, list] = defaultdict(list)
        if truncate:
            by_part[0].append(json.dumps({"before": None, "after": None, "op": "t", "source": {"table": "t"}}).encode())
            keys[0].append(None)
            if truncate == "apply":
                self.model = {}
        for key, value in encode(changes, self.model, "debezium"):
            keys[key % PARTITIONS].append(message_key(key, self.key_style))
            if value is not None:
                env = json.loads(value)
                if snapshot and env["op"] == "c":
                    env["op"] = "r"
                if noted and env["after"] is not None:
                    env["after"]["note"] = f"{env['after']['item']}/note"
                if self.source is not None:  # the envelope's source block names the source table
                    env["source"] = self.source
                value = json.dumps(env).encode()
            by_part[key % PARTITIONS].append(value)
        for p, values in sorted(by_part.items()):
            produce_to_partition(broker.bootstrap, self.topic, p, values, partitions=PARTITIONS, keys=keys[p] if self.key_style else None)
        self.model = apply(self.model, changes)
        if noted:  # rows written before the column existed have none
            last = {c.id: c for c in changes}  # each key's last image in this batch
            for k, c in last.items():
                if c.op != "delete":
                    self.model[k] = {**self.model[k], "note": f"{c.item}/note"}
        sent = sum(len(v) for v in by_part.values())
        self.records += sent
        return sent


def message_key(key: int, style: str | None) -> bytes | None:
    """Debezium's message key for a row of key ``key``: JSON with its schema (`schema`), without (`plain`), or
    none (`none`: a source table without a primary key)."""
    if style == "schema":
        schema = {"type": "struct", "optional": False, "name": "inv.Key", "fields": [{"field": "id", "type": "int64", "optional": False}]}
        return json.dumps({"schema": schema, "payload": {"id": key}}).encode()
    return json.dumps({"id": key}).encode() if style == "plain" else None


def table_rows(spec, ident: str, branch: str | None = None) -> dict[int, dict]:
    table = load_table(load_catalog(spec), ident)
    cols = [c for c in ("id", "item", "price", "note") if c in table.schema().column_names]
    head = table.snapshot_by_name(branch) if branch else table.current_snapshot()
    rows = table.scan(selected_fields=tuple(cols), snapshot_id=head.snapshot_id).to_arrow().to_pylist() if head else []
    out = {r["id"]: r for r in rows}
    assert len(out) == len(rows), f"{ident}: a key is in the table twice"
    return out


def assert_equals_source(spec, ident: str, source: Source, branch: str | None = None) -> None:
    import numpy as np

    got = table_rows(spec, ident, branch)
    assert got.keys() == source.model.keys(), f"{ident}: keys differ from the source"
    for k, want in source.model.items():
        row = got[k]
        assert row["item"] == want["item"], (ident, k)
        assert np.float32(row["price"] or 0) == np.float32(want["price"] or 0), (ident, k)
        assert row.get("note") == want.get("note"), (ident, k)


def test_twenty_source_tables_in_one_pipeline_equal_their_sources_after_every_batch(broker, home, topic):
    """20 source tables, 3 batches: a snapshot (`r` reads) of every table, then creates, updates, deletes with
    tombstones, re-inserts, a column added to 3 source tables in the second batch, and in the third a truncate of
    two source tables: one table applies it (`table.truncate: apply`: its earlier rows are gone), the other keeps
    the default (the truncate is a dead letter naming the setting; its rows stay). After every batch each table
    equals its source; each table's snapshot carries its own counts (inserted + updated + deleted + no-op +
    truncated + superseded = its change records), the checkpoint's accounting adds up (tombstones skipped, the
    refused truncate dead-lettered), every table's offsets and the checkpoint's are the topics' ends, and the
    audit finds the pipeline clean. The second batch is written through spark-submit, as the DAG writes."""
    sources = [Source(f"{topic}-s{i}", note_from=1 if i < 3 else None) for i in range(20)]
    spec = database_pipeline(home, broker, [s.topic for s in sources], truncate={5: "apply"})
    truncating = {5: "apply", 6: "dead_letter"}
    for b in range(3):
        sent = sum(
            s.produce(broker, b, 20, seed=100 * b + i, snapshot=b == 0, truncate=truncating.get(i) if b == 2 else None)
            for i, s in enumerate(sources)
        )
        if b == 1:  # as the DAG writes: spark-submit (the others run the same task code in this process)
            plan, path = plan_batch(spec)
            manifest = run_write_step(spec, path, master="local[2]")
        else:
            plan, manifest = stage_inline(spec)
        validate_step(spec, plan, manifest)
        result = commit_step(spec, plan, manifest)
        assert (result.status, result.records) == ("committed", sent)
        catalog = load_catalog(spec)
        checkpoint = load_table(catalog, spec.checkpoint_table()).current_snapshot().summary.additional_properties
        routed = 0
        for i, s in enumerate(sources):
            ident = f"rpc.src{i}"
            assert_equals_source(spec, ident, s)
            table = load_table(catalog, ident)
            props = table.current_snapshot().summary.additional_properties
            counts = json.loads(props[CHANGES])
            effects = ("inserted", "updated", "deleted", "noop", "truncated", "superseded")
            assert sum(counts.get(k, 0) for k in effects) == int(props[RECORDS])
            assert counts.get("truncated", 0) == (1 if b == 2 and i == 5 else 0)
            assert counts["cross_partition_keys"] == 0
            routed += int(props[RECORDS])
            assert committed_state(table).offsets[s.topic] == committed_state(load_table(catalog, spec.checkpoint_table())).offsets[s.topic]
        assert int(checkpoint[RECORDS]) == sent == routed + int(checkpoint[SKIPPED]) + int(checkpoint[DEAD_LETTERS])
        assert int(checkpoint[DEAD_LETTERS]) == (1 if b == 2 else 0) and int(checkpoint[SKIPPED]) > 0  # tombstones
    letters = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().to_pylist()
    assert [(d["topic"], d["error_class"]) for d in letters] == [(sources[6].topic, "Truncate")]
    assert "table.truncate: apply" in letters[0]["error_message"]
    assert {f"rpc.src{i}" for i in range(3)} == {
        f"rpc.src{i}" for i in range(20) if "note" in load_table(load_catalog(spec), f"rpc.src{i}").schema().column_names
    }
    report = audit(spec)
    assert report.clean, [f.text() for f in report.findings]
    # deep: the change tables' superseded changes have no row of their own (each key once instead), said so
    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings if f.severity == "error"]
    assert [f.message for f in report.findings if f.check == "deep" and f.severity == "info"] == [
        "offsets read for change tables are not checked one by one (a key keeps one row): " + ", ".join(sorted(s.topic for s in sources))
    ]
    table = load_table(load_catalog(spec), "rpc.src3")
    table.append(table.scan(limit=1).to_arrow())  # a key twice, by another writer
    report = audit(spec, deep=True)
    assert sorted((f.table, f.message.split(" has ")[-1]) for f in report.findings if f.check == "deep" and f.severity == "error") == [
        ("rpc.src3", "2 rows"),
        ("rpc.src3", "offsets in the table twice"),
    ]


def test_a_crash_between_two_tables_commits_applies_each_change_once(broker, catalog, home, topic, monkeypatch):
    """The commit step dies after the first of three change tables committed its row delta. (1) Airflow's retry
    of the commit step applies the other two and the checkpoint; the first table is not changed again. (2) The
    same crash on the next batch, whose staged files are then lost: a new plan from the checkpoint re-reads the
    range, the writer drops the changes the first table already applied, and every table equals its source. The
    one-by-one commit on every catalog (``multi_table_commit: never``: on REST a routed batch otherwise commits in one
    transaction, tests/integration/test_rest_catalog.py)."""
    sources = [Source(f"{topic}-s{i}") for i in range(3)]
    spec = database_pipeline(home, broker, [s.topic for s in sources], catalog={"multi_table_commit": "never"})
    real = committing.commit_table_output
    calls: list[str] = []

    def die_after_first(catalog, plan, out, *a, **kw):
        if calls:
            raise TransientError("simulated crash between table commits")
        calls.append(out.table)
        return real(catalog, plan, out, *a, **kw)

    def crash(seed: int):
        for i, s in enumerate(sources):
            s.produce(broker, 0, 30, seed=seed + i)
        calls.clear()
        monkeypatch.setattr(committing, "commit_table_output", die_after_first)
        plan, manifest = stage_inline(spec)
        validate_step(spec, plan, manifest)
        with pytest.raises(TransientError):
            commit_step(spec, plan, manifest)
        monkeypatch.setattr(committing, "commit_table_output", real)
        assert len(calls) == 1
        return plan, manifest

    plan, manifest = crash(seed=1)
    first = calls[0]
    assert_equals_source(spec, first, sources[int(first.removeprefix("rpc.src"))])
    assert commit_step(spec, plan, manifest).status == "committed"  # Airflow's retry
    for i, s in enumerate(sources):
        assert_equals_source(spec, f"rpc.src{i}", s)
    assert len(load_table(load_catalog(spec), first).snapshots()) == 1

    dead_plan, _ = crash(seed=50)  # its staged batch is lost: the next run plans the range anew
    replanned, manifest = stage_inline(spec)
    assert replanned.batch_id != dead_plan.batch_id and replanned.ranges == dead_plan.ranges
    already = {o.table: o.already_committed for o in manifest.outputs}
    assert already[calls[0]] > 0 and sum(already.values()) == already[calls[0]]
    validate_step(spec, replanned, manifest)
    assert commit_step(spec, replanned, manifest).status == "committed"
    catalog = load_catalog(spec)
    ends = {
        s.topic: {p: n for p, n in committed_state(load_table(catalog, spec.checkpoint_table())).offsets[s.topic].items()} for s in sources
    }
    for i, s in enumerate(sources):
        assert_equals_source(spec, f"rpc.src{i}", s)
        assert committed_state(load_table(catalog, f"rpc.src{i}")).offsets[s.topic] == ends[s.topic]
    assert sum(sum(v.values()) for v in ends.values()) == sum(s.records for s in sources)
    assert not plan_batch(spec)[0].ranges  # nothing left to read
    report = audit(spec)
    assert report.clean, [f.text() for f in report.findings]


def database_by_pattern(home, broker, prefix: str, **more):
    """Every topic `<prefix>.<schema>.<table>` to a change table named by the topic's last part."""
    import re

    doc = {
        "name": "bypattern",
        "topics": [],
        "topic_pattern": re.escape(prefix) + r"\..+",
        "kafka": {"bootstrap_servers": broker.bootstrap},
        "table": {"identifier": "", "upsert": True, "id_columns": ["id"]},
        "routing": {"namespace": "rpc", "dynamic": True, "table_template": "{topic[-1]}"},
        "format": {"value": "debezium"},
        "validation": {"not_null": ["id"]},
        **more,
    }
    return load_pipeline(write_pipeline(home, **doc))


def test_a_topic_pattern_routes_each_source_table_to_its_own_change_table(broker, home, topic):
    """A Debezium server's topics picked by a pattern, each applied to the table its name's last part names
    (auto-created with the default id_columns); a table added to the source between batches is picked up, and the
    connector's schema change topic, which the pattern also picks up, is skipped (`format.skip_control_events`)
    and counted. After each batch every table equals its source; the audit is clean."""
    sources = {f"c{i}": Source(f"{topic}.inv.c{i}") for i in range(4)}
    ddl = {"source": {"db": "inv"}, "databaseName": "inv", "ddl": "ALTER TABLE c0 ADD note text", "ts_ms": 1}
    produce_to_partition(broker.bootstrap, f"{topic}.schema_changes", 0, [json.dumps(ddl).encode()] * 2)
    spec = database_by_pattern(home, broker, topic, format={"value": "debezium", "skip_control_events": True})
    for b in range(2):
        if b == 1:
            sources["late"] = Source(f"{topic}.inv.late")
        for i, s in enumerate(sources.values()):
            s.produce(broker, b, 25, seed=7 * b + i)
        plan, manifest = stage_inline(spec)
        validate_step(spec, plan, manifest)
        assert commit_step(spec, plan, manifest).status == "committed"
        for name, s in sources.items():
            assert_equals_source(spec, f"rpc.{name}", s)
        if b == 0:
            ddl_skipped = [p.skipped for p in manifest.partitions if p.topic == f"{topic}.schema_changes"]
            assert ddl_skipped == [2] and manifest.dead_letters == 0
    assert load_table(load_catalog(spec), "rpc.schema_changes") is None
    assert audit(spec).clean


def test_routes_that_mix_appended_rows_and_changes_or_two_topics_in_one_change_table_are_refused(broker, home, topic):
    """(1) A table this pipeline appended rows to, then configured to apply changes: its records are dead letters
    (`TableKindMismatch`) naming the table, and nothing of them lands; the accounting adds up. (2) Two topics whose
    names route to one change table: the commit refuses the batch, naming the table and both topics, before any
    change is applied."""
    from tidewater.errors import TerminalError

    appended = Source(f"{topic}.inv.kinds")
    appended.produce(broker, 0, 10, seed=1)
    as_rows = database_by_pattern(home, broker, topic, table={"identifier": "", "upsert": False})
    plan, manifest = stage_inline(as_rows)
    validate_step(as_rows, plan, manifest)
    commit_step(as_rows, plan, manifest)
    before = load_table(load_catalog(as_rows), "rpc.kinds").scan().to_arrow().num_rows
    sent = appended.produce(broker, 1, 10, seed=2)
    spec = database_by_pattern(home, broker, topic)
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    result = commit_step(spec, plan, manifest)
    assert (result.records, result.dead_letters) == (sent, manifest.dead_letters)
    letters = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().to_pylist()
    kinds = [d for d in letters if d["error_class"] == "TableKindMismatch"]
    assert kinds and "table rpc.kinds holds appended rows" in kinds[0]["error_message"]
    assert len(kinds) + int(manifest.skipped) == sent  # every record refused (tombstones skipped)
    assert load_table(load_catalog(spec), "rpc.kinds").scan().to_arrow().num_rows == before

    twins = [Source(f"{topic}2.{schema}.orders") for schema in ("a", "b")]
    for i, s in enumerate(twins):
        s.produce(broker, 0, 10, seed=20 + i)
    spec = database_by_pattern(home, broker, f"{topic}2", name="twins")
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    with pytest.raises(TerminalError, match=r"change table rpc.orders got changes of 2 topics") as e:
        commit_step(spec, plan, manifest)
    assert all(s.topic in str(e.value) for s in twins)
    orders = load_table(load_catalog(spec), "rpc.orders")
    assert orders is None or orders.current_snapshot() is None


def test_change_tables_on_a_branch_are_published_by_fast_forwarding_main(broker, home, topic):
    """Write-audit-publish: three change tables commit to branch `audit`. After two batches each branch equals its
    source and main holds no row; `tidewater publish --table T` fast-forwards main, which then equals the source;
    a third batch moves the branch on while main stays at the published state until the next publish. A commit
    made to main meanwhile makes the publish refuse (a fast-forward would drop it) and changes nothing."""
    import subprocess
    import sys
    from pathlib import Path

    from tidewater.errors import TerminalError
    from tidewater.ops.publish import publish_branch

    sources = [Source(f"{topic}-s{i}") for i in range(3)]
    tables = [
        {"identifier": f"rpc.src{i}", "topics": [s.topic], "id_columns": ["id"], "upsert": True, "branch": "audit"}
        for i, s in enumerate(sources)
    ]
    path = write_pipeline(
        home,
        name="inventory",
        topics=[s.topic for s in sources],
        table={"identifier": ""},
        kafka={"bootstrap_servers": broker.bootstrap},
        tables=tables,
        routing={"namespace": "rpc"},
        format={"value": "debezium"},
        validation={"not_null": ["id"]},
    )
    spec = load_pipeline(path)

    def batch(seed: int) -> None:
        for i, s in enumerate(sources):
            s.produce(broker, 0, 30, seed=seed + i)
        plan, manifest = stage_inline(spec)
        validate_step(spec, plan, manifest)
        assert commit_step(spec, plan, manifest).status == "committed"

    batch(1)
    batch(2)
    for i, s in enumerate(sources):
        assert_equals_source(spec, f"rpc.src{i}", s, branch="audit")
        assert table_rows(spec, f"rpc.src{i}") == {}
    cli = [str(Path(sys.executable).parent / "tidewater"), "publish", "--pipeline", str(path), "--json"]
    out = subprocess.run([*cli, "--table", "rpc.src0"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["snapshots"] == 2
    for i in (1, 2):
        publish_branch(spec, f"rpc.src{i}")
    published = {i: dict(s.model) for i, s in enumerate(sources)}
    for i, s in enumerate(sources):
        assert_equals_source(spec, f"rpc.src{i}", s)

    batch(3)
    catalog = load_catalog(spec)
    for i, s in enumerate(sources):
        assert_equals_source(spec, f"rpc.src{i}", s, branch="audit")
        assert {k: v["item"] for k, v in table_rows(spec, f"rpc.src{i}").items()} == {k: v["item"] for k, v in published[i].items()}
    assert publish_branch(spec, "rpc.src1")["snapshots"] == 1
    assert_equals_source(spec, "rpc.src1", sources[1])
    report = audit(spec)
    assert report.clean, [f.text() for f in report.findings]

    import pyarrow as pa

    outside = load_table(catalog, "rpc.src2")
    outside.append(
        pa.Table.from_pylist(
            [{"id": 999, "_op": "c", "_kafka_topic": "x", "_kafka_partition": 0, "_kafka_offset": 0}], schema=outside.schema().as_arrow()
        )
    )
    head = load_table(catalog, "rpc.src2").current_snapshot().snapshot_id
    with pytest.raises(TerminalError, match="a fast-forward would drop main's commits"):
        publish_branch(spec, "rpc.src2")
    assert load_table(catalog, "rpc.src2").current_snapshot().snapshot_id == head


def test_id_columns_left_empty_are_taken_from_the_debezium_message_keys(broker, home, topic):
    """`table.upsert` with no `id_columns` on a routed Debezium pipeline: each table takes its records' message key
    fields as its id columns, set as the Iceberg identifier fields when the first batch creates it (keys as JSON
    with their schema, and without); the second batch reads them from the table. Every table equals its source
    after each batch. A source table without a primary key (records without keys) cannot be applied: its records
    are dead letters (`MissingId`) naming the table and the setting, nothing of them lands, the accounting adds up."""
    sources = {"a": Source(f"{topic}.inv.a", key_style="schema"), "b": Source(f"{topic}.inv.b", key_style="plain")}
    nopk = Source(f"{topic}.inv.nopk", key_style="none")
    spec = database_by_pattern(home, broker, topic, table={"identifier": "", "upsert": True})
    assert spec.ids_from_keys
    catalog = load_catalog(spec)
    for b in range(2):
        for i, s in enumerate(sources.values()):
            s.produce(broker, b, 25, seed=3 * b + i)
        refused = nopk.produce(broker, b, 5, seed=90 + b)
        plan, manifest = stage_inline(spec)
        validate_step(spec, plan, manifest)
        result = commit_step(spec, plan, manifest)
        assert result.status == "committed" and result.dead_letters == manifest.dead_letters > 0
        for name, s in sources.items():
            assert_equals_source(spec, f"rpc.{name}", s)
            schema = load_table(catalog, f"rpc.{name}").schema()
            assert [schema.find_column_name(i) for i in schema.identifier_field_ids] == ["id"]
        letters = load_table(catalog, spec.dead_letter_table()).scan().to_arrow().to_pylist()
        assert {d["topic"] for d in letters} == {nopk.topic} and {d["error_class"] for d in letters} == {"MissingId"}
        assert "table rpc.nopk: its id columns come from the message keys" in letters[0]["error_message"]
        assert "set its id_columns" in letters[0]["error_message"]
        tombstones = [p.skipped for p in manifest.partitions if p.topic == nopk.topic]
        assert manifest.dead_letters + sum(tombstones) == refused
    assert load_table(catalog, "rpc.nopk") is None
    report = audit(spec)
    assert report.clean, [f.text() for f in report.findings]


def test_the_envelope_source_block_names_the_table_when_one_topic_carries_several_source_tables(broker, home, topic):
    """Debezium's topic routing can merge source tables into one topic: `table_template:
    "{source.schema}_{source.table}"` applies each record to the table its envelope's source block names (the
    block is read by the router and written nowhere). Two source tables of one topic, two batches: each table equals
    its source; the accounting adds up; the audit is clean."""
    shared = f"{topic}.all"
    sources = {name: Source(shared, source={"db": "shop", "schema": "inv", "table": name}) for name in ("orders", "items")}
    spec = database_by_pattern(
        home, broker, topic, routing={"namespace": "rpc", "dynamic": True, "table_template": "{source.schema}_{source.table}"}
    )
    for b in range(2):
        sent = sum(s.produce(broker, b, 20, seed=5 * b + i) for i, s in enumerate(sources.values()))
        plan, manifest = stage_inline(spec)
        validate_step(spec, plan, manifest)
        result = commit_step(spec, plan, manifest)
        assert (result.status, result.records, result.dead_letters) == ("committed", sent, 0)
        for name, s in sources.items():
            assert_equals_source(spec, f"rpc.inv_{name}", s)
            columns = load_table(load_catalog(spec), f"rpc.inv_{name}").schema().column_names
            assert not [c for c in columns if "source" in c]
    report = audit(spec)
    assert report.clean, [f.text() for f in report.findings]


def test_a_quarantined_table_of_a_routed_batch_waits_for_publish_or_drop_while_the_others_commit(broker, home, topic):
    """validation.on_failure quarantine on a routed pipeline: three change tables and an append table (the history
    of topic 1). A batch whose topic-1 records fail the suite quarantines that topic's two tables (the change table's
    whole row delta, the append table's files, each on branch `quarantine-<batch>` with main's offsets moved on);
    the other tables and the checkpoint commit. The commit step fails naming both tables (again when retried,
    adding nothing); the next batch waits while the change table's batch is undecided. Publishing (the quarantine
    DAG's task, per table) applies it: every table equals its source and the history holds every record once. A
    later quarantined batch is dropped: the change table keeps its source without those changes, planning goes on."""
    from tidewater.errors import TerminalError, ValidationFailedError
    from tidewater.ops import quarantine
    from tidewater.runtime.airflow import quarantine_task
    from tidewater.runtime.decisions import apply_decision
    from tidewater.table.summary import DECIDED_BY

    (home / "strict.json").write_text(
        json.dumps(
            {
                "expectations": [  # items are item-<key>-<seed>-<i>
                    {"type": "expect_column_values_to_not_match_regex", "kwargs": {"column": "item", "regex": "^item-[0-9]+-(?:11|31)-"}}
                ]
            }
        )
    )
    sources = [Source(f"{topic}-s{i}") for i in range(3)]
    tables = [{"identifier": f"rpc.src{i}", "topics": [s.topic], "id_columns": ["id"], "upsert": True} for i, s in enumerate(sources)] + [
        {"identifier": "rpc.hist1", "topics": [sources[1].topic]}
    ]
    path = write_pipeline(
        home,
        name="held",
        topics=[s.topic for s in sources],
        table={"identifier": ""},
        kafka={"bootstrap_servers": broker.bootstrap},
        tables=tables,
        routing={"namespace": "rpc"},
        format={"value": "debezium"},
        validation={"not_null": ["id"], "suite": "strict.json", "on_failure": "quarantine"},
    )
    spec = load_pipeline(path)
    catalog = load_catalog(spec)

    def batch(b: int, quiet: int | None = None) -> tuple:
        """Changes of every source but ``quiet`` (whose deletes would carry images of the refused items)."""
        before = [dict(s.model) for s in sources]
        for i, s in enumerate(sources):
            if i != quiet:
                s.produce(broker, b, 20, seed=10 * b + i)
        plan, manifest = stage_inline(spec)
        validate_step(spec, plan, manifest)
        return plan, manifest, before

    def history() -> int:
        rows = load_table(catalog, "rpc.hist1").scan(selected_fields=("_kafka_partition", "_kafka_offset")).to_arrow()
        assert len(set(zip(*rows.to_pydict().values()))) == rows.num_rows, "a record twice in the history"
        return rows.num_rows

    plan, manifest, _ = batch(0)
    assert commit_step(spec, plan, manifest).status == "committed"
    rows0 = history()
    plan, manifest, before = batch(1)
    for _ in range(2):
        with pytest.raises(ValidationFailedError, match="quarantined on branch .* of rpc.hist1, rpc.src1") as e:
            commit_step(spec, plan, manifest)
    assert "--table T" in str(e.value) and e.value.tables == ("rpc.hist1", "rpc.src1")  # what the decision covers
    for i in (0, 2):
        assert_equals_source(spec, f"rpc.src{i}", sources[i])
    assert table_rows(spec, "rpc.src1") == {k: table_rows(spec, "rpc.src1")[k] for k in before[1]}
    assert set(table_rows(spec, "rpc.src1")) == set(before[1]) and history() == rows0
    assert committed_state(load_table(catalog, "rpc.src1")).offsets[sources[1].topic] == plan.end_offsets()[sources[1].topic]
    assert {(q["table"], q["batch_id"]) for q in quarantine.list_all(spec)} == {("rpc.src1", plan.batch_id), ("rpc.hist1", plan.batch_id)}
    with pytest.raises(TerminalError, match=f"batch {plan.batch_id} of change table rpc.src1 is quarantined.*--table rpc.src1"):
        plan_batch(spec)
    # one decision in Airflow's Required actions publishes the batch on both quarantined tables (runtime/decisions.py)
    decided = apply_decision(
        str(path),
        {"decision": True, "batch_id": plan.batch_id, "tables": list(e.value.tables)},
        {"chosen_options": ["Publish"], "params_input": {"reason": None}, "responded_by_user": {"id": "3", "name": "lin"}},
    )
    assert [(t["table"], t["status"]) for t in decided["tables"]] == [("rpc.hist1", "published"), ("rpc.src1", "published")]
    assert all(
        load_table(catalog, t).current_snapshot().summary.additional_properties[DECIDED_BY] == "lin" for t in ("rpc.hist1", "rpc.src1")
    )
    assert (
        quarantine_task(str(path), {"action": "publish", "batch_id": plan.batch_id, "table": "rpc.src1"})["status"] == "published"
    )  # the form after the decision: done once
    for i, s in enumerate(sources):
        assert_equals_source(spec, f"rpc.src{i}", s)
    published = history()
    assert published > rows0

    plan, manifest, _ = batch(2, quiet=1)
    assert commit_step(spec, plan, manifest).status == "committed"
    kept = dict(sources[1].model)
    plan, manifest, _ = batch(3)
    with pytest.raises(ValidationFailedError):
        commit_step(spec, plan, manifest)
    assert quarantine.drop(quarantine.view_for(spec, "rpc.src1"), plan.batch_id)["status"] == "dropped"
    sources[1].model = kept
    for i, s in enumerate(sources):
        assert_equals_source(spec, f"rpc.src{i}", s)
    assert not plan_batch(spec)[0].ranges  # planning goes on (the append table's waiting batch holds nothing up)
    assert [q["table"] for q in quarantine.list_all(spec)] == ["rpc.hist1"]
    report = audit(spec)
    assert report.clean, [f.text() for f in report.findings]
    assert any("quarantined" in f.text() for f in report.findings if f.table == "rpc.hist1")


def test_debezium_avro_topics_with_avro_keys_evolve_and_name_their_id_columns(broker, home, topic, registry_url):
    """A routed `debezium_avro` pipeline over two topics, keys and values Confluent-framed Avro: the id columns come
    from the key schema (through the registry), and a second value schema version that adds a column evolves that
    table within the batch. After each batch both tables equal their sources. The schemas are registered in the
    session's real registry."""
    from tests.integration.test_changes import VALUE, VALUE2, _envelope
    from tidewater_dev.sample_data import avro_framed

    key_schema = {"type": "record", "name": "Key", "namespace": "pg.public.prices", "fields": [{"name": "id", "type": "int"}]}
    schemas = {1: _envelope(VALUE), 2: _envelope(VALUE2), 3: key_schema}
    ids = {
        **registered_avro(registry_url, f"{topic}-value", {1: schemas[1], 2: schemas[2]}),
        **registered_avro(registry_url, f"{topic}-key", {3: key_schema}),
    }

    def framed(schema_id: int, record: dict) -> bytes:
        return avro_framed([json.dumps(record).encode()], ids[schema_id], schemas[schema_id])[0]

    spec = database_by_pattern(
        home, broker, topic, table={"identifier": "", "upsert": True}, format={"value": "debezium_avro", "registry_url": registry_url}
    )
    models: dict[str, dict[int, dict]] = {"a": {}, "b": {}}
    for b, (name, schema_id) in enumerate([("a", 1), ("b", 1), ("a", 2)]):
        for table, model in models.items():
            sid = schema_id if table == name else 1
            extra = {"currency": "EUR"} if sid == 2 else {}
            by_part: dict[int, tuple[list, list]] = defaultdict(lambda: ([], []))
            for c in change_stream(model, 30, keys=10, seed=10 * b + len(table) + (table == "b")):
                before = model.get(c.id)
                op = {"insert": "c", "update": "u", "delete": "d"}[c.op]
                image = {
                    "before": ({**before, **extra} if before else {"id": c.id, "item": None, "price": None, **extra})
                    if c.op != "insert"
                    else None,
                    "after": None if c.op == "delete" else {**c.row(), **extra},
                    "op": op,
                    "ts_ms": 1,
                }
                keys, values = by_part[c.id % PARTITIONS]
                keys.append(framed(3, {"id": c.id}))
                values.append(framed(sid, image))
                if c.op == "delete":
                    keys.append(framed(3, {"id": c.id}))
                    values.append(None)
                    model.pop(c.id, None)
                else:
                    model[c.id] = {**c.row(), **extra}
            for p, (keys, values) in sorted(by_part.items()):
                produce_to_partition(broker.bootstrap, f"{topic}.inv.{table}", p, values, partitions=PARTITIONS, keys=keys)
        plan, manifest = stage_inline(spec)
        validate_step(spec, plan, manifest)
        assert commit_step(spec, plan, manifest).status == "committed"
        for table, model in models.items():
            got = table_rows(spec, f"rpc.{table}")
            assert {k: v["item"] for k, v in got.items()} == {k: v["item"] for k, v in model.items()}, (b, table)
    catalog = load_catalog(spec)
    for table in models:
        schema = load_table(catalog, f"rpc.{table}").schema()
        assert [schema.find_column_name(i) for i in schema.identifier_field_ids] == ["id"]
    assert "currency" in load_table(catalog, "rpc.a").schema().column_names
    assert "currency" not in load_table(catalog, "rpc.b").schema().column_names


def test_routed_upsert_tables_keyed_by_the_message_key(broker, home, topic):
    """`key_source: message_key` in a routed pipeline: two compacted-style topics of plain JSON values without their
    id, each to its own change table keyed by the message key (a tombstone deletes its key, a record without a key
    is a dead letter `MissingId`), beside an append table fed by a third topic. Two batches, each table against its
    reference model, the accounting adding up. A message-key table that shares its topic with another table is
    refused at validation, by name."""
    from tests.integration.test_changes import _produce_keyed
    from tidewater.errors import ConfigError

    keyed = [f"{topic}-k{i}" for i in range(2)]
    plain = f"{topic}-events"
    tables = [
        {"identifier": f"rpc.kv{i}", "topics": [t], "id_columns": ["id"], "upsert": True, "key_source": "message_key"}
        for i, t in enumerate(keyed)
    ] + [{"identifier": "rpc.events", "topics": [plain]}]
    doc = dict(
        name="keyed",
        topics=[*keyed, plain],
        kafka={"bootstrap_servers": broker.bootstrap},
        table={"identifier": ""},
        tables=tables,
        routing={"namespace": "rpc"},
        validation={"not_null": []},
    )
    spec = load_pipeline(write_pipeline(home, **doc))
    models: list[dict[int, dict]] = [{}, {}]
    events = 0
    for b in range(2):
        sent = 0
        for i, t in enumerate(keyed):
            changes = change_stream(models[i], 40, keys=12, seed=20 * b + i)
            records = [
                (
                    json.dumps({"id": c.id}).encode(),
                    None if c.op == "delete" else json.dumps({"item": c.item, "price": c.price}).encode(),
                    c.id,
                )
                for c in changes
            ]
            records.append((None, json.dumps({"item": "x", "price": 1.0}).encode(), 0))  # no key: a dead letter
            _produce_keyed(broker, t, records)
            models[i] = apply(models[i], changes)
            sent += len(records)
        produce_to_partition(broker.bootstrap, plain, 0, [json.dumps({"id": events + n, "item": "e"}).encode() for n in range(7)])
        events, sent = events + 7, sent + 7
        plan, manifest = stage_inline(spec)
        validate_step(spec, plan, manifest)
        result = commit_step(spec, plan, manifest)
        assert (result.status, result.records, result.dead_letters) == ("committed", sent, 2)
        for i in range(2):
            got = table_rows(spec, f"rpc.kv{i}")
            assert {k: v["item"] for k, v in got.items()} == {k: v["item"] for k, v in models[i].items()}, (b, i)
        assert load_table(load_catalog(spec), "rpc.events").scan().to_arrow().num_rows == events
    letters = load_table(load_catalog(spec), spec.dead_letter_table()).scan().to_arrow().to_pylist()
    assert {d["error_class"] for d in letters} == {"MissingId"} and len(letters) == 4
    shared = [*tables[:2], {"identifier": "rpc.copy", "topics": [keyed[0]]}, tables[2]]
    with pytest.raises(ConfigError, match=r"tables\[0\].key_source: message_key needs .* \(rpc.copy does\)"):
        load_pipeline(write_pipeline(home, **{**doc, "tables": shared}))
