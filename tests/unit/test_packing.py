"""Which ranges each write task reads (``write/packing.py``): pure, tested without Spark or a broker. Packing may
change which files hold which rows, never which offsets a batch reads: every offset of the plan is read by exactly
one task, in the plan's order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.batch import PartitionRange
from tidewater.plan.planner import plan_ranges
from tidewater.write.packing import pack_ranges, pack_size, task_ranges


@st.composite
def planned(draw):
    """A plan's ranges (sorted by topic and partition, each non-empty), as the planner makes them."""
    n = draw(st.integers(1, 300))
    sizes = draw(st.lists(st.integers(1, 5_000), min_size=n, max_size=n))
    starts = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n))
    return [PartitionRange(f"t{p % 3}", p, s, s + size) for p, (s, size) in enumerate(zip(starts, sizes, strict=True))]


@settings(deadline=None)  # pure but not instant: a plan of 300 ranges split into many sub-ranges
@given(planned(), st.integers(50, 20_000), st.integers(1, 64), st.booleans())
def test_every_offset_is_read_by_exactly_one_task_in_the_plans_order(ranges, per_task, parallelism, pack):
    tasks = task_ranges(ranges, per_task, parallelism, pack)
    flat = [r for task in tasks for r in task]
    assert flat == [s for r in ranges for s in r.split(per_task)], "the sub-ranges, each once, in order"
    offsets = sorted((r.topic, r.partition, o) for r in flat for o in range(r.start, r.end)) if len(flat) < 50 else None
    if offsets is not None:
        assert len(offsets) == len(set(offsets)) == sum(r.size for r in ranges)
    assert all(task for task in tasks), "no empty task"


@settings(deadline=None)
@given(planned(), st.integers(50, 20_000), st.integers(1, 64))
def test_a_task_reads_at_most_the_pack_size_unless_it_holds_one_range(ranges, per_task, parallelism):
    tasks = task_ranges(ranges, per_task, parallelism, pack=True)
    subs = [s for r in ranges for s in r.split(per_task)]
    size = pack_size(sum(s.size for s in subs), per_task, parallelism)
    assert size <= per_task
    for task in tasks:
        assert len(task) == 1 or sum(r.size for r in task) <= size
    # no two neighbouring tasks could have been one: packing is as tight as its order allows
    for a, b in zip(tasks, tasks[1:], strict=False):
        assert sum(r.size for r in a) + b[0].size > size


def test_a_thousand_short_ranges_are_a_few_tasks_and_long_ones_keep_their_own():
    """The case packing is for: 1,000 partitions with 100 records each on 2 cores is 2 tasks (was 1,000); with
    8 cores, 8. Ranges of records_per_task or more are split as before and never packed with others."""
    short = [PartitionRange("clicks", p, 0, 100) for p in range(1000)]
    assert len(task_ranges(short, 250_000, 2, pack=True)) == 2
    assert len(task_ranges(short, 250_000, 8, pack=True)) == 8
    assert len(task_ranges(short, 250_000, 2, pack=False)) == 1000
    long = [PartitionRange("clicks", 0, 0, 600_000), PartitionRange("clicks", 1, 0, 10), PartitionRange("clicks", 2, 5, 15)]
    tasks = task_ranges(long, 250_000, 2, pack=True)
    assert [[(r.partition, r.start, r.end) for r in t] for t in tasks] == [
        [(0, 0, 250_000)],
        [(0, 250_000, 500_000)],
        [(0, 500_000, 600_000), (1, 0, 10), (2, 5, 15)],
    ]


def test_equal_ranges_as_many_as_the_cores_are_not_packed():
    """Six partitions of 250 records on 6 cores stay six tasks; on 2 cores they are two tasks of three."""
    six = [PartitionRange("pizzas", p, 0, 250) for p in range(6)]
    assert len(task_ranges(six, 250_000, 6, pack=True)) == 6
    assert [len(t) for t in task_ranges(six, 250_000, 2, pack=True)] == [3, 3]


def test_pack_ranges_keeps_order_and_closes_a_pack_before_it_would_overflow():
    rs = [PartitionRange("t", p, 0, n) for p, n in enumerate([5, 5, 3, 9, 1])]
    assert [[r.partition for r in t] for t in pack_ranges(rs, 10)] == [[0, 1], [2], [3, 4]]


def test_a_partition_the_topic_gained_is_planned_from_its_log_start():
    """A topic that gains partitions: the next plan reads each new one from its log start (retention may already
    have moved it), beside the committed partitions' ranges."""
    committed = {"clicks": {0: 40, 1: 40}}
    wm = {("clicks", 0): (0, 50), ("clicks", 1): (0, 40), ("clicks", 2): (7, 12), ("clicks", 3): (0, 0)}
    assert plan_ranges(committed, wm, 1_000) == [PartitionRange("clicks", 0, 40, 50), PartitionRange("clicks", 2, 7, 12)]
