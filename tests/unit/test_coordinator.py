"""The coordinator's pure parts, without a catalog: the offsets guard, the modes (what moves offsets, batch ids, each
table's mode) and ``KINDS``' coverage of every table kind in every mode a batch can be in. The integration and
golden tests hold the same rules against a catalog; these say them in a second."""

from __future__ import annotations

import pytest

from tidewater.batch import BACKFILL_PREFIX, BatchPlan, Mode, PartitionRange, is_ingest_batch, merge_offsets, new_batch_id
from tidewater.commit.batch import KINDS
from tidewater.commit.primitive import OffsetsExpected
from tidewater.errors import TerminalError


def test_the_guard_names_every_partition_whose_offset_moved_and_nothing_else():
    guard = OffsetsExpected({"t": {0: (10,), 1: (5, 5), 2: (None,), 3: (7, 8)}})
    assert guard.moved_from({"t": {0: 10, 1: 5}}) == ["t[3] written against [7, 8], now at None"]
    moved = guard.moved_from({"t": {0: 12, 1: 5, 2: 0, 3: 7}})
    assert moved == ["t[0] written against 10, now at 12", "t[2] written against None, now at 0", "t[3] written against [7, 8], now at 7"]


def test_the_offsets_after_a_batch_continue_each_range_and_keep_the_others():
    base = {"t": {0: 10, 1: 4}, "u": {0: 1}}
    after = merge_offsets(base, (PartitionRange("t", 0, 10, 25), PartitionRange("t", 2, 0, 3)))
    assert after == {"t": {0: 25, 1: 4, 2: 3}, "u": {0: 1}}
    assert base == {"t": {0: 10, 1: 4}, "u": {0: 1}}, "the base is not changed"


def test_only_ingest_and_skip_move_offsets_and_each_mode_has_its_batch_id_prefix():
    assert {m for m in Mode if m.moves_offsets} == {Mode.INGEST, Mode.SKIP}
    for m in Mode:
        bid = m.new_batch_id()
        assert bid.startswith(m.prefix) and is_ingest_batch(bid) == (m is Mode.INGEST), (m, bid)
    assert not is_ingest_batch(BACKFILL_PREFIX + new_batch_id())


def test_a_replay_reapplies_change_tables_and_gives_append_tables_its_mode():
    assert [Mode.REPLACE.for_table(c) for c in (False, True)] == [Mode.REPLACE, Mode.REAPPLY]
    assert [Mode.APPEND_MISSING.for_table(c) for c in (False, True)] == [Mode.APPEND_MISSING, Mode.REAPPLY]
    assert [Mode.REAPPLY.for_table(c) for c in (False, True)] == [Mode.REPLACE, Mode.REAPPLY]
    for m in (Mode.INGEST, Mode.SKIP, Mode.RETRY):
        assert [m.for_table(c) for c in (False, True)] == [m, m]


def test_kinds_commit_every_table_kind_in_every_mode_a_batch_can_be_in():
    reachable = {("change" if c else "append", m.for_table(c)) for m in Mode for c in (False, True)}
    assert reachable == set(KINDS), "no mode without its commit, no commit no mode reaches"


def test_a_plan_knows_its_mode_from_json_and_refuses_an_unknown_one():
    plan = BatchPlan(
        batch_id="b", pipeline="p", table="t", pipeline_path="p.yaml", ranges=(), base_offsets={}, created_at="now", mode="append-missing"
    )
    assert plan.mode is Mode.APPEND_MISSING
    doc = plan.to_json()
    assert doc["mode"] == "append-missing" and BatchPlan.from_json(doc) == plan
    with pytest.raises(TerminalError, match="unknown mode 'rewind'"):
        BatchPlan.from_json({**doc, "mode": "rewind"})


def test_an_attempt_removes_the_files_its_predecessor_wrote_and_keeps_the_batch_s_own(tmp_path):
    """``TargetAttempt.begin``: the files the previous attempt wrote for the table as it then was are removed (that
    attempt did not commit); the batch's own row images stay for every attempt. The table is only its FileIO
    (pyiceberg's local one): removing files needs nothing more."""
    from types import SimpleNamespace

    from pyiceberg.io.pyarrow import PyArrowFileIO

    from tidewater.commit.attempt import TargetAttempt

    table = SimpleNamespace(io=PyArrowFileIO())
    paths = {name: tmp_path / f"{name}.parquet" for name in ("upserts", "a1-deletes", "a1-images")}
    for p in paths.values():
        p.write_bytes(b"x")
    files = {name: SimpleNamespace(file_path=str(p)) for name, p in paths.items()}
    attempt = TargetAttempt(upserts=(files["upserts"],))
    assert attempt.begin(table) == 1
    attempt.written = (files["a1-deletes"], files["a1-images"])
    assert attempt.begin(table) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["upserts.parquet"]
    assert attempt.written == ()
    assert attempt.begin(table) == 3, "an attempt with nothing written starts as well"


def test_an_attempt_keeps_the_offsets_its_change_stamps():
    """``TargetAttempt.stamp`` reads the offsets from the change's snapshot properties, as they will be committed;
    a change without offsets (none of ours) leaves the last stamp."""
    from tidewater.commit.attempt import TargetAttempt
    from tidewater.table.summary import summary_properties

    attempt = TargetAttempt()
    props = summary_properties(offsets={"t": {0: 25, 3: 7}}, batch_id="b", pipeline="p", records=3, valid_through_ms=None, dag_run_id=None)
    attempt.stamp(props)
    assert attempt.stamped == {"t": {0: 25, 3: 7}}
    attempt.stamp({"other": "x"})
    assert attempt.stamped == {"t": {0: 25, 3: 7}}


def test_a_target_s_role_is_asked_of_the_target_set_by_name():
    """A plain pipeline's table holds its offsets, carries the batch's totals, is created by the commit and commits
    without rows; a routed pipeline's tables do none of these (its checkpoint holds the offsets) and, as change
    tables, take one topic each."""
    from tidewater.config.parse import parse_pipeline
    from tidewater.table.targets import target_role

    plain = parse_pipeline({"name": "plain", "topics": ["t"], "kafka": {"bootstrap_servers": "h:1"}, "table": {"identifier": "db.plain"}})
    routed = parse_pipeline(
        {
            "name": "routed",
            "topics": ["t"],
            "kafka": {"bootstrap_servers": "h:1"},
            "table": {"identifier": ""},
            "routing": {"namespace": "ev", "field": "k", "dynamic": True, "table_template": "ev_{value}"},
        }
    )

    def answers(role):
        return (
            role.holds_offsets,
            role.carries_totals,
            role.created_at_commit,
            role.committed_without_rows,
            role.has_own_settings,
            role.keeps_own_offsets,
            role.reached_by_routing,
            role.takes_one_topic,
        )

    assert answers(target_role(plain, "db.plain")) == (True, True, True, True, False, False, False, False)
    assert answers(target_role(routed, "ev.ev_a")) == (False, False, False, False, True, True, True, True)
    assert target_role(routed, routed.targets.holder).holds_offsets, "the checkpoint is the routed pipeline's holder"


def test_a_replay_s_modes_and_its_default_follow_the_pipeline_s_tables():
    """One rule for the CLI's default, the replay form's choices and the plan's check (``PipelineSpec.replay_modes``):
    a change table is reapplied, an append table replaced or completed, a routed pipeline takes all three (its tables
    translate them: ``Mode.for_table``); a mode outside them is refused with the rule in its message."""
    from tidewater.config.parse import parse_pipeline
    from tidewater.errors import ConfigError
    from tidewater.plan.replay import ReplayRequest, check_request

    base = {"topics": ["t"], "kafka": {"bootstrap_servers": "h:1"}, "format": {"metadata": "prefixed"}}
    append = parse_pipeline({**base, "name": "a", "table": {"identifier": "db.a"}})
    changes = parse_pipeline({**base, "name": "c", "table": {"identifier": "db.c", "upsert": True, "id_columns": ["id"]}})
    routed = parse_pipeline(
        {
            **base,
            "name": "r",
            "table": {"identifier": ""},
            "routing": {"namespace": "ev", "field": "k", "dynamic": True, "table_template": "ev_{value}"},
        }
    )
    assert append.replay_modes == ("replace", "append-missing")
    assert changes.replay_modes == ("reapply",)
    assert routed.replay_modes == ("replace", "append-missing", "reapply")

    def check(spec, mode):
        check_request(spec, ReplayRequest(topic="t", partitions=(0,), start_offset=0, end_offset=5, mode=mode))

    for spec in (append, changes, routed):
        for mode in spec.replay_modes:
            check(spec, mode)
    with pytest.raises(ConfigError, match="reapply is for change tables"):
        check(append, "reapply")
    with pytest.raises(ConfigError, match="replayed with mode reapply"):
        check(changes, "append-missing")


def test_a_table_a_person_names_is_the_plain_pipeline_s_own_or_any_of_a_routed_one_s():
    """``TargetSet.named`` (``--table`` of maintain, publish and the quarantine commands): a plain pipeline's table is
    implied and naming another is refused; a routed pipeline's name passes as given (the catalog says whether it
    is a target), and ``required`` refuses none."""
    from tidewater.config.targets import TargetSet
    from tidewater.errors import ConfigError

    plain = TargetSet(holder="db.t", fused=True, static=("db.t",))
    routed = TargetSet(holder="ev.p_checkpoints", fused=False, static=("ev.a",))
    assert plain.named(None, "p") == plain.named("db.t", "p") == "db.t"
    with pytest.raises(ConfigError, match="--table: pipeline p writes db.t, not db.u"):
        plain.named("db.u", "p")
    assert routed.named("ev.a", "p") == "ev.a" and routed.named(None, "p") is None
    with pytest.raises(ConfigError, match="--table: required for a routed pipeline"):
        routed.named("", "p", required=True)
