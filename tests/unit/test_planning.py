"""The planner is pure: committed offsets + watermarks + cap in, ranges out. No broker needed."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.batch import BatchPlan, PartitionRange
from tidewater.config.parse import parse_pipeline
from tidewater.errors import OffsetGapError
from tidewater.plan.ingest import START_PIN, pinned_starts
from tidewater.plan.planner import allocate, merge_offsets, plan_ranges


@st.composite
def partition_states(draw):
    """Topic-partitions with (log start, end) watermarks and a committed offset inside them (or none)."""
    n_topics = draw(st.integers(1, 3))
    watermarks, committed = {}, {}
    for t in range(n_topics):
        for p in range(draw(st.integers(1, 6))):
            low = draw(st.integers(0, 1_000))
            high = low + draw(st.integers(0, 5_000))
            watermarks[(f"topic{t}", p)] = (low, high)
            c = draw(st.one_of(st.none(), st.integers(low, high)))
            if c is not None:
                committed.setdefault(f"topic{t}", {})[p] = c
    return watermarks, committed


@given(partition_states(), st.integers(1, 20_000))
@settings(max_examples=300, deadline=None)
def test_ranges_start_at_committed_respect_end_and_cap(state, cap):
    watermarks, committed = state
    ranges = plan_ranges(committed, watermarks, cap)
    seen = set()
    for r in ranges:
        key = (r.topic, r.partition)
        assert key not in seen, "one range per partition"
        seen.add(key)
        low, high = watermarks[key]
        expected_start = committed.get(r.topic, {}).get(r.partition, low)
        assert r.start == expected_start, "starts exactly at the committed offset (log start if none)"
        assert r.start < r.end <= high, "non-empty and never beyond the end offset"
    total = sum(r.size for r in ranges)
    backlog = sum(high - committed.get(t, {}).get(p, low) for (t, p), (low, high) in watermarks.items())
    assert total == min(cap, backlog), "uses the cap fully when there is enough backlog"


@given(partition_states(), st.integers(1, 20_000), st.data())
@settings(max_examples=300, deadline=None)
def test_a_start_position_moves_only_partitions_without_committed_offsets_and_stays_in_the_log(state, cap, data):
    """``kafka.start_from``'s offsets (``first``; a time lookup may answer below the log start, after retention, or
    the log end): a partition with committed offsets ignores them; one without starts at them, held within
    [log start, end]; the batch still uses the cap fully."""
    watermarks, committed = state
    first = {tp: data.draw(st.integers(0, 7_000)) for tp in watermarks}
    ranges = {(r.topic, r.partition): r for r in plan_ranges(committed, watermarks, cap, first)}
    starts = {}
    for (t, p), (low, high) in watermarks.items():
        c = committed.get(t, {}).get(p)
        starts[(t, p)] = c if c is not None else min(max(first[(t, p)], low), high)
        if (t, p) in ranges:
            assert ranges[(t, p)].start == starts[(t, p)]
    backlog = sum(high - starts[tp] for tp, (_, high) in watermarks.items())
    assert sum(r.size for r in ranges.values()) == min(cap, backlog)


@given(partition_states(), st.integers(1, 3_000), st.integers(1, 8))
@settings(max_examples=200, deadline=None)
def test_consecutive_batches_are_contiguous_and_non_overlapping(state, cap, batches):
    """Committing each plan and re-planning yields contiguous ranges that never overlap."""
    watermarks, committed = state
    covered: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for _ in range(batches):
        ranges = plan_ranges(committed, watermarks, cap)
        for r in ranges:
            covered.setdefault((r.topic, r.partition), []).append((r.start, r.end))
        committed = merge_offsets(committed, ranges)
    for key, spans in covered.items():
        for (_s1, e1), (s2, _e2) in zip(spans, spans[1:]):
            assert e1 == s2, f"{key}: batch ranges are contiguous"
    # Replaying a fully committed state plans nothing.
    caught_up = {t: {p: high for (tt, p), (_, high) in watermarks.items() if tt == t} for t, _ in watermarks}
    assert plan_ranges(caught_up, watermarks, cap) == []


@given(st.dictionaries(st.tuples(st.just("t"), st.integers(0, 50)), st.integers(0, 10_000), max_size=30), st.integers(0, 50_000))
def test_allocate_is_fair_and_bounded(available, cap):
    grant = allocate(available, cap)
    assert sum(grant.values()) == min(cap, sum(available.values()))
    for tp, g in grant.items():
        assert 0 <= g <= available[tp]
    # fairness: a partition short of its backlog got at least as much as any other partition
    starved = [g for tp, g in grant.items() if g < available[tp]]
    if starved:
        assert min(starved) >= max(grant.values()) - 1


def test_committed_offset_below_log_start_is_a_gap_error_naming_partition_and_gap():
    with pytest.raises(OffsetGapError) as e:
        plan_ranges({"pizzas": {3: 100}}, {("pizzas", 3): (250, 900)}, 1000)
    msg = str(e.value)
    assert "partition=3" in msg and "topic=pizzas" in msg
    assert "100..249" in msg and "150 records" in msg


def test_committed_offset_beyond_end_is_an_error():
    with pytest.raises(OffsetGapError, match="beyond the end offset 40"):
        plan_ranges({"pizzas": {0: 50}}, {("pizzas", 0): (0, 40)}, 1000)


def test_vanished_partition_is_an_error():
    with pytest.raises(OffsetGapError, match="no longer exists"):
        plan_ranges({"pizzas": {0: 5, 7: 9}}, {("pizzas", 0): (0, 40)}, 1000)


def test_a_topic_that_gained_partitions_is_read_from_each_new_partitions_log_start():
    """A topic grown from 2 to 4 partitions since the last batch: the next plan reads the old partitions from their
    committed offsets and each new one from its log start (5 here, where retention already removed 0..4), skips an
    empty new one, and the batch after it continues all four. Planner level: the embedded broker refuses
    CreatePartitions (STACK.md), so a topic cannot grow there; the watermarks are what the plan reads from any broker."""
    committed = {"pizzas": {0: 10, 1: 12}}
    grown = {("pizzas", 0): (0, 20), ("pizzas", 1): (0, 20), ("pizzas", 2): (5, 9), ("pizzas", 3): (0, 0)}
    ranges = plan_ranges(committed, grown, 1000)
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 10, 20), (1, 12, 20), (2, 5, 9)]
    after = merge_offsets(committed, ranges)
    assert after == {"pizzas": {0: 20, 1: 20, 2: 9}}
    more = {**grown, ("pizzas", 2): (5, 15), ("pizzas", 3): (0, 4)}
    assert [(r.partition, r.start, r.end) for r in plan_ranges(after, more, 1000)] == [(2, 9, 15), (3, 0, 4)]


def test_split_and_end_offsets():
    r = PartitionRange("t", 0, 10, 35)
    assert [(s.start, s.end) for s in r.split(10)] == [(10, 20), (20, 30), (30, 35)]
    plan = BatchPlan("b", "p", "ns.t", "/x.yaml", (r,), {"t": {0: 10, 1: 7}, "u": {0: 3}}, "now")
    assert plan.end_offsets() == {"t": {0: 35, 1: 7}, "u": {0: 3}}
    assert BatchPlan.from_json(plan.to_json()) == plan


def test_batch_ids_sort_in_planning_order_within_one_second():
    """The plan step finds abandoned batches as the staged ones after the newest committed batch id: ids of
    batches planned within one second must still sort in planning order (whole-second ids sorted by their
    random suffix, so a batch planned right after a commit could be missed)."""
    from datetime import datetime, timedelta, timezone

    from tidewater.batch import new_batch_id

    t = datetime(2026, 11, 23, 0, 38, 53, 4000, tzinfo=timezone.utc)
    for _ in range(200):
        assert new_batch_id(t) < new_batch_id(t + timedelta(milliseconds=1)) < new_batch_id(t + timedelta(seconds=1))


def test_latest_pins_each_topic_at_its_log_end_once_and_later_plans_start_there(tmp_path, monkeypatch):
    """``kafka.start_from: latest`` (``plan.ingest.pinned_starts``, on a local staging area): the first plan pins each
    partition at its log end in ``<staging>/<pipeline>/start-offsets.json``; later plans, with the log ends moved on,
    start there (nothing produced in between is skipped); a partition the topic gained since starts at its log start;
    a topic first seen later is pinned at its log end then; a topic the table already holds offsets of is not pinned
    (its new partition starts at its log start)."""
    monkeypatch.setenv("TIDEWATER_HOME", str(tmp_path))
    spec = parse_pipeline(
        {
            "name": "orders",
            "topics": ["a", "b", "c"],
            "kafka": {"bootstrap_servers": "127.0.0.1:9", "start_from": "latest"},
            "table": {"identifier": "rpc.orders"},
        }
    )
    pin = tmp_path / "staging" / "orders" / START_PIN
    assert pinned_starts(spec, [("a", 0), ("a", 1)], {("a", 0): (0, 5), ("a", 1): (2, 9)}, {}) == {("a", 0): 5, ("a", 1): 9}
    assert json.loads(pin.read_text())["offsets"] == {"a": {"0": 5, "1": 9}}
    later = {("a", 0): (0, 12), ("a", 1): (2, 15), ("a", 2): (0, 4), ("b", 0): (3, 7), ("c", 0): (0, 6)}
    starts = pinned_starts(spec, [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("c", 0)], later, {"c": {1: 10}})
    assert starts == {("a", 0): 5, ("a", 1): 9, ("a", 2): 0, ("b", 0): 7, ("c", 0): 0}
    assert json.loads(pin.read_text())["offsets"] == {"a": {"0": 5, "1": 9}, "b": {"0": 7}}
    moved = {("a", 0): (0, 30), ("a", 1): (2, 31), ("b", 0): (3, 40)}
    assert pinned_starts(spec, [("a", 1), ("b", 0)], moved, {"a": {0: 12}}) == {("a", 1): 9, ("b", 0): 7}
    assert set(json.loads(pin.read_text())["pinned_at"]) == {"a", "b"}
