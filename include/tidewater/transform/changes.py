"""Change streams as data: what each record does to its row, and a batch's net change per key.

Pure Arrow, no I/O (tested without a table). Records are ordered by key, then (partition, offset): within a
batch the changes to one key are applied in that order and the last one wins. An insert of an existing key
is applied as an update and a delete of an absent key is a no-op; both are counted, so that
records read = inserted + updated + deleted + no-op + dead letters + skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TOPIC, PARTITION, OFFSET = "_kafka_topic", "_kafka_partition", "_kafka_offset"


def bad_ops(rows: pa.Table, op_column: str | None, op_values: dict[str, str]) -> dict[int, str]:
    """Rows whose operation is missing or not one of ``op_values`` (row index -> why). Vectorized; the loop
    runs over failing rows only."""
    if op_column is None:
        return {}
    if op_column not in rows.column_names:
        return dict.fromkeys(range(rows.num_rows), f"no operation field {op_column!r}")
    ops = pc.cast(rows.column(op_column), pa.string())
    known = pc.fill_null(pc.is_in(ops, value_set=pa.array(list(op_values), pa.string())), False)
    bad = pc.indices_nonzero(pc.invert(known)).to_pylist()
    values = ops.take(pa.array(bad, pa.int64())).to_pylist() if bad else []
    return {r: f"operation {v!r} in {op_column!r} is not one of {', '.join(op_values)}" for r, v in zip(bad, values)}


def ops_mask(rows: pa.Table, op_column: str | None, op_values: dict[str, str], meaning: tuple[str, ...]) -> pa.Array:
    """True where a record's operation means one of ``meaning`` (never true without an operation column)."""
    if op_column is None or rows.num_rows == 0 or op_column not in rows.column_names:
        return pa.repeat(False, rows.num_rows)
    values = [v for v, op in op_values.items() if op in meaning]
    ops = pc.cast(rows.column(op_column), pa.string()).combine_chunks()
    return pc.fill_null(pc.is_in(ops, value_set=pa.array(values, pa.string())), False)


def deletes_mask(rows: pa.Table, op_column: str | None, op_values: dict[str, str]) -> pa.Array:
    """True where a record carries no new row image: it deletes its key, or truncates the table (never true
    without an operation column: every record upserts)."""
    return ops_mask(rows, op_column, op_values, ("delete", "truncate"))


@dataclass(frozen=True)
class Truncated:
    """What a batch's truncates did before its changes are netted (``cut_at_truncates``)."""

    truncates: int  # truncate records
    superseded: int  # changes before a truncate in its partition (removed with the rows)


def cut_at_truncates(changes: pa.Table, op_column: str | None, op_values: dict[str, str]) -> tuple[pa.Table, Truncated | None]:
    """The changes that outlive the batch's truncates: in each partition with a truncate, only the changes after
    its last one (changes of other partitions are kept: their order against it is not known). None when the
    batch has no truncate. The loop runs over the partitions that hold a truncate, not over records."""
    truncating = ops_mask(changes, op_column, op_values, ("truncate",))
    if not pc.any(truncating).as_py():
        return changes, None
    last = pa.TableGroupBy(changes.filter(truncating), PARTITION).aggregate([(OFFSET, "max")])
    keep = pa.repeat(True, changes.num_rows)
    for p, o in zip(last.column(PARTITION).to_pylist(), last.column(f"{OFFSET}_max").to_pylist()):
        before = pc.and_(pc.equal(changes.column(PARTITION), p), pc.less_equal(changes.column(OFFSET), o))
        keep = pc.and_(keep, pc.invert(before))
    truncates = int(pc.sum(pc.cast(truncating, pa.int64())).as_py())
    kept = changes.filter(keep)
    return kept, Truncated(truncates, changes.num_rows - kept.num_rows - truncates)


@dataclass(frozen=True)
class NetChanges:
    """One batch's changes reduced to one per key.

    ``upserts``: the last image of every key whose last change is not a delete (all columns).
    ``keys``: every key the batch touches, one row each (the id columns), in the order of ``last_deletes``.
    ``new_group``/``deleting``/``group``: per change record in key order, for counting effects.
    """

    upserts: pa.Table
    keys: pa.Table
    last: pa.Table  # each key's last change (all columns), in the order of ``keys``
    last_deletes: pa.Array
    new_group: pa.Array
    deleting: pa.Array
    group: pa.Array
    cross_partition_keys: int
    cross_partition_examples: tuple[dict[str, Any], ...]

    @property
    def changes(self) -> int:
        return len(self.deleting)


def _differs_from_previous(sorted_rows: pa.Table, columns: list[str]) -> pa.Array:
    """True at row i when any of ``columns`` differs from row i-1 (row 0: True)."""
    n = sorted_rows.num_rows
    if n == 0:
        return pa.array([], pa.bool_())
    diff = pa.repeat(False, n - 1)
    for c in columns:
        col = sorted_rows.column(c).combine_chunks()
        diff = pc.or_(diff, pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, n - 1)), True))
    return pa.concat_arrays([pa.array([True]), diff])


def net_changes(
    changes: pa.Table, id_columns: list[str], op_column: str | None, op_values: dict[str, str], examples: int = 5
) -> NetChanges:
    """Reduce ``changes`` (records with the id columns, ``_kafka_partition`` and ``_kafka_offset``) to the net
    change per key."""
    order = [(c, "ascending") for c in id_columns] + [(PARTITION, "ascending"), (OFFSET, "ascending")]
    rows = changes.sort_by(order) if changes.num_rows else changes
    n = rows.num_rows
    deleting = deletes_mask(rows, op_column, op_values)
    new_group = _differs_from_previous(rows, id_columns)
    last = pa.concat_arrays([new_group.slice(1), pa.array([True])]) if n else pa.array([], pa.bool_())
    group = pc.subtract(pc.cumulative_sum(pc.cast(new_group, pa.int64())), 1) if n else pa.array([], pa.int64())
    net = rows.filter(last)
    last_deletes = deleting.filter(last)
    # a key changed in two partitions in one batch: its order across partitions is not the source's
    moved = pc.and_(pc.invert(new_group), _differs_from_previous(rows, [PARTITION])) if n else pa.array([], pa.bool_())
    crossing = pc.unique(group.filter(moved)) if n else pa.array([], pa.int64())
    sample = net.select(id_columns).take(crossing.slice(0, examples)).to_pylist() if len(crossing) else []
    return NetChanges(
        upserts=net.filter(pc.invert(last_deletes)),
        keys=net.select(id_columns),
        last=net,
        last_deletes=last_deletes,
        new_group=new_group,
        deleting=deleting,
        group=group,
        cross_partition_keys=len(crossing),
        cross_partition_examples=tuple(sample),
    )


def count_effects(net: NetChanges, existed: pa.Array) -> dict[str, int]:
    """What each change record did, given whether each key of ``net.keys`` existed in the table before the
    batch: inserted, updated, deleted, no-op (a delete of an absent key). They add up to ``net.changes``."""
    if net.changes == 0:
        return dict.fromkeys(("inserted", "updated", "deleted", "noop"), 0)
    previous_kept = pa.concat_arrays([pa.array([False]), pc.invert(net.deleting).slice(0, net.changes - 1)])
    existed_before = pc.if_else(net.new_group, pc.take(existed, net.group), previous_kept)
    upsert = pc.invert(net.deleting)

    def count(mask: pa.Array) -> int:
        return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)

    return {
        "inserted": count(pc.and_(upsert, pc.invert(existed_before))),
        "updated": count(pc.and_(upsert, existed_before)),
        "deleted": count(pc.and_(net.deleting, existed_before)),
        "noop": count(pc.and_(net.deleting, pc.invert(existed_before))),
    }


def reapply_decisions(net: NetChanges, rows: pa.Table, reaching: list[int] | None = None) -> tuple[pa.Array, dict[str, int]]:
    """A replay of committed changes: which keys get their change again. ``rows``: the table's live rows of
    the changed keys (``__key`` into ``net.keys``, ``_kafka_partition``, ``_kafka_offset`` of the change that
    wrote each row). A key's change is applied again when its row was written by that change (the image is
    restored) or by an earlier one of the same partition (a lost change); a row written by a later change, or
    in another partition (no order to compare), wins. A key without a row is left alone (a later change may
    have deleted it), except in the partitions ``reaching`` lists (the replay's range reaches the table's
    committed offset there, so no later change of the partition exists): there a key whose last change is not a
    delete lost its row, which is restored. On a healthy table a replay changes no row. Returns (apply per key,
    counts)."""
    n = net.keys.num_rows
    every = pa.array(np.arange(n), pa.int64())
    if rows.num_rows:
        key = rows.column("__key").combine_chunks()
        same = pc.equal(rows.column(PARTITION).combine_chunks(), pc.take(net.last.column(PARTITION), key))
        not_later = pc.less_equal(rows.column(OFFSET).combine_chunks(), pc.take(net.last.column(OFFSET), key))
        ok = pc.fill_null(pc.and_(same, not_later), False)
        applied = pc.is_in(every, value_set=pc.unique(key.filter(ok)))
        existed = pc.is_in(every, value_set=pc.unique(key))
    else:
        applied = existed = pa.repeat(False, n)
    lost = pc.and_(pc.invert(existed), pc.invert(net.last_deletes))
    if reaching:
        lost_here = pc.and_(
            lost, pc.is_in(net.last.column(PARTITION), value_set=pa.array(reaching, pa.int32()).cast(net.last.schema.field(PARTITION).type))
        )
        applied = pc.or_(applied, lost_here)
    else:
        lost_here = pa.repeat(False, n)

    def count(mask: pa.Array) -> int:
        return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)

    return applied, {
        "reapplied": count(pc.and_(applied, pc.invert(lost_here))),
        "restored": count(lost_here),
        "superseded": count(pc.and_(existed, pc.invert(applied))),
        "absent": count(pc.and_(lost, pc.invert(lost_here))),
        "noop": count(pc.and_(pc.invert(existed), net.last_deletes)),
    }


def retry_decisions(net: NetChanges, rows: pa.Table | None, removed: list[str | None]) -> tuple[pa.Array, list[tuple[int, str]]]:
    """A dead-letter retry of changes: which keys get their (net) retried change. ``rows``: the table's live rows of
    the keys (``__key``, ``_kafka_partition``, ``_kafka_offset``; None for none); ``removed``: per key, why a later
    change may have deleted it (None: no snapshot since the letters' batch removed a row of it). A key is applied
    when its live row was written by an earlier offset of the same partition, or when it has no live row and nothing
    removed one since; otherwise a later change of the key is (or may be) applied and the retry refuses it. Returns
    (apply per key, [(key, why refused)])."""
    n = net.keys.num_rows
    refused: dict[int, str] = {}
    if rows is not None and rows.num_rows:
        key = rows.column("__key").combine_chunks()
        mine_p, mine_o = pc.take(net.last.column(PARTITION), key), pc.take(net.last.column(OFFSET), key)
        later = pc.fill_null(
            pc.or_(pc.not_equal(rows.column(PARTITION).combine_chunks(), mine_p), pc.greater(rows.column(OFFSET).combine_chunks(), mine_o)),
            True,
        )
        live = set(key.to_pylist())
        for k, p, o in zip(
            key.filter(later).to_pylist(), rows.column(PARTITION).filter(later).to_pylist(), rows.column(OFFSET).filter(later).to_pylist()
        ):  # error path: refused keys only
            refused[k] = f"a later change of the key is applied (its row comes from partition {p} offset {o})"
    else:
        live = set()
    for k, why in enumerate(removed):
        if why is not None and k not in live:
            refused.setdefault(k, why)
    apply = pa.array([k not in refused for k in range(n)], pa.bool_())
    return apply, sorted(refused.items())
