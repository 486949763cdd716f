"""`make bench-audit`: what `tidewater audit` costs as the ledger grows, and what the deep audit costs on a big table.

Summary level: a table and its ledger written as Tidewater writes them, one commit per batch (a pyiceberg append
of one row per partition with the batch's summary, then the ledger's sync, as the commit step does), over a topic
of 6 partitions on the embedded broker holding one record per partition per batch. At each mark the snapshots of
both are expired as the maintenance DAG's expiry does, then the audit (ledger read, the checks, the table's
history, Kafka's watermarks) is timed; the ledger sync is the per-commit cost the ledger adds. Deep: a 10M-row
table with the Kafka metadata columns built directly (pyiceberg appends of 1M-row files) and a ledger of 100
batches covering it; the deep checks are timed (the offsets of every row projected and compared per partition;
no offset is missing, so Kafka is not asked).
Writes a section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "include"))
BEGIN, END = "<!-- audit:begin -->", "<!-- audit:end -->"
PARTS = 6


def _pipeline(home: Path, bootstrap: str, name: str, table: str, **more: object) -> object:
    import yaml

    from tidewater.config.parse import load_pipeline

    path = home / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump({"name": name, "topics": [name], "table": {"identifier": table}, "kafka": {"bootstrap_servers": bootstrap}, **more})
    )
    return load_pipeline(path)


def _batch(table: object, topic: str, n: int) -> None:
    """Batch ``n`` (0-based) as Tidewater commits it: one row per partition, offsets ``n`` to ``n + 1``."""
    import pyarrow as pa

    rows = pa.table({"v": pa.array(range(PARTS), pa.int64())})
    table.append(rows, snapshot_properties=_props(topic, n))  # type: ignore[attr-defined]


def _props(topic: str, n: int) -> dict[str, str]:
    """Batch ``n``'s snapshot properties: its id, its records, its offsets and ranges."""
    from tidewater.table.summary import BATCH_ID, OFFSETS, RANGES, RECORDS

    return {
        BATCH_ID: f"bench-{n:06d}",
        RECORDS: str(PARTS),
        OFFSETS: json.dumps({topic: {str(p): n + 1 for p in range(PARTS)}}),
        RANGES: json.dumps([[topic, p, n, n + 1] for p in range(PARTS)]),
    }


CHUNK = 100  # after the sampled commits: batches committed between two ledger syncs


def _expire(catalog: object, spec: object, table: object) -> int:
    """Expire every snapshot but the newest of the table and of its ledger, as the maintenance DAG's expiry does
    (the ledger first records what it has not yet)."""
    from tidewater.audit import ledger

    expired = ledger.expire_history(catalog, spec)
    head = table.current_snapshot()  # type: ignore[attr-defined]
    table.maintenance.expire_snapshots().older_than(  # type: ignore[attr-defined]
        datetime.fromtimestamp(head.timestamp_ms / 1000, tz=timezone.utc)
    ).commit()
    return expired


def summary_level(home: Path, bootstrap: str, marks: list[int], sample: int = 300, direct: bool = False) -> list[dict[str, float]]:
    import pyarrow as pa

    from tidewater.audit import ledger
    from tidewater.audit.pipeline import audit
    from tidewater.ops.overview import lag_history
    from tidewater.table.catalog import create_table, load_catalog
    from tidewater_dev.sample_data import produce

    spec = _pipeline(home, bootstrap, "ledgered", "bench.ledgered")
    catalog = load_catalog(spec)
    table = create_table(catalog, "bench.ledgered", pa.schema([("v", pa.int64())]), {"format-version": "2"})
    out, built, syncs = [], 0, []
    for mark in marks:
        produce(bootstrap, "ledgered", [b"{}"] * (PARTS * (mark - built)), partitions=PARTS, create=built == 0)
        started = time.monotonic()
        for n in range(built, mark):
            if direct and n >= sample:  # the rest of the batches' snapshots written at once, then one sync
                from direct_history import append_snapshots

                append_snapshots(catalog, "bench.ledgered", mark - n, lambda i, n=n: _props("ledgered", n + i))
                ledger.sync(catalog, spec)
                _expire(catalog, spec, catalog.load_table("bench.ledgered"))
                table = catalog.load_table("bench.ledgered")
                break
            _batch(table, "ledgered", n)
            if n < sample:  # the per-commit cost, as the commit step pays it
                t = time.monotonic()
                ledger.sync(catalog, spec)
                syncs.append(time.monotonic() - t)
            elif (n + 1) % CHUNK == 0 or n == mark - 1:
                ledger.sync(catalog, spec)  # then CHUNK batches at a time, the table's history expired after each
                _expire(catalog, spec, catalog.load_table("bench.ledgered"))
            table = catalog.load_table("bench.ledgered")
        build = time.monotonic() - started
        built = mark
        expired = _expire(catalog, spec, table)
        table = catalog.load_table("bench.ledgered")
        t = time.monotonic()
        report = audit(spec, full=True)
        seconds = time.monotonic() - t
        assert report.clean and report.batches == mark, [f.text() for f in report.findings][:5]
        rows = ledger.read(catalog, spec).num_rows
        produce(bootstrap, "ledgered", [b"{}"] * PARTS, partitions=PARTS, create=False)
        _batch(table, "ledgered", mark)  # one batch after the clean audit: what the next audit checks
        ledger.sync(catalog, spec)
        built = mark + 1
        table = catalog.load_table("bench.ledgered")
        t = time.monotonic()
        report = audit(spec)
        since = time.monotonic() - t
        assert report.clean and report.batches == 1, [f.text() for f in report.findings][:5]
        t = time.monotonic()
        assert len(lag_history(spec)) == min(100, built)  # the view's lag chart: the last 100 batches, from the ledger
        lag = time.monotonic() - t
        # the sync's median over the last (up to) 100 timed commits, and which batches those were: with a sample
        # smaller than the marks, every mark past it repeats the sample's figure, and the report says so
        timed = (max(1, len(syncs) - 99), len(syncs))
        out.append(
            {
                "batches": mark,
                "audit_s": seconds,
                "since_s": since,
                "lag_s": lag,
                "sync_s": statistics.median(syncs[-100:]),
                "sync_at": timed,
                "build_s": build,
                "expired": expired,
                "ledger_rows": rows,
            }
        )
        print(
            f"{mark} batches: audit {seconds:.2f} s (--full), {since:.2f} s (since the last), sync {out[-1]['sync_s'] * 1000:.0f} ms",
            file=sys.stderr,
        )
    return out


def deep(home: Path, bootstrap: str, rows: int) -> dict[str, float]:
    import numpy as np
    import pyarrow as pa

    from tidewater.audit.deep import deep_findings
    from tidewater.table.catalog import create_table, load_catalog

    spec = _pipeline(home, bootstrap, "deep", "bench.deep", format={"metadata": "prefixed"})
    catalog = load_catalog(spec)
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("item", pa.string()),
            ("_kafka_topic", pa.string()),
            ("_kafka_partition", pa.int32()),
            ("_kafka_offset", pa.int64()),
        ]
    )
    table = create_table(catalog, "bench.deep", schema, {"format-version": "2"})
    t = time.monotonic()
    for start in range(0, rows, 1_000_000):
        ids = np.arange(start, min(rows, start + 1_000_000), dtype=np.int64)
        table.append(
            pa.table(
                {
                    "id": ids,
                    "item": pa.array(["item"] * len(ids)),
                    "_kafka_topic": pa.array(["deep"] * len(ids)),
                    "_kafka_partition": (ids % PARTS).astype(np.int32),
                    "_kafka_offset": ids // PARTS,
                },
                schema=schema,
            )
        )
    build = time.monotonic() - t
    per = rows // PARTS
    entries = [
        {
            "table": "bench.deep",
            "batch_id": f"deep-{b:03d}",
            "kind": "ingest",
            "snapshot_id": 1,
            "committed_at": 0,
            "dag_run_id": None,
            "topic": "deep",
            "partition": p,
            "start_offset": b * per // 100,
            "end_offset": (b + 1) * per // 100,
            "records": 0,
            "rows": 0,
            "dead_letters": 0,
            "skipped": 0,
            "detail": None,
        }
        for b in range(100)
        for p in range(PARTS)
    ]
    from tidewater_dev.sample_data import produce  # the entries go to the checks directly (ledger cost: above)

    produce(bootstrap, "deep", [b"{}"] * PARTS, partitions=PARTS)
    t = time.monotonic()
    findings = deep_findings(spec, catalog, {"bench.deep": catalog.load_table("bench.deep")}, entries)
    seconds = time.monotonic() - t
    assert not [f for f in findings if f.severity == "error"], [f.text() for f in findings][:5]
    t = time.monotonic()  # what a deep audit since the last clean one checks: the newest batch's ranges
    findings = deep_findings(spec, catalog, {"bench.deep": catalog.load_table("bench.deep")}, entries[-PARTS:])
    newest = time.monotonic() - t
    assert not [f for f in findings if f.severity == "error"], [f.text() for f in findings][:5]
    return {"rows": rows, "deep_s": seconds, "newest_s": newest, "build_s": build}


def main() -> int:
    from benchlib import command_line, fresh_home, write_section

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--batches",
        default="17,1667,16667",
        help="audit after this many batches (comma-separated; 6 ledger rows a batch: 102, 10,002, 100,002)",
    )
    ap.add_argument("--deep-rows", type=int, default=10_000_000)
    ap.add_argument(
        "--sync-sample", type=int, default=300, help="the first N batches sync the ledger after every commit (timed); later ones every 100"
    )
    ap.add_argument(
        "--direct",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the sampled batches, write each mark's batches as snapshots directly "
        "(scripts/direct_history.py) and sync the ledger once: 16,667 batches (100,000 ledger rows) in "
        "minutes; the ledger's rows are the same, only the commits' own cost is not paid (--no-direct: commit them all)",
    )
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    args = ap.parse_args()
    home = fresh_home("bench-audit")
    from tidewater_dev import broker as embedded

    b = embedded.start(log_path=home / "broker.log")
    try:
        levels = summary_level(home, b.bootstrap, [int(x) for x in args.batches.split(",")], args.sync_sample, args.direct)
        big = deep(home, b.bootstrap, args.deep_rows)
    finally:
        b.stop()
    write_section(args.output, BEGIN, END, _section(levels, big, command_line("make bench-audit"), args.direct))
    return 0


def _section(levels: list[dict[str, float]], big: dict[str, float], command: str, direct: bool = False) -> str:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    built = (
        "later ones are written as the batches' snapshots directly (`--direct`: scripts/direct_history.py, the "
        "same snapshot properties) and the ledger synced once per mark, so that 16,667 batches (100,000 ledger "
        "rows) take minutes; the ledger holds the rows the commits would have left"
        if direct
        else f"later ones sync it every {CHUNK} batches with the table's history expired after each sync, so that "
        "building 10,000 batches takes minutes, not hours (the ledger holds the same rows either way)"
    )
    lines = [
        BEGIN,
        "## What the audit costs",
        "",
        f"Produced by `{command}` on {now} (UTC): a table committed one batch at a time as Tidewater commits "
        f"({PARTS} partitions, one row per partition per batch, a pyiceberg append with the batch's summary). The "
        "first batches sync the ledger after every commit, as the commit step does, and that sync is timed (the "
        f"per-commit cost the ledger adds, median of the last 100 timed commits); {built}. At each mark the "
        "snapshots of the table "
        "and of the ledger are expired (as the maintenance DAG does), then the audit (`tidewater audit`, summary "
        "level: ledger sync and read, coverage and accounting checks, the table's history, Kafka's watermarks "
        "and retention settings) is timed.",
        "",
        "Each mark's audit is timed twice: with `--full` (every batch in the ledger), then after one more "
        "batch, as the next scheduled audit runs (the batches since the last clean audit: one).",
        "",
        "| batches in the ledger | ledger rows | audit `--full` s | audit since the last clean one s | "
        "the view's lag chart s | ledger sync per commit ms (batches timed) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {x['batches']:,} | {x['ledger_rows']:,} | {x['audit_s']:.2f} | {x['since_s']:.2f} | "
        f"{x['lag_s']:.2f} | {x['sync_s'] * 1000:.0f} ({x['sync_at'][0]:,}-{x['sync_at'][1]:,}) |"
        for x in levels
    ]
    first, last = levels[0], levels[-1]
    lines += [
        "",
        f"Audit time, {last['batches']:,} vs {first['batches']:,} batches: `--full` "
        f"{last['audit_s'] / first['audit_s']:.2f}x for {last['batches'] / first['batches']:.0f}x the batches; "
        f"since the last clean audit {last['since_s'] / first['since_s']:.2f}x (it still reads the ledger, in "
        "Arrow, and checks Kafka and the tables' histories whole; the checks run over the new batches only); the "
        f"lag chart {last['lag_s'] / first['lag_s']:.2f}x (it reads the ledger to find the last 100 batches).",
        "",
        f"Deep audit (`--deep`) of a {big['rows']:,}-row table (the offsets of every row projected and checked "
        f"per partition against 100 batches' ranges): {big['deep_s']:.1f} s ({big['rows'] / big['deep_s'] / 1e6:.1f}M "
        f"rows/s) with `--full`; {big['newest_s']:.2f} s ({big['newest_s'] / big['deep_s']:.3f}x) for the newest "
        "batch's ranges, what a deep audit since the last clean one checks (the files holding other offsets are "
        "pruned by their column statistics).",
        END,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
