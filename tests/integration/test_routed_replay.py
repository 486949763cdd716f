"""Replays and backfills of a routed pipeline (issue 24), through the real broker, the task code and the catalog.

One pipeline over two Debezium topics: topic 0 feeds a change table (`rpc.cur0`, the source table's rows) and an
append table (`rpc.hist0`, every change as a row); topic 1 feeds the change table `rpc.cur1`. A replay rewrites
each table the re-read records route to: change tables reapply, append tables replace (or append-missing). The
checks: every change table equals a reference model of its source, the append table holds each record once, no
table's offsets and not the checkpoint's move, and a crash between two tables' commits or a retry after success
applies nothing twice. The timestamp lookup of the backfill is a stand-in (the embedded broker answers 0 to every
lookup, see STACK.md)."""

from __future__ import annotations

import pytest

from tests.conftest import stage_inline, write_pipeline
from tests.integration.test_replay import TimestampLookupStandIn
from tests.integration.test_routed_changes import Source, assert_equals_source, table_rows
from tidewater.commit import batch as committing
from tidewater.config.parse import load_pipeline
from tidewater.errors import ConfigError, TransientError
from tidewater.ops.replay import run_replay
from tidewater.plan.ingest import plan_batch
from tidewater.plan.replay import ReplayRequest
from tidewater.steps.lifecycle import commit_step, validate_step
from tidewater.table.catalog import load_catalog, load_table
from tidewater.table.summary import CHANGES, REPLAY, committed_state, summary_dict

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def history_and_current(home, broker, sources: list[Source]):
    tables = [
        {"identifier": "rpc.cur0", "topics": [sources[0].topic], "id_columns": ["id"], "upsert": True},
        {"identifier": "rpc.hist0", "topics": [sources[0].topic]},
        {"identifier": "rpc.cur1", "topics": [sources[1].topic], "id_columns": ["id"], "upsert": True},
    ]
    return load_pipeline(
        write_pipeline(
            home,
            name="histcur",
            topics=[s.topic for s in sources],
            kafka={"bootstrap_servers": broker.bootstrap},
            table={"identifier": ""},
            tables=tables,
            routing={"namespace": "rpc"},
            format={"value": "debezium"},
            validation={"not_null": ["id"]},
        )
    )


def history(spec) -> list[tuple]:
    """The append table's rows as (partition, offset, id, op), sorted: each record once."""
    rows = (
        load_table(load_catalog(spec), "rpc.hist0")
        .scan(selected_fields=("_kafka_partition", "_kafka_offset", "id", "_op"))
        .to_arrow()
        .to_pylist()
    )
    return sorted((r["_kafka_partition"], r["_kafka_offset"], r["id"], r["_op"]) for r in rows)


def offsets_of(spec) -> dict[str, dict]:
    catalog = load_catalog(spec)
    return {
        ident: committed_state(load_table(catalog, ident)).offsets
        for ident in ("rpc.cur0", "rpc.hist0", "rpc.cur1", spec.checkpoint_table())
    }


def ends(spec, topic: str) -> dict[int, int]:
    return committed_state(load_table(load_catalog(spec), spec.checkpoint_table())).offsets[topic]


def replay(spec, topic: str, end: dict[int, int], spark: bool = False, **kw):
    """A replay of the topic's whole committed range, one partition at a time (offsets differ by partition); the
    write step in this process, or (``spark``) through spark-submit as the replay DAG runs it."""
    out = []
    for p, e in sorted(end.items()):
        out.append(
            run_replay(
                spec,
                ReplayRequest(topic=topic, partitions=(p,), start_offset=0, end_offset=e, **kw),
                out=None,
                inline=not spark,
                master="local[2]" if spark else None,
            )
        )
    return out


def test_a_routed_replay_leaves_healthy_tables_unchanged_and_restores_damaged_ones(broker, home, topic):
    """Two batches, then two tables damaged outside Tidewater (the change table loses keys, the append table loses
    rows). A dry run previews per table and changes nothing. The replay of topic 0 is killed between its two tables'
    commits; Airflow's retry of the commit step finishes it: the change table equals its source again (its lost rows
    restored: the replay reaches the committed offsets), the append table holds every record once. A replay of topic
    1 (a healthy change table) restores no row and leaves its rows as they were; a second replay of topic 0 leaves
    both tables identical; `tables` restricts a replay to the tables named (through spark-submit; the others get no
    snapshot; records routed to none of them are counted as skipped); a table that is not the pipeline's is refused
    by name. No offset moves and no new batch is planned."""
    sources = [Source(f"{topic}-s{i}") for i in range(2)]
    spec = history_and_current(home, broker, sources)
    for b in range(2):
        for i, s in enumerate(sources):
            s.produce(broker, b, 30, seed=10 * b + i)
        plan, manifest = stage_inline(spec)
        validate_step(spec, plan, manifest)
        assert commit_step(spec, plan, manifest).status == "committed"
    kept, offsets = history(spec), offsets_of(spec)
    assert len(kept) == len({(p, o) for p, o, _, _ in kept}) > 0
    catalog = load_catalog(spec)
    lost = sorted(sources[0].model)[:4]
    load_table(catalog, "rpc.cur0").delete(f"id in ({', '.join(map(str, lost))})")
    load_table(catalog, "rpc.hist0").delete("_kafka_partition = 0 and _kafka_offset < 5")
    assert set(table_rows(spec, "rpc.cur0")) == set(sources[0].model) - set(lost) and len(history(spec)) < len(kept)

    end0 = ends(spec, sources[0].topic)
    heads = {t: load_table(catalog, t).current_snapshot().snapshot_id for t in ("rpc.cur0", "rpc.hist0", "rpc.cur1")}
    shown = replay(spec, sources[0].topic, end0, dry_run=True)[0]["preview"]
    assert {(r["table"], r.get("mode", "replace")) for r in shown} == {("rpc.cur0", "reapply"), ("rpc.hist0", "replace")}
    assert {t: load_table(catalog, t).current_snapshot().snapshot_id for t in heads} == heads

    real, calls = committing.commit_table_output, []

    def die_after_first(catalog, plan, out, *a):
        if calls:
            raise TransientError("simulated crash between table commits")
        calls.append(out.table)
        return real(catalog, plan, out, *a)

    committing.commit_table_output = die_after_first
    try:
        with pytest.raises(TransientError):
            replay(spec, sources[0].topic, {0: end0[0]})
    finally:
        committing.commit_table_output = real
    assert len(calls) == 1
    from tidewater.steps.write import load_manifest, load_plan

    staged = max((spec.staging_dir() / spec.name).glob("replay-*/plan.json"), key=lambda p: p.stat().st_mtime)
    plan = load_plan(staged)
    result = commit_step(spec, plan, load_manifest(staged))  # Airflow's retry of the commit step
    assert {t.table: t.status for t in result.tables} == {
        calls[0]: "already-committed",
        ({"rpc.cur0", "rpc.hist0"} - {calls[0]}).pop(): "committed",
    }
    replay(spec, sources[0].topic, {p: e for p, e in end0.items() if p != 0})
    assert_equals_source(spec, "rpc.cur0", sources[0])
    assert history(spec) == kept
    assert offsets_of(spec) == offsets

    before = table_rows(spec, "rpc.cur1")
    for done in replay(spec, sources[1].topic, ends(spec, sources[1].topic)):
        assert done["tables"]["rpc.cur1"]["changes"]["restored"] == 0  # images rewritten as they were
    assert table_rows(spec, "rpc.cur1") == before
    assert_equals_source(spec, "rpc.cur1", sources[1])
    replay(spec, sources[0].topic, end0)  # twice: identical
    assert history(spec) == kept
    assert_equals_source(spec, "rpc.cur0", sources[0])

    head = load_table(catalog, "rpc.cur0").current_snapshot().snapshot_id
    only = replay(spec, sources[0].topic, {0: end0[0]}, spark=True, tables=("rpc.hist0",))[0]  # as the DAG writes
    assert set(only["tables"]) == {"rpc.hist0"} and only["records"] == end0[0]
    assert load_table(catalog, "rpc.cur0").current_snapshot().snapshot_id == head
    skipped = replay(spec, sources[1].topic, {0: 5}, tables=("rpc.hist0",))[0]
    assert (skipped["tables"], skipped["skipped"], skipped["records"]) == ({}, 5, 5)
    with pytest.raises(ConfigError, match="tables: rpc.nope is not a target table of pipeline histcur"):
        replay(spec, sources[0].topic, {0: 1}, tables=("rpc.nope",))
    with pytest.raises(ConfigError, match="end_offset: .* is beyond the committed offset"):
        replay(spec, sources[0].topic, {0: end0[0] + 1})
    assert offsets_of(spec) == offsets and history(spec) == kept
    replays = [summary_dict(s) for s in load_table(catalog, "rpc.cur0").snapshots() if REPLAY in summary_dict(s)]
    assert replays and all(CHANGES in p for p in replays)
    assert not plan_batch(spec)[0].ranges


def test_backfills_of_a_routed_pipeline_reprocess_committed_intervals_and_add_only_missing_records(broker, home, topic):
    """The ingest DAG's plan task for backfill runs of a routed pipeline: an interval its checkpoint recorded is a
    no-op, or with reprocess a replay of exactly those ranges (change tables reapplied, the append table replaced:
    every table as it was); an interval never ingested is mapped to offsets and only the records a table lacks are
    added (the append table gets back the rows it lost, once). Offsets never move."""
    from tests.integration.test_replay import _run_planned
    from tidewater.plan.backfill import plan_backfill
    from tidewater.runtime.airflow import plan_task

    sources = [Source(f"{topic}-s{i}") for i in range(2)]
    spec = history_and_current(home, broker, sources)
    path = str(spec.source_path)
    i1 = ("2024-01-01T00:05:00+00:00", "2024-01-01T00:10:00+00:00")
    for i, s in enumerate(sources):
        s.produce(broker, 0, 30, seed=i)
    planned = plan_task(path, run_type="scheduled", data_interval=i1)
    assert _run_planned(spec, planned)["status"] == "committed"
    kept, offsets = history(spec), offsets_of(spec)
    models = [dict(s.model) for s in sources]
    catalog = load_catalog(spec)
    snaps = len(load_table(catalog, "rpc.cur0").snapshots())

    assert plan_task(path, run_type="backfill", data_interval=i1) is None  # committed: nothing to do
    assert len(load_table(catalog, "rpc.cur0").snapshots()) == snaps
    planned = plan_task(path, run_type="backfill", data_interval=i1, reprocess=True)
    assert planned["mode"] == "replace"
    assert _run_planned(spec, planned)["status"] == "committed"
    assert history(spec) == kept and offsets_of(spec) == offsets
    for i, s in enumerate(sources):
        assert s.model == models[i]
        assert_equals_source(spec, f"rpc.cur{i}", s)
    assert len(load_table(catalog, "rpc.cur0").snapshots()) == snaps + 1

    load_table(catalog, "rpc.hist0").delete("_kafka_partition = 1 and _kafka_offset < 3")  # three rows lost
    end0 = ends(spec, sources[0].topic)
    base = 1_704_067_200_000  # 00:00: one record a minute
    lookup = TimestampLookupStandIn({p: [base + i * 60_000 for i in range(e)] for p, e in end0.items()})
    plan, plan_path = plan_backfill(spec, ("2024-01-01T00:00:00+00:00", "2024-01-01T00:05:00+00:00"), lookup=lookup)
    assert plan.mode == "append-missing" and plan.table == spec.checkpoint_table()
    result = _run_planned(spec, {"batch_id": plan.batch_id, "plan_path": str(plan_path), "table": plan.table})
    assert result["status"] == "committed"
    assert history(spec) == kept and offsets_of(spec) == offsets
    for s in sources:
        assert_equals_source(spec, f"rpc.cur{sources.index(s)}", s)
