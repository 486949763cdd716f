"""Where the last clean audit ended, so the next one checks only what is new (``tidewater audit --full`` checks all).

A clean audit of every table of a pipeline keeps a mark in its verdict (the ledger table's ``tidewater.last-audit``):

- ``at``: per table, the newest ``committed_at`` among the ledger entries it checked;
- ``ends``: per partition of the offsets holder, where the batches that moved the offsets ended ([topic, partition,
  end offset]).

The next audit checks the entries committed after ``at`` (per table: each table's snapshot timestamps grow along its
history, as Iceberg requires of its writers), and its coverage check starts each partition at ``ends``: a new batch must
start where the checked ones ended, and one that starts below it committed offsets twice. A routed pipeline's target
tables also get the entries of the batches the holder committed since the mark (a table commits before its holder).
A deep audit starts from the last clean deep audit's mark. An audit with errors keeps the previous mark: the next
audit checks again from the last clean one.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tidewater.audit.findings import MOVING

Ends = dict[tuple[str, int], int]


def mark_of(verdict: dict[str, Any] | None, deep: bool) -> dict[str, Any] | None:
    """The mark to start from: the last clean audit's (``deep``: the last clean deep audit's); None: check all."""
    if not verdict:
        return None
    return verdict.get("deep_mark" if deep else "mark")


def ends_of(mark: dict[str, Any] | None) -> Ends:
    return {(t, int(p)): int(e) for t, p, e in (mark or {}).get("ends", [])}


def since(entries: pa.Table, mark: dict[str, Any] | None, holder: str) -> pa.Table:
    """The ledger entries an audit from ``mark`` checks (all of them without one): each table's committed after the
    mark's ``at``, and every table's entries of a batch the holder committed after it."""
    if not mark or entries.num_rows == 0:
        return entries
    at = pc.cast(entries.column("committed_at"), pa.int64())
    new = pa.repeat(False, entries.num_rows)
    tables = entries.column("table")
    for table in pc.unique(tables).to_pylist():
        after = mark["at"].get(table)
        mine = pc.equal(tables, table)
        new = pc.or_(new, mine if after is None else pc.and_(mine, pc.greater(at, after)))
    held = entries.filter(pc.and_(new, pc.equal(tables, holder))).column("batch_id")
    return entries.filter(pc.or_(new, pc.is_in(entries.column("batch_id"), value_set=pc.unique(held))))


def next_mark(entries: pa.Table, checked: list[dict[str, Any]], holder: str, previous: dict[str, Any] | None) -> dict[str, Any]:
    """The mark a clean audit of every table keeps: ``at`` from every entry of the ledger it read, ``ends`` from the
    previous mark moved on by the holder's entries it ``checked`` (those that moved the offsets)."""
    at = dict((previous or {}).get("at", {}))
    if entries.num_rows:
        per = pa.table({"table": entries.column("table"), "at": pc.cast(entries.column("committed_at"), pa.int64())})
        per = per.group_by("table").aggregate([("at", "max")])
        at.update(dict(zip(per.column("table").to_pylist(), per.column("at_max").to_pylist())))
    ends = ends_of(previous)
    for e in checked:
        if e["table"] == holder and e["kind"] in MOVING and e["end_offset"] is not None:
            key = (e["topic"], int(e["partition"]))
            ends[key] = max(ends.get(key, 0), int(e["end_offset"]))
    return {"at": at, "ends": [[t, p, e] for (t, p), e in sorted(ends.items())]}
