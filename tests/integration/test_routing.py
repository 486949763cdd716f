"""Many topics and many tables in one pipeline, through the real broker, writer, gate and committer:
topic-to-table mapping, static routing (fan-out, unmatched records), dynamic routing (names checked,
tables auto-created or refused), and a failure after some tables committed. Every test counts rows
per table, checks each table's offsets and the checkpoint, and the accounting
(records read = records routed + dead letters + skipped)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ingest_inline, produce_to_partition, stage_inline, write_pipeline
from tidewater.audit.pipeline import audit
from tidewater.commit import batch as committing
from tidewater.config.parse import load_pipeline
from tidewater.errors import TransientError
from tidewater.ops.status import status
from tidewater.plan.ingest import plan_batch
from tidewater.steps.lifecycle import commit_step, run_once, validate_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import BATCH_ID, BRANCH_BASE, DEAD_LETTERS, RECORDS, SKIPPED, committed_state

pytestmark = [pytest.mark.integration]


def routed_pipeline(home, broker, topics, **overrides):
    doc = {
        "topics": topics,
        "kafka": {"bootstrap_servers": broker.bootstrap},
        "table": {"identifier": ""},
        "validation": {"not_null": []},
        **overrides,
    }
    doc["routing"] = {"namespace": "rpc", **doc.get("routing", {})}
    return load_pipeline(write_pipeline(home, **doc))


def rows(spec, ident):
    t = load_table(load_catalog(spec), ident)
    return None if t is None else t.scan().to_arrow()


def checkpoint(spec):
    return load_table(load_catalog(spec), spec.checkpoint_table())


def dead_letters(spec):
    t = load_table(load_catalog(spec), spec.dead_letter_table())
    return [] if t is None else t.scan().to_arrow().sort_by("offset").to_pylist()


def assert_accounting(spec, read: int, dead: int, skipped: int) -> None:
    props = checkpoint(spec).current_snapshot().summary.additional_properties
    assert (int(props[RECORDS]), int(props[DEAD_LETTERS]), int(props[SKIPPED])) == (read, dead, skipped)


def ev(i: int, **fields) -> bytes:
    return json.dumps({"id": i, **fields}).encode()


def test_topics_mapped_to_tables(broker, home, topic):
    """Topic A to its own table, topics B and C into one table: rows per table, each table's offsets
    and the checkpoint's; a second batch adds only the new records."""
    a, b, c = topic + "-a", topic + "-b", topic + "-c"
    spec = routed_pipeline(
        home, broker, [a, b, c], tables=[{"identifier": "rpc.a", "topics": [a]}, {"identifier": "rpc.bc", "topics": [b, c]}]
    )
    produce_to_partition(broker.bootstrap, a, 0, [ev(i, src="a") for i in range(10)])
    produce_to_partition(broker.bootstrap, b, 0, [ev(i, src="b") for i in range(7)])
    produce_to_partition(broker.bootstrap, c, 0, [ev(i, src="c") for i in range(5)])
    result = ingest_inline(spec)
    assert (result.status, result.records) == ("committed", 22)
    assert rows(spec, "rpc.a").num_rows == 10 and set(rows(spec, "rpc.a").column("src").to_pylist()) == {"a"}
    assert rows(spec, "rpc.bc").num_rows == 12 and sorted(set(rows(spec, "rpc.bc").column("src").to_pylist())) == ["b", "c"]
    expected = {a: {0: 10}, b: {0: 7}, c: {0: 5}}
    assert committed_state(checkpoint(spec)).offsets == expected
    for ident in ("rpc.a", "rpc.bc"):
        assert committed_state(load_table(load_catalog(spec), ident)).offsets == expected
    assert_accounting(spec, 22, 0, 0)

    produce_to_partition(broker.bootstrap, b, 0, [ev(100 + i, src="b") for i in range(3)])
    assert ingest_inline(spec).records == 3
    assert (rows(spec, "rpc.a").num_rows, rows(spec, "rpc.bc").num_rows) == (10, 15)
    assert committed_state(checkpoint(spec)).offsets == {a: {0: 10}, b: {0: 10}, c: {0: 5}}
    assert checkpoint(spec).scan().to_arrow().num_rows == 2  # one row per batch
    st = status(spec)
    assert st["total_lag"] == 0 and {t["table"] for t in st["tables"]} == {"rpc.a", "rpc.bc"}


def test_static_routing_fans_out_and_counts_unmatched(broker, home, topic):
    """routing.field meta.type: a record goes to every table whose regex fully matches; records with
    another type or without the field are skipped (counted), then, with unmatched: dead_letter, become
    `Unrouted` dead letters."""
    tables = [
        {"identifier": "rpc.payments", "route_regex": "pay.*"},
        {"identifier": "rpc.money", "route_regex": "pay.*|refund"},
        {"identifier": "rpc.refunds", "route_regex": "refund", "partition_by": ["bucket(2, id)"]},
    ]
    spec = routed_pipeline(home, broker, [topic], tables=tables, routing={"field": "meta.type", "unmatched": "skip"})
    kinds = ["pay_in"] * 5 + ["payout"] * 3 + ["refund"] * 4 + ["other", "prepay"]
    values = [ev(i, meta={"type": k}) for i, k in enumerate(kinds)] + [ev(99)]
    produce_to_partition(broker.bootstrap, topic, 0, values)
    result = ingest_inline(spec)
    assert result.records == 15
    assert (rows(spec, "rpc.payments").num_rows, rows(spec, "rpc.money").num_rows, rows(spec, "rpc.refunds").num_rows) == (8, 12, 4)
    assert load_table(load_catalog(spec), "rpc.refunds").spec().fields[0].name == "id_bucket"
    assert_accounting(spec, 15, 0, 3)
    assert dead_letters(spec) == []

    spec = routed_pipeline(home, broker, [topic], tables=tables, routing={"field": "meta.type", "unmatched": "dead_letter"})
    produce_to_partition(broker.bootstrap, topic, 0, [ev(200, meta={"type": "refund"}), ev(201, meta={"type": "?"}), ev(202)])
    assert ingest_inline(spec).records == 3
    assert rows(spec, "rpc.refunds").num_rows == 5 and rows(spec, "rpc.money").num_rows == 13
    dl = dead_letters(spec)
    assert [(d["offset"], d["error_class"]) for d in dl] == [(16, "Unrouted"), (17, "Unrouted")]
    assert "meta.type" in dl[0]["error_message"]
    assert_accounting(spec, 3, 2, 0)
    offsets = {topic: {0: 18}}
    assert committed_state(checkpoint(spec)).offsets == offsets
    assert committed_state(load_table(load_catalog(spec), "rpc.money")).offsets == offsets
    # rpc.payments got nothing from the second batch: no commit, its offsets stay where its rows end
    assert committed_state(load_table(load_catalog(spec), "rpc.payments")).offsets == {topic: {0: 15}}


@pytest.mark.slow
def test_dynamic_routing_through_spark_checks_names_and_creates_tables(broker, home, topic):
    """`tidewater run` (spark-submit, 2 partitions): the tenant field names the table
    (`payments_{value}`); bad names (path tricks, empty, over-long) and records without the field are
    dead letters; a `tables` entry overrides the defaults of one dynamic table; with auto_create off a
    new tenant's records are `UnknownTable` dead letters."""
    overrides = dict(
        routing={"field": "tenant", "dynamic": True, "table_template": "payments_{value}"},
        table={"identifier": "", "properties": {"owner": "payments-team"}},
        tables=[{"identifier": "rpc.payments_acme", "properties": {"owner": "acme"}}],
    )
    spec = routed_pipeline(home, broker, [topic], **overrides)
    p0 = [ev(i, tenant="acme", amount=i) for i in range(40)] + [ev(40, tenant="../etc"), ev(41, tenant="")]
    p1 = [ev(100 + i, tenant="globex", amount=i) for i in range(30)] + [ev(130, tenant="x" * 300), ev(131)]
    produce_to_partition(broker.bootstrap, topic, 0, p0, partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, p1)
    result = run_once(spec.source_path)
    assert result["records"] == 74
    catalog = load_catalog(spec)
    acme, globex = load_table(catalog, "rpc.payments_acme"), load_table(catalog, "rpc.payments_globex")
    assert (acme.scan().to_arrow().num_rows, globex.scan().to_arrow().num_rows) == (40, 30)
    assert (acme.properties["owner"], globex.properties["owner"]) == ("acme", "payments-team")
    dl = dead_letters(spec)
    assert sorted(d["error_class"] for d in dl) == ["InvalidRoute"] * 3 + ["Unrouted"]
    assert any("'../etc'" in d["error_message"] for d in dl)
    assert_accounting(spec, 74, 4, 0)
    assert committed_state(checkpoint(spec)).offsets == {topic: {0: 42, 1: 32}}
    assert committed_state(acme).offsets == {topic: {0: 42, 1: 32}}

    spec = routed_pipeline(home, broker, [topic], **{**overrides, "table": {"identifier": "", "auto_create": False}})
    produce_to_partition(broker.bootstrap, topic, 0, [ev(300, tenant="initech"), ev(301, tenant="acme")])
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (2, 1)
    assert load_table(catalog, "rpc.payments_initech") is None
    assert dead_letters(spec)[-1]["error_class"] == "UnknownTable"
    assert load_table(catalog, "rpc.payments_acme").scan().to_arrow().num_rows == 41


def test_failure_after_some_tables_committed_never_duplicates(broker, home, topic, monkeypatch):
    """The commit step dies after the first of three tables committed. Retrying it commits the other two
    and the checkpoint, the first table is not touched again. Then the same failure on the next batch
    with its staged files lost: a new plan from the checkpoint re-reads the range, the writer drops
    the records the first table already holds, and every table ends with each record once; the audit finds the
    pipeline clean and explains the first table's commit of the batch the checkpoint never committed."""
    tables = [{"identifier": f"rpc.t{i}", "route_regex": f"k{i}|all"} for i in range(3)]
    spec = routed_pipeline(home, broker, [topic], tables=tables, routing={"field": "k"})
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i, k=f"k{i % 3}") for i in range(30)] + [ev(30, k="all")])
    real = committing.commit_table_output
    calls = []

    def die_after_first(catalog, plan, out, *a, **kw):
        if calls:
            raise TransientError("simulated crash between table commits")
        calls.append(out.table)
        return real(catalog, plan, out, *a, **kw)

    monkeypatch.setattr(committing, "commit_table_output", die_after_first)
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    with pytest.raises(TransientError):
        commit_step(spec, plan, manifest)
    assert calls == ["rpc.t0"] and rows(spec, "rpc.t0").num_rows == 11
    assert rows(spec, "rpc.t1") is None or load_table(load_catalog(spec), "rpc.t1").snapshots() == []
    assert checkpoint(spec).snapshots() == []
    monkeypatch.setattr(committing, "commit_table_output", real)
    assert commit_step(spec, plan, manifest).status == "committed"
    assert [rows(spec, f"rpc.t{i}").num_rows for i in range(3)] == [11, 11, 11]
    assert [s.summary.additional_properties[BATCH_ID] for s in load_table(load_catalog(spec), "rpc.t0").snapshots()] == [plan.batch_id]

    # next batch: the crash again, and this time the staged batch is lost (re-planned from the checkpoint)
    produce_to_partition(broker.bootstrap, topic, 0, [ev(100 + i, k=f"k{i % 3}") for i in range(12)])
    calls.clear()
    monkeypatch.setattr(committing, "commit_table_output", die_after_first)
    plan2, manifest2 = stage_inline(spec)
    validate_step(spec, plan2, manifest2)
    with pytest.raises(TransientError):
        commit_step(spec, plan2, manifest2)
    monkeypatch.setattr(committing, "commit_table_output", real)
    replanned, _ = plan_batch(spec)
    assert [(r.start, r.end) for r in replanned.ranges] == [(31, 43)] and replanned.batch_id != plan2.batch_id
    plan3, manifest3 = stage_inline(spec)
    already = {o.table: o.already_committed for o in manifest3.outputs}
    assert already["rpc.t0"] == 4 and already.get("rpc.t1", 0) == 0
    validate_step(spec, plan3, manifest3)
    assert commit_step(spec, plan3, manifest3).status == "committed"
    for i in range(3):
        ids = rows(spec, f"rpc.t{i}").column("id").to_pylist()
        assert len(ids) == len(set(ids)) == 15, f"rpc.t{i}"
        assert committed_state(load_table(load_catalog(spec), f"rpc.t{i}")).offsets == {topic: {0: 43}}
    assert committed_state(checkpoint(spec)).offsets == {topic: {0: 43}}
    assert checkpoint(spec).scan().to_arrow().num_rows == 2
    # the audit: clean; the batch whose checkpoint commit never happened is explained, on the one table it reached
    report = audit(spec)
    assert report.clean and report.batches == 2, [f.text() for f in report.findings]
    assert [(f.check, f.table, f.batch_id) for f in report.findings if f.severity == "explained"] == [("routed", "rpc.t0", plan2.batch_id)]


def test_imported_kafka_connect_configuration_runs_as_is(broker, home, topic):
    """A Kafka Connect Iceberg sink configuration (JDBC catalog, route field and per-table regexes,
    string keys, schemaless JSON, errors.tolerance all) through `tidewater connect-import`: the file it
    writes runs unchanged and lands each record in its table, the bad one as a dead letter."""
    import subprocess
    import sys
    from pathlib import Path

    connector = {
        "name": "orders-sink",
        "config": {
            "connector.class": "org.apache.iceberg.connect.IcebergSinkConnector",
            "topics": topic,
            "tasks.max": "2",
            "iceberg.tables": "shop.created,shop.cancelled",
            "iceberg.tables.route-field": "status",
            "iceberg.table.shop.created.route-regex": "created",
            "iceberg.table.shop.cancelled.route-regex": "cancel+ed",
            "iceberg.tables.default-partition-by": "bucket(id, 2)",
            "iceberg.catalog.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
            "iceberg.catalog.uri": f"jdbc:sqlite:{home}/connect-catalog.db",
            "iceberg.catalog.warehouse": f"file://{home}/connect-warehouse",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter.schemas.enable": "false",
            "errors.tolerance": "all",
            "iceberg.control.commit.interval-ms": "120000",
        },
    }
    src = home / "connector.json"
    src.write_text(json.dumps(connector))
    out = home / "orders_sink.yaml"
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "tidewater"),
            "connect-import",
            str(src),
            "-o",
            str(out),
            "--bootstrap-servers",
            broker.bootstrap,
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    spec = load_pipeline(out)
    assert spec.routed and spec.schedule == "*/2 * * * *" and spec.catalog.properties["type"] == "sql"
    values = [ev(i, status="created") for i in range(6)] + [ev(10 + i, status="cancelled") for i in range(3)] + [b"{oops"]
    produce_to_partition(broker.bootstrap, topic, 0, values)
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (10, 1)
    assert (rows(spec, "shop.created").num_rows, rows(spec, "shop.cancelled").num_rows) == (6, 3)
    assert "_kafka_key" in rows(spec, "shop.created").column_names
    assert load_table(load_catalog(spec), "shop.created").spec().fields[0].name == "id_bucket"
    assert committed_state(checkpoint(spec)).offsets == {topic: {0: 10}}
    assert (home / "connect-catalog.db").is_file()


def test_per_table_id_columns_and_branch(broker, home, topic):
    """Per-table settings: `rpc.audit` commits to branch `audit` (main stays empty, offsets are read from
    the branch), `rpc.orders` has id column `id` (identifier field; a record without it is a MissingId
    dead letter and lands in neither table)."""
    tables = [{"identifier": "rpc.orders", "id_columns": ["id"]}, {"identifier": "rpc.audit", "branch": "audit"}]
    spec = routed_pipeline(home, broker, [topic], tables=tables)
    values = [ev(i, v="a") for i in range(5)] + [json.dumps({"v": "no id"}).encode()]
    produce_to_partition(broker.bootstrap, topic, 0, values)
    result = ingest_inline(spec)
    assert (result.records, result.dead_letters) == (6, 1)
    catalog = load_catalog(spec)
    orders, audit = load_table(catalog, "rpc.orders"), load_table(catalog, "rpc.audit")
    assert [orders.schema().find_field(i).name for i in orders.schema().identifier_field_ids] == ["id"]
    assert orders.schema().find_field("id").required
    assert orders.scan().to_arrow().num_rows == 5
    assert audit.scan().to_arrow().num_rows == 0  # main holds only the empty snapshot a branch needs to start
    assert BRANCH_BASE in audit.current_snapshot().summary.additional_properties
    branch_head = audit.snapshot_by_name("audit")
    assert audit.scan(snapshot_id=branch_head.snapshot_id).to_arrow().num_rows == 5
    assert committed_state(audit, "audit").offsets == {topic: {0: 6}}
    assert [d["error_class"] for d in dead_letters(spec)] == ["MissingId"]
    assert_accounting(spec, 6, 1, 0)

    produce_to_partition(broker.bootstrap, topic, 0, [ev(10 + i, v="b") for i in range(3)])
    assert ingest_inline(spec).records == 3
    audit = load_table(load_catalog(spec), "rpc.audit")
    assert audit.scan(snapshot_id=audit.snapshot_by_name("audit").snapshot_id).to_arrow().num_rows == 8
    assert committed_state(audit, "audit").offsets == {topic: {0: 9}}
    assert load_table(load_catalog(spec), "rpc.orders").scan().to_arrow().num_rows == 8


def test_single_table_pipeline_on_a_branch(broker, home, topic):
    """table.branch on a one-table pipeline: batches go to the branch, offsets come from it, a retried
    commit adds nothing."""
    from tidewater.steps.lifecycle import commit_step

    spec = load_pipeline(
        write_pipeline(
            home,
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            table={"identifier": "rpc.orders", "branch": "ingest"},
            validation={"not_null": ["id"]},
        )
    )
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i) for i in range(4)])
    plan, manifest = stage_inline(spec)
    validate_step(spec, plan, manifest)
    assert [commit_step(spec, plan, manifest).status for _ in range(2)] == ["committed", "already-committed"]
    produce_to_partition(broker.bootstrap, topic, 0, [ev(10 + i) for i in range(2)])
    assert ingest_inline(spec).records == 2
    t = load_table(load_catalog(spec), "rpc.orders")
    assert t.scan().to_arrow().num_rows == 0 and committed_state(t).offsets == {}  # main: the empty base only
    assert t.scan(snapshot_id=t.snapshot_by_name("ingest").snapshot_id).to_arrow().num_rows == 6
    assert committed_state(t, "ingest").offsets == {topic: {0: 6}}


def test_each_table_has_its_own_suite(broker, home, topic):
    """tables[].suite: the gate runs each table's suite on that table's files; a failing one stops the
    batch (nothing committed anywhere, checkpoint unmoved) and the report names the table."""
    from tidewater.errors import ValidationFailedError

    (home / "small.json").write_text(
        json.dumps(
            {"expectations": [{"type": "expect_column_values_to_be_between", "kwargs": {"column": "id", "min_value": 0, "max_value": 9}}]}
        )
    )
    tables = [{"identifier": "rpc.small", "route_regex": "s", "suite": "small.json"}, {"identifier": "rpc.big", "route_regex": "b"}]
    spec = routed_pipeline(home, broker, [topic], tables=tables, routing={"field": "k"})
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i, k="s") for i in range(5)] + [ev(100 + i, k="b") for i in range(5)])
    assert ingest_inline(spec).records == 10
    produce_to_partition(broker.bootstrap, topic, 0, [ev(50, k="s"), ev(500, k="b")])
    plan, manifest = stage_inline(spec)
    with pytest.raises(ValidationFailedError) as e:
        validate_step(spec, plan, manifest)
    assert "expect_column_values_to_be_between(table='rpc.small', column='id'" in str(e.value)
    assert (rows(spec, "rpc.small").num_rows, rows(spec, "rpc.big").num_rows) == (5, 5)
    assert committed_state(checkpoint(spec)).offsets == {topic: {0: 10}}


def test_an_operator_skips_a_blocking_record_of_a_routed_pipeline(broker, home, topic):
    """dead_letter.policy fail and a poison record at offset 6 of topic A (topics A and B to their own tables): the
    skip (the skip DAG's task) ingests A's records before it as a batch of their own, dead-letters [6, 7) as
    `OperatorSkip` with the reason and who asked, and moves the checkpoint past it (its snapshot records the skip;
    no target table gets a commit of the skip). The next batch ingests the rest of both topics; every record is
    in its table once or a dead letter, and the audit explains the skip."""
    from tidewater.errors import BatchWriteError
    from tidewater.ops.skip import SkipRequest, skip
    from tidewater.table.summary import OPERATOR_SKIP

    a, b = topic + "-a", topic + "-b"
    spec = routed_pipeline(
        home,
        broker,
        [a, b],
        dead_letter={"policy": "fail"},
        tables=[{"identifier": "rpc.ta", "topics": [a]}, {"identifier": "rpc.tb", "topics": [b]}],
    )
    produce_to_partition(broker.bootstrap, a, 0, [ev(i) for i in range(6)] + [b'{"id": '] + [ev(i) for i in range(7, 10)])
    produce_to_partition(broker.bootstrap, b, 0, [ev(100 + i) for i in range(4)])
    with pytest.raises(BatchWriteError) as e:
        stage_inline(spec)
    assert (e.value.topic, e.value.offset) == (a, 6)
    assert skip(spec, SkipRequest(a, 0, 6, 7, "bad deploy", "alice", dry_run=True))["status"] == "dry-run"
    assert checkpoint(spec) is None or checkpoint(spec).current_snapshot() is None
    out = skip(spec, SkipRequest(a, 0, 6, 7, "bad deploy 4711", "alice"))
    assert (out["status"], out["ingested_first"], out["dead_letters"]) == ("committed", 6, 1)
    assert committed_state(checkpoint(spec)).offsets[a] == {0: 7}
    props = checkpoint(spec).current_snapshot().summary.additional_properties
    assert json.loads(props[OPERATOR_SKIP])["by"] == "alice"
    assert rows(spec, "rpc.ta").num_rows == 6 and rows(spec, "rpc.tb") is None
    letters = dead_letters(spec)
    assert [(d["offset"], d["error_class"]) for d in letters] == [(6, "OperatorSkip")] and "bad deploy 4711" in letters[0]["error_message"]
    assert ingest_inline(spec).status == "committed"
    assert sorted(rows(spec, "rpc.ta").column("id").to_pylist()) == [0, 1, 2, 3, 4, 5, 7, 8, 9]
    assert sorted(rows(spec, "rpc.tb").column("id").to_pylist()) == [100, 101, 102, 103]
    assert committed_state(checkpoint(spec)).offsets == {a: {0: 10}, b: {0: 4}}
    report = audit(spec)
    assert report.clean, [f.text() for f in report.findings]
    assert any("skipped by alice" in f.text() for f in report.findings)
