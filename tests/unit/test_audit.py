"""The audit's checks on given ledger entries and Kafka positions (the whole audit, against the real broker and
catalog: tests/integration/test_audit.py)."""

from __future__ import annotations

from tidewater.audit.history import accounting, coverage
from tidewater.audit.kafka import kafka_findings


def entry(batch: str, start: int, end: int, kind: str = "ingest", **counts: int) -> dict:
    return {
        "batch_id": batch,
        "kind": kind,
        "snapshot_id": hash(batch) % 1000,
        "topic": "t",
        "partition": 0,
        "start_offset": start,
        "end_offset": end,
        "records": end - start,
        "rows": end - start,
        "dead_letters": 0,
        "skipped": 0,
        "detail": None,
        **counts,
    }


def test_contiguous_ranges_are_clean_gaps_and_overlaps_name_the_range_and_batch():
    assert coverage([entry("a", 0, 10), entry("b", 10, 25)]) == []
    (gap,) = coverage([entry("a", 0, 10), entry("b", 12, 25)])
    assert (gap.severity, gap.start, gap.end, gap.batch_id) == ("error", 10, 12, "b")
    (twice,) = coverage([entry("a", 0, 10), entry("b", 8, 25)])
    assert (twice.severity, twice.start, twice.end, twice.batch_id) == ("error", 8, 10, "b")
    (replay,) = coverage([entry("a", 0, 10), entry("r", 2, 5, kind="replay")])
    assert replay.severity == "info"


def test_records_read_must_be_rows_plus_dead_letters_plus_skipped():
    assert accounting([entry("a", 0, 10, rows=7, dead_letters=2, skipped=1)]) == []
    (bad,) = accounting([entry("a", 0, 10, rows=7)])
    assert bad.severity == "error" and bad.batch_id == "a" and "records read 10 != rows 7" in bad.message


def test_a_change_batch_accounts_each_change_record_once_by_what_it_did():
    import json

    def change(**effects: int) -> dict:
        detail = json.dumps({"tidewater.changes": json.dumps(effects)})
        return entry("c", 0, 10, kind="change", rows=3, dead_letters=1, skipped=1, detail=detail)

    assert accounting([change(inserted=3, updated=2, deleted=2, noop=1, position_deletes=4)]) == []
    (bad,) = accounting([change(inserted=3, updated=2, deleted=1, noop=1)])
    assert bad.batch_id == "c" and "records read 10 != changes applied 7 + dead letters 1 + skipped 1" in bad.message


def test_offsets_deleted_by_retention_or_beyond_the_log_end_are_errors_and_lag_is_reported():
    findings, parts = kafka_findings({"t": {0: 5, 1: 40, 2: 7}}, {("t", 0): (9, 20), ("t", 1): (0, 3), ("t", 2): (0, 7), ("t", 3): (0, 4)})
    assert [(f.partition, f.start, f.end) for f in findings] == [(0, 5, 9), (1, 3, 40)]
    assert "retention" in findings[0].message and "beyond the log end" in findings[1].message
    assert [p["lag"] for p in parts] == [15, 0, 0, None]
