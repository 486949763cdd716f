"""`make bench-routing`: 100 tables fed from one topic by dynamic routing.

One topic (6 partitions) of events whose `tenant` field takes 100 values; the pipeline routes each
record to `bench.tenant_<value>`. Two batches run through the real steps (plan, spark-submit write,
gate, commit): the first creates the 100 tables, the second appends to them. For comparison the same
records go through a one-table pipeline. Reported: each step's time, the commit time per table
(min / median / max) and the checkpoint commit; rows per table and offsets are checked. The section
between the routing markers of BENCHMARKS.md is replaced.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, command_line, fresh_home, timed_batch, write_section

BEGIN, END = "<!-- routing:begin -->", "<!-- routing:end -->"


def events(n: int, tenants: int, seed: int) -> list[bytes]:
    return [
        json.dumps(
            {
                "id": seed * 10_000_000 + i,
                "tenant": f"t{i % tenants:03d}",
                "amount": i % 997,
                "note": "x" * (i % 40),
                "at": "2024-01-04 12:00:00",
            }
        ).encode()
        for i in range(n)
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", type=int, default=100)
    ap.add_argument("--records", type=int, default=300_000, help="records per batch")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    args = ap.parse_args()
    command = command_line("make bench-routing")
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")

    work = fresh_home("bench-routing")

    from tidewater.config.parse import load_pipeline
    from tidewater.table.catalog import load_catalog, load_table
    from tidewater.table.summary import committed_state
    from tidewater_dev import broker as embedded
    from tidewater_dev.sample_data import produce

    b = embedded.start(log_path=work / "broker.log")
    base = {
        "schedule": None,
        "kafka": {"bootstrap_servers": b.bootstrap, "read_timeout_seconds": 60},
        "batch": {"max_records": args.records},
        "validation": {"not_null": ["id"]},
    }
    try:
        routed_path = work / "tenants.yaml"
        routed_path.write_text(
            yaml.safe_dump(
                {
                    **base,
                    "name": "tenants",
                    "topics": ["tenants"],
                    "table": {"identifier": ""},
                    "routing": {"field": "tenant", "dynamic": True, "table_template": "tenant_{value}", "namespace": "bench"},
                }
            )
        )
        single_path = work / "single.yaml"
        single_path.write_text(yaml.safe_dump({**base, "name": "single", "topics": ["single"], "table": {"identifier": "bench.single"}}))
        routed, single = load_pipeline(routed_path), load_pipeline(single_path)

        runs = []
        for i in range(2):
            produce(b.bootstrap, "tenants", events(args.records, args.tables, seed=i), partitions=6)
            print(f"== routed batch {i + 1}: {args.records:,} records -> {args.tables} tables", flush=True)
            runs.append(timed_batch(routed, args.master))
        produce(b.bootstrap, "single", events(args.records, args.tables, seed=0), partitions=6)
        print(f"== one-table batch: {args.records:,} records", flush=True)
        one = timed_batch(single, args.master)

        catalog = load_catalog(routed)
        per_table = [
            load_table(catalog, f"bench.tenant_t{t:03d}").scan(selected_fields=("id",)).to_arrow().num_rows for t in range(args.tables)
        ]
        assert sum(per_table) == 2 * args.records and len(set(per_table)) <= 2, per_table
        assert committed_state(load_table(catalog, routed.checkpoint_table())).offsets["tenants"] == {
            p: 2 * args.records // 6 + (1 if p < (2 * args.records) % 6 else 0) for p in range(6)
        }
    finally:
        b.stop()

    def row(name: str, r: dict) -> str:
        return (
            f"| {name} | {r['records']:,} | {r['files']} | {r['plan']:.1f} | {r['write']:.1f} | {r['data_path'] or 0:.1f} | "
            f"{r['validate']:.1f} | {r['commit']:.1f} | {r['total']:.1f} |"
        )

    lines = [
        BEGIN,
        f"## {args.tables} tables from one topic (dynamic routing)",
        "",
        f"Produced by `{command}` on {started} (UTC), Spark `{args.master}`: one topic, 6 partitions, {args.records:,} "
        f"records per batch with a `tenant` field of {args.tables} values, routed to `bench.tenant_<value>` "
        "(`routing.dynamic`). Batch 1 creates the tables, batch 2 appends; the same records through a one-table "
        f"pipeline for comparison. Rows per table ({min(per_table):,}-{max(per_table):,}) and offsets checked.",
        "",
        "| batch | records | files | plan s | write s | data path s | validate s | commit s | total s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        row("routed, creates tables", runs[0]),
        row("routed, appends", runs[1]),
        row("one table", one),
        "",
        "| batch | table commits | per table min / median / max s | checkpoint s |",
        "| --- | ---: | --- | ---: |",
    ]
    for name, r in (("routed, creates tables", runs[0]), ("routed, appends", runs[1])):
        t = [x.seconds for x in r["result"].tables if x.status != "checkpoint"]
        ck = [x.seconds for x in r["result"].tables if x.status == "checkpoint"]
        lines.append(f"| {name} | {len(t)} | {min(t):.3f} / {statistics.median(t):.3f} / {max(t):.3f} | {ck[0]:.3f} |")
    ratio = runs[1]["total"] / one["total"]
    data_ratio = (runs[1]["data_path"] or 0) / (one["data_path"] or 1)
    commits = sum(x.seconds for x in runs[1]["result"].tables)
    lines += [
        "",
        f"Same records, appending batch: routing into {args.tables} tables takes {ratio:.1f}x the end-to-end time of "
        f"one table and {data_ratio:.1f}x its data path (each task keeps a file open per table it sees and writes "
        f"{runs[1]['files'] // max(1, one['files'])}x the files). The {args.tables} commits run one after another and "
        f"took {commits:.1f} s together; Spark start-up dominates both batches at this size.",
        END,
    ]
    section = "\n".join(lines)
    write_section(args.output, BEGIN, END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
