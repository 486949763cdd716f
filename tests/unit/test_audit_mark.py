"""The incremental audit's mark (``audit/mark.py``) and the coverage check from it (``audit/history.py``): which ledger
entries an audit from a mark checks, the mark a clean audit keeps, and gaps and overlaps against where the checked
ranges ended. Pure functions over ledger rows built here."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

from tidewater.audit.findings import AuditReport, Finding
from tidewater.audit.history import coverage
from tidewater.audit.mark import ends_of, mark_of, next_mark, since
from tidewater.audit.pipeline import _marks
from tidewater.table.own_tables import LEDGER_SCHEMA

HOLDER, TARGET = "db.checkpoints", "db.a"


def _entry(table: str, batch: str, at_s: int, start: int | None = None, end: int | None = None, kind: str = "ingest") -> dict:
    return {
        "table": table,
        "batch_id": batch,
        "kind": kind,
        "snapshot_id": at_s,
        "committed_at": datetime.fromtimestamp(at_s, tz=timezone.utc),
        "dag_run_id": None,
        "topic": "t" if start is not None else None,
        "partition": 0 if start is not None else None,
        "start_offset": start,
        "end_offset": end,
        "records": 0,
        "rows": 0,
        "dead_letters": 0,
        "skipped": 0,
        "detail": None,
    }


def _ledger(*entries: dict) -> pa.Table:
    return pa.Table.from_pylist(list(entries), schema=LEDGER_SCHEMA)


def test_an_audit_from_a_mark_checks_each_tables_newer_entries_and_the_targets_of_newer_holder_batches():
    rows = _ledger(
        _entry(HOLDER, "b1", 100, 0, 10),
        _entry(TARGET, "b1", 99),
        _entry(TARGET, "b2", 199),
        _entry(HOLDER, "b2", 200, 10, 20),  # b2's table commit before the mark
        _entry(HOLDER, "b3", 300, 20, 30),
        _entry(TARGET, "b3", 299),
        _entry("db.new", "b3", 299),
    )
    assert since(rows, None, HOLDER) is rows
    mark = {"at": {HOLDER: 150 * 10**6, TARGET: 200 * 10**6}, "ends": [["t", 0, 10]]}
    got = {(e["table"], e["batch_id"]) for e in since(rows, mark, HOLDER).to_pylist()}
    assert got == {(HOLDER, "b2"), (TARGET, "b2"), (HOLDER, "b3"), (TARGET, "b3"), ("db.new", "b3")}


def test_a_clean_audit_moves_the_mark_to_its_newest_entries_and_the_ends_its_holder_batches_reached():
    rows = _ledger(
        _entry(HOLDER, "b1", 100, 0, 10),
        _entry(TARGET, "b1", 99),
        _entry(HOLDER, "b2", 200, 10, 25),
        _entry(HOLDER, "r1", 250, 0, 5, kind="replay"),
    )
    mark = next_mark(rows, rows.to_pylist(), HOLDER, {"at": {"db.gone": 5}, "ends": [["t", 1, 7]]})
    assert mark == {"at": {"db.gone": 5, HOLDER: 250 * 10**6, TARGET: 99 * 10**6}, "ends": [["t", 0, 25], ["t", 1, 7]]}
    assert ends_of(mark) == {("t", 0): 25, ("t", 1): 7}


def test_the_verdict_keeps_the_last_clean_marks_when_an_audit_has_errors_or_covers_one_table():
    previous = {"mark": {"at": {}, "ends": [["t", 0, 1]]}, "deep_mark": {"at": {}, "ends": [["t", 0, 0]]}}
    new = {"at": {HOLDER: 1}, "ends": [["t", 0, 9]]}
    clean = AuditReport("p", HOLDER, 1, mark=new)
    assert _marks(previous, clean, deep=False, whole=True) == {"mark": new, "deep_mark": previous["deep_mark"]}
    assert _marks(previous, clean, deep=True, whole=True) == {"mark": new, "deep_mark": new}
    assert _marks(previous, clean, deep=True, whole=False) == previous
    dirty = AuditReport("p", HOLDER, 1, mark=new)
    dirty.findings.append(Finding("error", "coverage", "x"))
    assert _marks(previous, dirty, deep=True, whole=True) == previous
    assert mark_of({**previous, "clean": False}, deep=True) == previous["deep_mark"] and mark_of(None, deep=False) is None


def test_coverage_from_a_mark_names_offsets_below_it_and_a_hole_after_it():
    entries = [_entry(HOLDER, "next", 1, 30, 40), _entry(HOLDER, "again", 2, 25, 28), _entry(HOLDER, "late", 3, 45, 50)]
    found = {(f.start, f.end, f.batch_id): f.message for f in coverage(entries, {("t", 0): 30})}
    assert found == {
        (25, 28, "again"): "offsets committed twice: below 30, where the batches the last clean audit checked end",
        (40, 45, "late"): "offsets never committed: between batch next and the next",
    }
    assert coverage([_entry(HOLDER, "next", 1, 32, 40)], {("t", 0): 30})[0].start == 30
    assert coverage([_entry(HOLDER, "next", 1, 30, 40)], {("t", 0): 30}) == []


def test_coverage_measures_a_hole_from_the_range_that_reaches_furthest():
    """[0, 20), [5, 8) inside it, then [25, 30): the hole is [20, 25), not [8, 25)."""
    entries = [_entry(HOLDER, "a", 1, 0, 20), _entry(HOLDER, "b", 2, 5, 8), _entry(HOLDER, "c", 3, 25, 30)]
    found = {(f.start, f.end, f.batch_id) for f in coverage(entries)}
    assert found == {(5, 8, "b"), (20, 25, "c")}


def _table(*snaps: tuple[int, str, dict]) -> object:
    """A stand-in for a pyiceberg table: only its metadata's snapshots are read (built with pyiceberg's own model)."""
    from types import SimpleNamespace

    from pyiceberg.table.snapshots import Operation, Snapshot, Summary

    built = [
        Snapshot(snapshot_id=i, timestamp_ms=at_s * 1000, summary=Summary(Operation(op), **props), manifest_list="m", sequence_number=i)
        for i, (at_s, op, props) in enumerate(snaps, start=1)
    ]
    return SimpleNamespace(metadata=SimpleNamespace(snapshots=built))


def test_a_deep_audit_starts_over_after_a_rewrite_and_the_summary_checks_after_recovered_offsets():
    from tidewater.audit.history import rewritten_since
    from tidewater.table.summary import BATCH_ID, PUBLISHED, RECOVERED, REPLAY

    batch = (20, "append", {BATCH_ID: "b2"})
    assert rewritten_since(_table((10, "append", {BATCH_ID: "b1"}), batch), 15 * 10**6) is None, "new batches only"
    old_compaction = (5, "replace", {})
    assert rewritten_since(_table(old_compaction, batch), 15 * 10**6) is None, "before the mark"
    for rewrite in (
        (30, "replace", {}),
        (30, "append", {}),
        (30, "overwrite", {BATCH_ID: "r", REPLAY: "{}"}),
        (30, "append", {PUBLISHED: "b"}),
        (30, "append", {BATCH_ID: "x", RECOVERED: "{}"}),
    ):
        assert rewritten_since(_table(batch, rewrite), 15 * 10**6).snapshot_id == 2, rewrite
    only = (RECOVERED,)
    assert rewritten_since(_table(batch, (30, "replace", {}), (31, "append", {PUBLISHED: "b"})), 15 * 10**6, only) is None
    assert rewritten_since(_table(batch, (30, "append", {BATCH_ID: "x", RECOVERED: "{}"})), 15 * 10**6, only) is not None
