"""`make bench-cdc`: what applying a change batch costs, and whether it grows with the changes or the table.

Tables of 1M and 10M rows (`prices(id, item, price)` plus the Kafka metadata columns) are built directly
(pyiceberg appends of 1M-row files, not through Kafka). Batches of 100k changes (40% inserts of new keys, 50%
updates, 10% deletes, keys uniform at random) are applied with the change commit's own functions
(`transform.changes.net_changes`, `table.row_delta.live_rows` / `commit.changes.write_upserts` / `table.row_delta.write_position_deletes`,
and one row delta through `commit.primitive.commit`). Reported: batch time by phase, bytes and files written,
a full scan's time after 1, 10 and 20 batches and after compaction (Spark `rewrite_data_files` +
`rewrite_position_delete_files`), and the 10M/1M batch-time ratio. Side by side, on copies of the same tables
and the same batch: pyiceberg's `upsert()` + `delete()` (copy-on-write), the naive peer.
Writes a section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "include"))
BEGIN, END = "<!-- cdc:begin -->", "<!-- cdc:end -->"
OPS = {"I": "insert", "U": "update", "D": "delete"}


def build(catalog, ident: str, rows: int, last_properties: dict[str, str] | None = None):
    """``rows`` rows in 1M-row files; ``last_properties`` go on the last append's snapshot."""
    import numpy as np
    import pyarrow as pa

    from tidewater.table.catalog import create_table

    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("item", pa.string()),
            ("price", pa.float32()),
            ("_kafka_partition", pa.int32()),
            ("_kafka_offset", pa.int64()),
        ]
    )
    table = create_table(catalog, ident, schema, {"format-version": "2"})
    for start in range(0, rows, 1_000_000):
        ids = np.arange(start, min(rows, start + 1_000_000), dtype=np.int64)
        table.append(
            pa.table(
                {
                    "id": ids,
                    "item": pa.array(["item"] * len(ids)),
                    "price": (ids % 1000).astype(np.float32),
                    "_kafka_partition": (ids % 6).astype(np.int32),
                    "_kafka_offset": ids,
                },
                schema=schema,
            ),
            snapshot_properties=(last_properties or {}) if start + 1_000_000 >= rows else {},
        )
    return catalog.load_table(ident)


def changes(rows: int, n: int, seed: int, next_id: int):
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    kind = rng.random(n)
    ops = np.where(kind < 0.4, "I", np.where(kind < 0.9, "U", "D"))
    ids = np.where(ops == "I", next_id + np.arange(n), rng.integers(0, rows, n))
    return pa.table(
        {
            "id": ids.astype(np.int64),
            "item": pa.array(["changed"] * n),
            "price": rng.random(n).astype(np.float32),
            "_kafka_partition": (ids % 6).astype(np.int32),
            "_kafka_offset": np.arange(n, dtype=np.int64) + seed * n,
            "op": ops,
        }
    )


def apply_batch(catalog, ident: str, batch, seq: int) -> dict:
    """One change batch through the change commit's functions; seconds by phase, bytes and files."""
    from tidewater.commit.changes import write_upserts
    from tidewater.commit.primitive import Change, commit
    from tidewater.table.catalog import load_table
    from tidewater.table.row_delta import live_rows, write_position_deletes
    from tidewater.transform.changes import net_changes

    t0 = time.perf_counter()
    table = load_table(catalog, ident)
    net = net_changes(batch, ["id"], "op", OPS)
    t1 = time.perf_counter()
    files = write_upserts(table, net.upserts.drop_columns(["op"]), f"bench-{seq}")
    t2 = time.perf_counter()
    hits, _ = live_rows(table, net.keys, ["id"])
    t3 = time.perf_counter()
    deletes = write_position_deletes(table, hits, f"bench-{seq}")
    t4 = time.perf_counter()
    commit(catalog, ident, lambda _t: Change({"bench": str(seq)}, tuple(files), deletes=tuple(deletes)), marker=None, what=f"bench {seq}")
    t5 = time.perf_counter()
    return {
        "net": t1 - t0,
        "upserts": t2 - t1,
        "find": t3 - t2,
        "deletes": t4 - t3,
        "commit": t5 - t4,
        "total": t5 - t0,
        "bytes": sum(f.file_size_in_bytes for f in files) + sum(d.file_size_in_bytes for d in deletes),
        "data_files": len(files),
        "delete_files": len(deletes),
    }


def scan_seconds(catalog, ident: str) -> tuple[float, int]:
    t = time.perf_counter()
    n = catalog.load_table(ident).scan().to_arrow().num_rows
    return time.perf_counter() - t, n


def copy_on_write(catalog, ident: str, batch) -> float:
    """pyiceberg's upsert (net upserts) and delete (net deletes): both rewrite every file holding a changed key."""
    import pyarrow.compute as pc
    from pyiceberg.expressions import In

    from tidewater.transform.changes import net_changes

    net = net_changes(batch, ["id"], "op", OPS)
    table = catalog.load_table(ident)
    t = time.perf_counter()
    table.upsert(net.upserts.drop_columns(["op"]).cast(table.schema().as_arrow()), join_cols=["id"])
    gone = net.keys.filter(net.last_deletes).column("id")
    if len(gone):
        catalog.load_table(ident).delete(In("id", pc.unique(gone).to_pylist()))
    return time.perf_counter() - t


def end_to_end(catalog, args) -> dict[str, list[float]]:
    """The same Debezium batches through `tidewater run` (Kafka, spark-submit, gate, commit) into a big and a
    small table, alternating: the batch time an operator sees."""
    import json

    import numpy as np
    import yaml

    from tidewater.batch import offsets_to_json
    from tidewater.steps.lifecycle import run_once
    from tidewater.table.summary import OFFSETS
    from tidewater_dev import broker as embedded
    from tidewater_dev.sample_data import produce

    home = Path(os.environ["TIDEWATER_HOME"])
    b = embedded.start(log_path=home / "broker.log")
    times: dict[str, list[float]] = {"big": [], "small": []}
    try:
        paths = {}
        for name, rows in (("big", args.big), ("small", args.small)):
            # the table starts at offset 0 of the (empty) topic, as if it had been ingested up to there
            build(catalog, f"bench.e2e_{name}", rows, {OFFSETS: json.dumps(offsets_to_json({"cdc": {0: 0, 1: 0}}))})
            paths[name] = home / f"e2e_{name}.yaml"
            paths[name].write_text(
                yaml.safe_dump(
                    {
                        "name": f"e2e_{name}",
                        "topics": ["cdc"],
                        "kafka": {"bootstrap_servers": b.bootstrap},
                        "format": {"value": "debezium"},
                        "spark": {"master": "local[2]"},
                        "batch": {"max_records": 1_000_000, "records_per_task": 1_000_000},
                        "table": {"identifier": f"bench.e2e_{name}", "id_columns": ["id"], "upsert": True},
                    }
                )
            )
        for round_ in range(2):
            rng = np.random.default_rng(100 + round_)
            values = []
            fresh = args.big + round_ * args.changes  # new keys: in neither table
            for i in range(args.changes):  # the mix of the commit benchmark: 40% inserts, 50% updates, 10% deletes
                roll = rng.random()
                op = "c" if roll < 0.4 else "u" if roll < 0.9 else "d"
                k = fresh + i if op == "c" else int(rng.integers(0, args.small))  # existing keys are in both tables
                row = {"id": k, "item": "changed", "price": 1.5}
                values.append(json.dumps({"before": None if op == "c" else row, "after": None if op == "d" else row, "op": op}).encode())
            produce(b.bootstrap, "cdc", values, partitions=2)
            for name in ("big", "small"):
                t = time.perf_counter()
                out = run_once(paths[name])
                times[name].append(time.perf_counter() - t)
                assert out["records"] == args.changes, out
                print(f"end to end round {round_ + 1} on {name}: {times[name][-1]:.2f} s", flush=True)
    finally:
        b.stop()
    return times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", type=int, default=10_000_000)
    ap.add_argument("--small", type=int, default=1_000_000)
    ap.add_argument("--changes", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    args = ap.parse_args()
    from benchlib import command_line, fresh_home, write_section

    fresh_home("bench-cdc")
    from tidewater.config.parse import parse_pipeline
    from tidewater.ops.maintenance import maintain
    from tidewater.table.catalog import load_catalog

    spec = parse_pipeline(
        {
            "name": "bench_cdc",
            "topics": ["x"],
            "kafka": {"bootstrap_servers": "127.0.0.1:1"},
            "table": {"identifier": "bench.big", "id_columns": ["id"], "upsert": True},
            "maintenance": {"rewrite_data_files": {"min_input_files": 2, "delete_file_threshold": 1}},
        }
    )
    catalog = load_catalog(spec)
    catalog.create_namespace_if_not_exists("bench")
    built = {}
    for name, rows in (("big", args.big), ("small", args.small), ("big_cow", args.big), ("small_cow", args.small)):
        t = time.perf_counter()
        build(catalog, f"bench.{name}", rows)
        built[name] = time.perf_counter() - t
        print(f"built bench.{name}: {rows:,} rows in {built[name]:.1f} s", flush=True)

    first = changes(args.big, args.changes, 0, args.big)
    small_first = changes(args.small, args.changes, 0, args.small)
    # the same batch shape on both tables, alternating, median of 3 rounds after a warm-up
    results = {"big": [], "small": []}
    scans = {}
    seq = 0
    for b in range(args.batches):
        for name, rows in (("big", args.big), ("small", args.small)):
            if b == 0:
                batch = first if name == "big" else small_first
            else:
                batch = changes(rows, args.changes, b, rows + b * args.changes)
            r = apply_batch(catalog, f"bench.{name}", batch, seq)
            seq += 1
            results[name].append(r)
            print(f"batch {b + 1} on {name}: {r['total']:.2f} s ({r['data_files']} data, {r['delete_files']} delete files)", flush=True)
        if b + 1 in (1, 10, 20):
            scans[b + 1] = scan_seconds(catalog, "bench.big")
    spark = None
    t = time.perf_counter()
    reports = maintain(spec, actions=["rewrite_data_files", "rewrite_position_delete_files"])
    compaction = time.perf_counter() - t
    scans["compacted"] = scan_seconds(catalog, "bench.big")
    del spark

    cow = {"big": copy_on_write(catalog, "bench.big_cow", first), "small": copy_on_write(catalog, "bench.small_cow", small_first)}
    e2e = end_to_end(catalog, args)

    def median(xs: list[float]) -> float:
        s = sorted(xs)
        return s[len(s) // 2]

    big = median([r["total"] for r in results["big"]])
    small = median([r["total"] for r in results["small"]])
    phase = {k: median([r[k] for r in results["big"]]) for k in ("net", "upserts", "find", "deletes", "commit")}
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        BEGIN,
        "## Applying change batches (issue 13): merge-on-read position deletes",
        "",
        f"`{command_line('make bench-cdc')}`, {stamp}, this machine (2 cores). Tables of {args.big:,} and {args.small:,} "
        f"rows built directly; {args.batches} batches of {args.changes:,} changes each (40% inserts, 50% updates, 10% "
        "deletes, keys uniform at random) applied to each, alternating; medians over the batches.",
        "",
        "| | 10M-row table | 1M-row table |".replace("10M", f"{args.big / 1e6:g}M").replace("1M-row", f"{args.small / 1e6:g}M-row"),
        "| --- | --- | --- |",
        f"| batch time (median) | {big:.2f} s | {small:.2f} s |",
        f"| ratio big/small | {big / small:.2f} | |",
        f"| bytes written per batch (median) | {median([r['bytes'] for r in results['big']]) / 1e6:.1f} MB | "
        f"{median([r['bytes'] for r in results['small']]) / 1e6:.1f} MB |",
        f"| data + delete files per batch (median) | {median([r['data_files'] for r in results['big']])} + "
        f"{median([r['delete_files'] for r in results['big']])} | {median([r['data_files'] for r in results['small']])} + "
        f"{median([r['delete_files'] for r in results['small']])} |",
        f"| pyiceberg upsert + delete (copy-on-write), first batch | {cow['big']:.2f} s | {cow['small']:.2f} s |",
        f"| end to end: `tidewater run` of {args.changes:,} Debezium JSON changes, same mix (Kafka, spark-submit, gate, commit), "
        f"2 rounds | {' / '.join(f'{x:.1f}' for x in e2e['big'])} s | {' / '.join(f'{x:.1f}' for x in e2e['small'])} s |",
        f"| end-to-end ratio big/small (sum of rounds) | {sum(e2e['big']) / sum(e2e['small']):.2f} | |",
        "",
        "Phases of a batch on the big table (median): " + ", ".join(f"{k} {v:.2f} s" for k, v in phase.items()) + ".",
        "",
        "Full scan of the big table (pyiceberg `to_arrow`, deletes applied): "
        + ", ".join(f"after {k} batches {v[0]:.2f} s ({v[1]:,} rows)" for k, v in scans.items() if k != "compacted")
        + f"; after compaction ({compaction:.0f} s: "
        + "; ".join(r.text().split(":", 1)[1].split(";")[0] for r in reports)
        + f") {scans['compacted'][0]:.2f} s.",
        END,
    ]
    write_section(args.output, BEGIN, END, "\n".join(lines))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    raise SystemExit(main())
