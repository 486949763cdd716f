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
    assert moved == ["t[0] written against 10, now at 12", "t[2] written against None, now at 0",
                     "t[3] written against [7, 8], now at 7"]


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
    plan = BatchPlan(batch_id="b", pipeline="p", table="t", pipeline_path="p.yaml", ranges=(), base_offsets={},
                     created_at="now", mode="append-missing")
    assert plan.mode is Mode.APPEND_MISSING
    doc = plan.to_json()
    assert doc["mode"] == "append-missing" and BatchPlan.from_json(doc) == plan
    with pytest.raises(TerminalError, match="unknown mode 'rewind'"):
        BatchPlan.from_json({**doc, "mode": "rewind"})
