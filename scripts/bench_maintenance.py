"""`make bench-maintenance`: the effect of maintenance on a table built from 50 small batches.

50 batches of pizza events (6 partitions each) are committed through the real committer (files staged
in-process with the Spark task code), plus one abandoned staged batch made 5 days old. Then each
maintenance action runs through `tidewater.ops.maintenance` on a local SparkSession, and a Spark query is
timed before and after. The section between the maintenance markers of BENCHMARKS.md is replaced.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, command_line, fresh_home, write_section

BEGIN, END = "<!-- maintenance:begin -->", "<!-- maintenance:end -->"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--records", type=int, default=12_000, help="records per batch")
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    args = ap.parse_args()
    command = command_line("make bench-maintenance")
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")

    work = fresh_home("bench-maintenance")

    from tidewater.batch import manifest_path, write_json_atomic
    from tidewater.config.parse import load_pipeline
    from tidewater.ops.maintenance import ACTIONS, TableStats, run_action
    from tidewater.plan.ingest import plan_batch
    from tidewater.source.kafka import kafka_settings
    from tidewater.spark import session as spark_session
    from tidewater.steps.lifecycle import commit_step
    from tidewater.table.catalog import load_catalog
    from tidewater.table.summary import committed_state
    from tidewater.write.job import run_inline
    from tidewater_dev import broker as embedded
    from tidewater_dev.sample_data import pizza_events, produce

    b = embedded.start(log_path=work / "broker.log")
    try:
        path = work / "events.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": "events",
                    "topics": ["events"],
                    "schedule": None,
                    "kafka": {"bootstrap_servers": b.bootstrap},
                    "table": {"identifier": "bench.events"},
                    "validation": {"not_null": ["order_id"]},
                    "maintenance": {"expire_snapshots": {"older_than_hours": 0, "retain_last": 5}},
                }
            )
        )
        spec = load_pipeline(path)
        settings = kafka_settings(spec)

        def stage():
            plan, plan_path = plan_batch(spec)
            manifest = run_inline(plan, spec, settings)
            write_json_atomic(manifest_path(plan_path), manifest.to_json())
            return plan, manifest, plan_path

        print(f"== {args.batches} batches of {args.records:,} records", flush=True)
        t0 = time.monotonic()
        for i in range(args.batches):
            produce(b.bootstrap, "events", pizza_events(args.records, seed=i), partitions=6)
            plan, manifest, _ = stage()
            commit_step(spec, plan, manifest)
        build_s = time.monotonic() - t0
        # an abandoned batch: staged, never committed, 5 days old
        produce(b.bootstrap, "events", pizza_events(args.records, seed=10_000), partitions=6)
        _, abandoned, plan_path = stage()
        old = time.time() - 5 * 24 * 3600
        for f in abandoned.data_files:
            os.utime(f.file_path.replace("file://", ""), (old, old))
        for p in [*plan_path.parent.iterdir(), plan_path.parent]:
            os.utime(p, (old, old))

        catalog = load_catalog(spec)
        offsets_before = committed_state(catalog.load_table("bench.events")).offsets
        spark = spark_session.session(spec, app_name="bench-maintenance", master="local[2]")
        query = f"SELECT count(*) AS n, count(DISTINCT store_id) AS stores FROM {spec.catalog.name}.bench.events"

        def timed_query() -> tuple[float, int]:
            best = float("inf")
            for _ in range(3):
                t = time.monotonic()
                n = spark.sql(query).collect()[0]["n"]
                best = min(best, time.monotonic() - t)
            spark_session.release_catalog(spark, spec)
            return best, n

        q_before, n_before = timed_query()
        start_stats = TableStats.of(catalog.load_table("bench.events"))
        reports = []
        for action in ACTIONS:
            print(f"   {action}", flush=True)
            reports.append(run_action(spark, spec, action))
        q_after, n_after = timed_query()
        table = catalog.load_table("bench.events")
        assert n_before == n_after == args.batches * args.records, (n_before, n_after)
        assert committed_state(table).offsets == offsets_before
        spark.stop()
    finally:
        b.stop()

    end = TableStats.of(table)
    lines = [
        BEGIN,
        "## Maintenance on a table built from 50 batches",
        "",
        f"Produced by `{command}` on {started} (UTC): {args.batches} batches x {args.records:,} records "
        f"(6 partitions, one file per partition per batch; built in {build_s:.0f} s), plus one abandoned staged "
        "batch 5 days old. Expiry set to `older_than_hours: 0, retain_last: 5` to show its effect; orphans at the "
        "default 72 h. Rows and committed offsets checked equal before and after.",
        "",
        "| action | seconds | data files | MB | manifests | snapshots | details |",
        "| --- | ---: | --- | --- | --- | --- | --- |",
    ]
    for r in reports:
        keep = (
            "rewritten_data_files_count",
            "added_data_files_count",
            "rewritten_manifests_count",
            "added_manifests_count",
            "deleted_data_files_count",
            "deleted_manifest_files_count",
            "deleted_manifest_lists_count",
            "orphan_files",
            "orphan_bytes",
            "staging_dirs_removed",
            "kept_for_offsets",
        )
        details = ", ".join(f"{k}={v}" for k, v in r.details.items() if k in keep)
        lines.append(
            f"| {r.action} | {r.seconds:.1f} | {r.before.data_files} -> {r.after.data_files} | "
            f"{r.before.data_bytes / 1e6:.1f} -> {r.after.data_bytes / 1e6:.1f} | {r.before.manifests} -> {r.after.manifests} | "
            f"{r.before.snapshots} -> {r.after.snapshots} | {details} |"
        )
    lines += [
        "",
        f"Whole table: {start_stats.data_files} files / {start_stats.manifests} manifests / {start_stats.snapshots} snapshots "
        f"-> {end.data_files} / {end.manifests} / {end.snapshots}. "
        f"Spark `{query.split(' FROM ')[0]}` (best of 3): {q_before:.2f} s before, {q_after:.2f} s after "
        f"({q_before / q_after:.1f}x).",
        END,
    ]
    section = "\n".join(lines)
    write_section(args.output, BEGIN, END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
