"""Where offsets are decided: the pure planner.

Input: the offsets committed in the table (next offset to read per topic-partition), each partition's
log start and end offsets as the broker reports them, and the batch cap. Output: one contiguous range
per partition that has data, starting exactly at the committed offset, never past the end offset, and
together within the cap. No I/O here: the planner is tested without a broker. ``merge_offsets`` (the
offsets after a batch) lives with the batch records and is re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping

from tidewater.batch import Offsets, PartitionRange, TopicPartition, merge_offsets
from tidewater.errors import OffsetGapError


def start_offsets(
    committed: Offsets,
    watermarks: Mapping[TopicPartition, tuple[int, int]],
    first: Mapping[TopicPartition, int] | None = None,
) -> dict[TopicPartition, int]:
    """Where each partition resumes. A partition never committed starts at ``first`` (``kafka.start_from``'s
    offsets, kept within the log: a lookup older than the log start starts there), else at its log start offset.

    Raises OffsetGapError when the committed offset is below the log start offset (retention deleted
    records that were never ingested) or beyond the end offset (the topic was recreated or truncated),
    and when a committed partition no longer exists.
    """
    starts: dict[TopicPartition, int] = {}
    for (topic, partition), (low, high) in watermarks.items():
        c = committed.get(topic, {}).get(partition)
        if c is None:
            starts[(topic, partition)] = min(max((first or {}).get((topic, partition), low), low), high)
            continue
        if c < low:
            raise OffsetGapError(
                f"committed offset {c} is below the log start offset {low}: offsets {c}..{low - 1} "
                f"({low - c} records) were deleted by retention before they were ingested. To accept the loss, step "
                f"past it deliberately: `tidewater skip --topic {topic} --partition {partition} --start-offset {c} "
                f"--end-offset {low} --reason ...` (or the skip DAG); the table's history and the audit record it",
                topic=topic,
                partition=partition,
                offset=c,
            )
        if c > high:
            raise OffsetGapError(
                f"committed offset {c} is beyond the end offset {high}: the topic was recreated or truncated since it was ingested",
                topic=topic,
                partition=partition,
                offset=c,
            )
        starts[(topic, partition)] = c
    for topic, parts in committed.items():
        if not any(t == topic for t, _ in watermarks):
            continue  # topic not part of this pipeline any more: keep its offsets, do not plan it
        for partition in parts:
            if (topic, partition) not in watermarks:
                raise OffsetGapError(
                    "partition has committed offsets in the table but no longer exists on the broker",
                    topic=topic,
                    partition=partition,
                )
    return starts


def allocate(available: Mapping[TopicPartition, int], cap: int) -> dict[TopicPartition, int]:
    """Share ``cap`` records fairly between partitions (water-filling).

    Each partition gets min(its backlog, an equal share of what is left); what small partitions do not
    use goes to the larger ones. The result sums to min(cap, total backlog).
    """
    if cap < 0:
        raise ValueError("cap must be >= 0")
    out: dict[TopicPartition, int] = {}
    remaining = cap
    items = sorted(available.items(), key=lambda kv: (kv[1], kv[0]))
    for i, (tp, n) in enumerate(items):
        share = remaining // (len(items) - i)
        take = min(max(n, 0), share)
        out[tp] = take
        remaining -= take
    return out


def plan_ranges(
    committed: Offsets,
    watermarks: Mapping[TopicPartition, tuple[int, int]],
    max_records: int,
    first: Mapping[TopicPartition, int] | None = None,
) -> list[PartitionRange]:
    """The ranges of the next batch, sorted by topic and partition; empty ranges are left out. ``first``: see
    :func:`start_offsets`."""
    starts = start_offsets(committed, watermarks, first)
    available = {tp: watermarks[tp][1] - s for tp, s in starts.items()}
    grant = allocate(available, max_records)
    ranges = [PartitionRange(tp[0], tp[1], starts[tp], starts[tp] + grant[tp]) for tp in sorted(starts) if grant[tp] > 0]
    return ranges


__all__ = ["allocate", "merge_offsets", "plan_ranges", "start_offsets"]
