"""Which offset ranges each Spark task of the write step reads: long ranges split, short ones packed (pure).

A task writes at least one data file per table partition it touches, so one task per Kafka partition makes the
number of files grow with the topic's partitions, not with its data (a 1,000-partition topic: 1,000 files a batch
however few records). Packing reads several short ranges in one task, which writes their rows into the same files.

The pack size follows Spark's own split of small input files (``FilePartition.maxSplitBytes``:
``min(maxPartitionBytes, max(openCostInBytes, totalBytes / minPartitionNum))``): at most ``records_per_task``
records, and no more than the batch's records shared over the write's parallelism, so a batch still gives every core
a task. Packs keep the plan's order (topic, partition, offset), so neighbouring partitions share a task.

Packing changes which files hold which rows, never which rows a batch holds: every range is read whole by exactly one
task, and each range keeps its own counts (``PartitionStats``).
"""

from __future__ import annotations

from collections.abc import Sequence

from tidewater.batch import PartitionRange

Pack = tuple[PartitionRange, ...]


def pack_size(total_records: int, records_per_task: int, parallelism: int) -> int:
    """The most records a task of packed ranges reads: ``records_per_task``, or the batch shared over
    ``parallelism`` tasks when that is less (at least 1)."""
    share = -(-total_records // max(parallelism, 1))  # ceiling
    return max(1, min(records_per_task, share))


def pack_ranges(ranges: Sequence[PartitionRange], size: int) -> list[Pack]:
    """Consecutive ``ranges`` grouped, in order, into packs of at most ``size`` records; a range of ``size`` or more
    records is a pack of its own."""
    packs: list[Pack] = []
    current: list[PartitionRange] = []
    records = 0
    for r in ranges:
        if current and records + r.size > size:
            packs.append(tuple(current))
            current, records = [], 0
        current.append(r)
        records += r.size
    if current:
        packs.append(tuple(current))
    return packs


def task_ranges(ranges: Sequence[PartitionRange], records_per_task: int, parallelism: int, pack: bool) -> list[Pack]:
    """The write step's tasks: each range split into sub-ranges of at most ``records_per_task`` records, then (with
    ``pack``) short sub-ranges packed (``pack_size``); without, one sub-range a task."""
    subs = [s for r in ranges for s in r.split(records_per_task)]
    if not pack:
        return [(s,) for s in subs]
    return pack_ranges(subs, pack_size(sum(s.size for s in subs), records_per_task, parallelism))
