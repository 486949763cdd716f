"""The table's neighbours (issue 33): other tools' maintenance and writes on a pipeline's tables, through the real
broker, catalog and Spark. Every test counts rows against what was produced and checks the offsets.

- Spark's standard maintenance from outside (``rewrite_data_files``, then ``expire_snapshots`` with
  ``retain_last => 1``) would expire every snapshot that carries offsets: the tag ``tidewater-offsets`` keeps the
  newest one in the history, and the pipeline plans on from it.
- The same with pyiceberg's expiry on a routed pipeline's checkpoint and target tables, after another writer's
  overwrite (a delete and an append): the expiry cuts the current history at the delete, and the offsets are
  read from the tagged snapshot, older than the cut.
- A user's ``DELETE`` followed by an expiry: the deleted rows stay deleted, the next batch lands once.
- A rollback past two batches: the offsets are those of the snapshot rolled back to, so the records of the
  rolled-back batches are ingested again, each once; the audit (deep) explains the rolled-back batches.
- The tag removed and the offsets expired anyway: planning refuses, naming the tag.
- ``tidewater recover-offsets`` (``ops/recover.py``): proposals from the ledger and the rows, committed when they
  agree or the operator confirms, refused when nothing can prove them; plain and routed; the audit explains it.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from tests.conftest import ingest_inline, produce_to_partition, write_pipeline
from tests.integration.test_routed_changes import Source, assert_equals_source, database_pipeline
from tidewater.config.parse import load_pipeline
from tidewater.errors import TerminalError
from tidewater.plan.ingest import plan_batch
from tidewater.spark import session as spark_session
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import BATCH_ID, OFFSETS, OFFSETS_TAG, committed_state, summary_dict

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def ev(i: int) -> bytes:
    return json.dumps({"id": i, "v": f"v{i}"}).encode()


def pipeline(home, broker, topic):
    return load_pipeline(
        write_pipeline(
            home,
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            format={"metadata": "prefixed"},
            validation={"not_null": ["id"]},
        )
    )


def ids(spec) -> list[int]:
    table = load_table(load_catalog(spec), spec.table.identifier)
    return sorted(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


def history_carries_offsets(table) -> bool:
    """Whether any snapshot in the current snapshot's history (not the tag's) carries offsets."""
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
    sid = table.metadata.current_snapshot_id
    while sid in by_id:
        if OFFSETS in summary_dict(by_id[sid]):
            return True
        sid = by_id[sid].parent_snapshot_id
    return False


def expire_all_unreferenced(table) -> None:
    """What a platform's nightly expiry does with `retain_last 1`: every snapshot no reference keeps goes."""
    table.maintenance.expire_snapshots().older_than(datetime.now(timezone.utc) + timedelta(days=1)).commit()


def test_spark_compaction_and_expiry_from_outside_leave_the_pipeline_planning_from_its_tag(broker, home, topic):
    """Two batches, then a platform team's Spark maintenance on the table: rewrite_data_files, then expire_snapshots
    with retain_last 1. The current history carries no offsets any more; the tag kept the newest batch's snapshot.
    Expected: the committed offsets are read from the tag, the next batch adds only the new records (every id once),
    and its commit moves the tag to its own snapshot."""
    spec = pipeline(home, broker, topic)
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i) for i in range(30)], partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, [ev(100 + i) for i in range(20)])
    ingest_inline(spec)
    produce_to_partition(broker.bootstrap, topic, 0, [ev(30 + i) for i in range(10)])
    second = ingest_inline(spec)
    spark = spark_session.session(spec, app_name="tidewater-test-other-tools", master="local[2]")
    try:
        ident = f"{spec.catalog.name}.{spec.table.identifier}"
        spark.sql(
            f"CALL {spec.catalog.name}.system.rewrite_data_files(table => '{spec.table.identifier}', options => map('min-input-files','2'))"
        ).collect()
        spark.sql(
            f"CALL {spec.catalog.name}.system.expire_snapshots(table => '{spec.table.identifier}', "
            "older_than => TIMESTAMP '2100-01-01 00:00:00', retain_last => 1)"
        ).collect()
        assert spark.sql(f"SELECT count(*) AS n FROM {ident}").collect()[0]["n"] == 60
    finally:
        spark_session.release_catalog(spark, spec)
        spark.stop()
    table = load_table(load_catalog(spec), spec.table.identifier)
    tagged = table.metadata.snapshot_by_id(table.metadata.refs[OFFSETS_TAG].snapshot_id)
    assert summary_dict(tagged)[BATCH_ID] == second.batch_id
    # all that is left: the compaction's snapshot and, kept by the tag, the one that carries the offsets (its parent)
    assert {s.snapshot_id for s in table.snapshots()} == {table.current_snapshot().snapshot_id, tagged.snapshot_id}
    assert table.current_snapshot().parent_snapshot_id == tagged.snapshot_id
    assert committed_state(table).offsets == {topic: {0: 40, 1: 20}}
    produce_to_partition(broker.bootstrap, topic, 1, [ev(200 + i) for i in range(5)])
    third = ingest_inline(spec)
    assert third.records == 5
    assert ids(spec) == [*range(40), *range(100, 120), *range(200, 205)]
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert committed_state(table).offsets == {topic: {0: 40, 1: 25}}
    assert summary_dict(table.metadata.snapshot_by_id(table.metadata.refs[OFFSETS_TAG].snapshot_id))[BATCH_ID] == third.batch_id


def test_outside_expiry_of_a_routed_pipelines_checkpoint_and_tables_loses_and_repeats_nothing(broker, home, topic):
    """A routed pipeline's checkpoint and change tables after pyiceberg's expiry of every snapshot no reference keeps,
    with an outside compaction-like commit (an overwrite by another writer) on one table first. Expected: the next
    batch plans from the checkpoint's tag, each table dedupes against its own tag's offsets, every table equals its
    source."""
    sources = [Source(f"{topic}-x{i}") for i in range(2)]
    spec = database_pipeline(home, broker, [s.topic for s in sources], name="neighbours")
    for b in range(2):
        for i, s in enumerate(sources):
            s.produce(broker, b, 20, seed=50 + 10 * b + i)
        assert ingest_inline(spec).status == "committed"
    catalog = load_catalog(spec)
    x0 = load_table(catalog, "rpc.src0")
    x0.overwrite(x0.scan().to_arrow())  # another writer rewrites the table's rows as they are (no batch id)
    for ident in (spec.checkpoint_table(), "rpc.src0", "rpc.src1"):
        expire_all_unreferenced(load_table(catalog, ident))
    x0 = load_table(catalog, "rpc.src0")  # the overwrite's append, its history cut at its expired delete; the tag's batch
    assert len(x0.snapshots()) == 2 and not history_carries_offsets(x0)
    assert committed_state(x0).tidewater_snapshot_id == x0.metadata.refs[OFFSETS_TAG].snapshot_id
    before = committed_state(load_table(catalog, spec.checkpoint_table())).offsets
    for i, s in enumerate(sources):
        s.produce(broker, 2, 15, seed=80 + i)
    plan, _ = plan_batch(spec)
    assert plan.base_offsets == before
    assert ingest_inline(spec).status == "committed"
    for i, s in enumerate(sources):
        assert_equals_source(spec, f"rpc.src{i}", s)
    _, path = plan_batch(spec)
    assert path is None  # the checkpoint reached the end of every partition: nothing left, nothing read twice


def test_a_users_delete_then_an_expiry_keep_the_deleted_rows_deleted_and_the_next_batch_lands_once(broker, home, topic):
    """A user deletes rows (DELETE through pyiceberg), then every unreferenced snapshot is expired. Expected: the
    deleted rows stay deleted (they are not ingested again: their offsets are committed), the next batch lands once,
    and the offsets move only over the new records."""
    spec = pipeline(home, broker, topic)
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i) for i in range(20)], partitions=1)
    ingest_inline(spec)
    table = load_table(load_catalog(spec), spec.table.identifier)
    table.delete("id < 5")
    expire_all_unreferenced(load_table(load_catalog(spec), spec.table.identifier))
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert len(table.snapshots()) == 2 and history_carries_offsets(table)  # the delete, and the tagged batch
    produce_to_partition(broker.bootstrap, topic, 0, [ev(20 + i) for i in range(6)])
    assert ingest_inline(spec).records == 6
    assert ids(spec) == list(range(5, 26))
    assert committed_state(load_table(load_catalog(spec), spec.table.identifier)).offsets == {topic: {0: 26}}


def test_a_rollback_past_two_batches_ingests_their_records_again_once(broker, home, topic):
    """Three batches, then another tool rolls the table back to the first batch's snapshot. Expected: the offsets are
    the first batch's (the tag, which still points at the third batch, is not used while the history carries
    offsets), so the next batch reads the records of batches two and three again: every record once."""
    spec = pipeline(home, broker, topic)
    snaps = []
    for b in range(3):
        produce_to_partition(broker.bootstrap, topic, 0, [ev(10 * b + i) for i in range(10)], partitions=1)
        snaps.append(ingest_inline(spec).snapshot_id)
    table = load_table(load_catalog(spec), spec.table.identifier)
    table.manage_snapshots().rollback_to_snapshot(snaps[0]).commit()
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert committed_state(table).offsets == {topic: {0: 10}} and ids(spec) == list(range(10))
    again = ingest_inline(spec)
    assert again.records == 20
    assert ids(spec) == list(range(30))
    assert committed_state(load_table(load_catalog(spec), spec.table.identifier)).offsets == {topic: {0: 30}}
    from tidewater.audit.pipeline import audit  # the rolled-back batches are explained, not counted twice

    report = audit(spec, deep=True)
    assert report.clean, [f.text() for f in report.findings]
    assert sum("rolled back by another tool" in f.message for f in report.findings) == 2


def test_with_the_tag_removed_and_the_offsets_expired_planning_refuses_naming_the_tag(broker, home, topic):
    """Another tool removes the tag, then expires every unreferenced snapshot after an outside overwrite: nothing
    carries the offsets. Expected: planning refuses (terminal) and the error names the tag; nothing is read again."""
    spec = pipeline(home, broker, topic)
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i) for i in range(10)], partitions=1)
    ingest_inline(spec)
    table = load_table(load_catalog(spec), spec.table.identifier)
    table.manage_snapshots().remove_tag(OFFSETS_TAG).commit()
    table = load_table(load_catalog(spec), spec.table.identifier)
    table.overwrite(table.scan().to_arrow())
    expire_all_unreferenced(load_table(load_catalog(spec), spec.table.identifier))
    with pytest.raises(
        TerminalError, match=f"committed offsets are unreadable.*the tag {OFFSETS_TAG} that keeps the newest one is missing"
    ):
        plan_batch(spec)
    assert ids(spec) == list(range(10))


def lose_offsets(spec, ident: str) -> None:
    """What it takes to lose a table's offsets despite the tag: the tag removed, an outside overwrite, an expiry."""
    catalog = load_catalog(spec)
    load_table(catalog, ident).manage_snapshots().remove_tag(OFFSETS_TAG).commit()
    table = load_table(catalog, ident)
    table.overwrite(table.scan().to_arrow())
    expire_all_unreferenced(load_table(catalog, ident))


def test_recover_offsets_commits_what_the_ledger_and_the_rows_agree_on_and_the_audit_explains_it(broker, home, topic, capsys):
    """Two batches, then the offsets are lost (tag removed, outside overwrite, expiry): planning refuses. A dry run
    shows the ledger's and the rows' offsets and changes nothing. The recovery commits them (they agree); the next
    batch adds only new records (every id once), and the audit explains the recovery."""
    from tidewater.audit.pipeline import audit
    from tidewater.ops.recover import recover

    spec = pipeline(home, broker, topic)
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i) for i in range(12)], partitions=2)
    produce_to_partition(broker.bootstrap, topic, 1, [ev(100 + i) for i in range(6)])
    ingest_inline(spec)
    produce_to_partition(broker.bootstrap, topic, 0, [ev(12 + i) for i in range(4)])
    ingest_inline(spec)
    lose_offsets(spec, spec.table.identifier)
    with pytest.raises(TerminalError, match="committed offsets are unreadable"):
        plan_batch(spec)
    from tidewater.runtime.cli import main

    capsys.readouterr()
    assert main(["recover-offsets", "--pipeline", str(spec.source_path), "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert "the ledger and the rows agree" in shown and "dry run: nothing committed" in shown
    dry = recover(spec, "ops", dry_run=True)
    assert dry["status"] == "dry-run" and [t["agree"] for t in dry["tables"]] == [True]
    assert dry["tables"][0]["ledger"] == dry["tables"][0]["rows"] == {topic: {"0": 16, "1": 6}}
    with pytest.raises(TerminalError):
        plan_batch(spec)  # the dry run changed nothing
    done = recover(spec, "ops")
    assert done["status"] == "committed"
    assert recover(spec, "ops")["status"] == "nothing-to-recover"
    table = load_table(load_catalog(spec), spec.table.identifier)
    assert committed_state(table).offsets == {topic: {0: 16, 1: 6}}
    produce_to_partition(broker.bootstrap, topic, 1, [ev(200 + i) for i in range(3)])
    assert ingest_inline(spec).records == 3
    assert ids(spec) == [*range(16), *range(100, 106), *range(200, 203)]
    report = audit(spec)  # the overwrite that lost the offsets is reported as a write outside Tidewater, nothing else
    assert [f.check for f in report.findings if f.severity == "error"] == ["outside-write"], [f.text() for f in report.findings]
    assert any(f.severity == "explained" and "recovered by ops" in f.message for f in report.findings)


def test_recover_offsets_refuses_when_the_rows_lost_their_tail_until_the_operator_confirms(broker, home, topic):
    """The last batch's rows were deleted before the offsets were lost: the rows end before the ledger's last range.
    Expected: the recovery refuses (nothing committed, planning still refuses); confirmed by the operator, it commits
    the ledger's offsets, and the deleted rows are not read again."""
    from tidewater.ops.recover import recover

    spec = pipeline(home, broker, topic)
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i) for i in range(10)], partitions=1)
    ingest_inline(spec)
    produce_to_partition(broker.bootstrap, topic, 0, [ev(10 + i) for i in range(5)])
    ingest_inline(spec)
    load_table(load_catalog(spec), spec.table.identifier).delete("id >= 10")
    lose_offsets(spec, spec.table.identifier)
    refused = recover(spec, "ops")
    assert refused["status"] == "refused" and "has no rows in the table" in refused["tables"][0]["disagreements"][0]
    with pytest.raises(TerminalError):
        plan_batch(spec)
    assert recover(spec, "ops", confirmed=True)["status"] == "committed"
    assert committed_state(load_table(load_catalog(spec), spec.table.identifier)).offsets == {topic: {0: 15}}
    _, path = plan_batch(spec)
    assert path is None and ids(spec) == list(range(10))


def test_recover_offsets_without_a_ledger_or_metadata_columns_cannot_prove_anything_and_changes_nothing(broker, home, topic):
    """A table without metadata columns whose ledger was dropped: the recovery says it cannot prove the offsets
    (naming the table and the ledger) and changes nothing."""
    from tidewater.errors import ConfigError
    from tidewater.ops.recover import recover

    spec = load_pipeline(
        write_pipeline(
            home,
            topics=[topic],
            kafka={"bootstrap_servers": broker.bootstrap},
            format={"metadata": "none"},
            validation={"not_null": ["id"]},
        )
    )
    produce_to_partition(broker.bootstrap, topic, 0, [ev(i) for i in range(6)], partitions=1)
    ingest_inline(spec)
    load_catalog(spec).drop_table(spec.ledger_table())
    lose_offsets(spec, spec.table.identifier)
    before = load_table(load_catalog(spec), spec.table.identifier).metadata.snapshots
    with pytest.raises(ConfigError, match=f"{spec.table.identifier}: its offsets cannot be proven.*nothing was changed"):
        recover(spec, "ops")
    assert load_table(load_catalog(spec), spec.table.identifier).metadata.snapshots == before


def test_recover_offsets_of_a_routed_pipelines_checkpoint_and_table(broker, home, topic):
    """A routed pipeline's checkpoint and one of its change tables lose their offsets. Expected: one proposal per
    stuck table (the checkpoint's rows evidence is all its tables' rows), committed when they agree; the next batch
    then applies only new changes: every table equals its source, nothing is left to read."""
    from tidewater.ops.recover import recover

    sources = [Source(f"{topic}-y{i}") for i in range(2)]
    spec = database_pipeline(home, broker, [s.topic for s in sources], name="lost", format={"value": "debezium", "metadata": "prefixed"})
    for b in range(2):
        for i, s in enumerate(sources):
            s.produce(broker, b, 20, seed=60 + 10 * b + i)
        ingest_inline(spec)
    for ident in (spec.checkpoint_table(), "rpc.src0"):
        lose_offsets(spec, ident)
    with pytest.raises(TerminalError):
        plan_batch(spec)
    done = recover(spec, "ops")
    assert done["status"] == "committed", done
    assert [t["table"] for t in done["tables"]] == ["rpc.src0", spec.checkpoint_table()]
    for i, s in enumerate(sources):
        s.produce(broker, 2, 10, seed=90 + i)
    assert ingest_inline(spec).status == "committed"
    for i, s in enumerate(sources):
        assert_equals_source(spec, f"rpc.src{i}", s)
    _, path = plan_batch(spec)
    assert path is None
