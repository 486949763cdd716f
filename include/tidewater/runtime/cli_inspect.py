"""The command line's commands that read: ``status``, ``history``, ``audit``, ``sql`` and ``data-docs``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tidewater.errors import TidewaterError
from tidewater.runtime.cli_common import chosen_master, pipeline_arg, progress


def cmd_status(args: argparse.Namespace) -> int:
    from tidewater.config.parse import load_pipeline
    from tidewater.ops.status import status

    st = status(load_pipeline(args.pipeline))
    for problem in st["problems"]:
        print(f"tidewater: warning: {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps(st, indent=1))
        return 1 if st["problems"] else 0
    print(f"pipeline {st['pipeline']} -> {st['table']}")
    print(f"  last snapshot: {st['last_snapshot_id']} at {st['last_snapshot_at']} (batch {st['last_batch_id']})")
    print(f"  valid through: {st['valid_through']}")
    print(f"  total lag:     {st['total_lag']}")
    print(
        f"  dead letters:  {st['dead_letters']} in {st['dead_letter_table']} (last batch: "
        f"{st['last_batch_dead_letters']} dead-lettered, {st['last_batch_skipped']} skipped)"
    )
    if st.get("last_batch_changes"):
        print(f"  last changes:  {_changes_text(st['last_batch_changes'])}")
    print(f"  {'topic':<30} {'part':>4} {'committed':>12} {'end':>12} {'lag':>10}")
    for p in st["partitions"]:
        committed = "-" if p["committed"] is None else p["committed"]
        print(f"  {p['topic']:<30} {p['partition']:>4} {committed:>12} {p['end']:>12} {p['lag']:>10}")
    for waiting in st["waiting"]:
        print(f"  waiting: {waiting}")
    return 1 if st["problems"] else 0  # a partition the next batch cannot plan


def cmd_audit(args: argparse.Namespace) -> int:
    """Exit 0 when the table is exactly its topic as far as the checks see, 1 when not, 2 on an error."""
    from tidewater.audit.pipeline import audit
    from tidewater.config.parse import load_pipeline

    try:
        report = audit(load_pipeline(args.pipeline), args.table, deep=args.deep, full=args.full, progress=progress if args.deep else None)
    except TidewaterError as e:
        print(f"tidewater: {'transient' if e.transient else 'error'}: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
        return 0 if report.clean else 1
    since = f"committed since the last clean audit's, {report.since} (--full: every batch)" if report.since else "in the ledger"
    print(f"audit of {report.table} (pipeline {report.pipeline}): {report.batches} batches {since}")
    for f in report.findings:
        print(f"  {f.text()}")
    print(f"  {'topic':<30} {'part':>4} {'log start':>12} {'committed':>12} {'log end':>12}")
    for p in report.partitions:
        committed = "-" if p["committed"] is None else p["committed"]
        print(f"  {p['topic']:<30} {p['partition']:>4} {p['log_start']:>12} {committed:>12} {p['log_end']:>12}")
    errors = sum(f.severity == "error" for f in report.findings)
    print("clean" if report.clean else f"{errors} discrepanc{'y' if errors == 1 else 'ies'}")
    return 0 if report.clean else 1


def cmd_history(args: argparse.Namespace) -> int:
    from tidewater.config.parse import load_pipeline
    from tidewater.ops.status import history

    rows = history(load_pipeline(args.pipeline))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'snapshot':>20} {'at':<26} {'op':<8} {'records':>8} {'files':>5}  batch / offsets")
    for r in rows:
        print(
            f"{r['snapshot_id']:>20} {r['at']:<26} {r['operation'] or '':<8} {r['records'] or '':>8} "
            f"{r['added_files'] or '':>5}  {r['batch_id'] or ''}"
        )
        if r["offsets"]:
            print(f"{'':>63}offsets {r['offsets']}  valid-through {r['valid_through']}")
        if r.get("changes"):
            print(f"{'':>63}{_changes_text(r['changes'])}")
    return 0


def _changes_text(c: dict) -> str:
    text = ", ".join(f"{c.get(k, 0)} {k}" for k in ("inserted", "updated", "deleted", "noop"))
    if c.get("cross_partition_keys"):
        text += f"; {c['cross_partition_keys']} key(s) changed in two partitions"
    return text


def cmd_sql(args: argparse.Namespace) -> int:
    from tidewater.config.parse import load_pipeline
    from tidewater.spark import session as spark_session

    spec = load_pipeline(args.pipeline)
    spark = spark_session.session(spec, app_name="tidewater-sql", master=chosen_master(spec, args.master))
    try:
        spark.sql(f"USE {spec.catalog.name}")
        spark.sql(args.query).show(args.limit, truncate=False)
    finally:
        spark.stop()
    return 0


def add_status(sub: Any) -> None:
    p = sub.add_parser("status", help="committed offsets, end offsets and lag per partition")
    pipeline_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_status)


def add_audit(sub: Any) -> None:
    p = sub.add_parser(
        "audit",
        help="check that the table is exactly its topic: ranges, counts, outside writes, Kafka (exit 0 clean, 1 discrepancies, 2 error)",
    )
    pipeline_arg(p)
    p.add_argument("--table", help="the table to audit (default: the pipeline's; routed pipelines: one target table, default all)")
    p.add_argument(
        "--deep",
        action="store_true",
        help="also every row's source offset (format.metadata): none twice, "
        "none both a row and a dead letter, none missing unless skipped or absent from Kafka",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="check every batch in the ledger (default: the batches committed "
        "since the last clean audit; Kafka, dead letters and outside writes are checked whole either way)",
    )
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(fn=cmd_audit)


def add_history(sub: Any) -> None:
    p = sub.add_parser("history", help="the table's snapshots with batch ids and offsets")
    pipeline_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_history)


def add_sql(sub: Any) -> None:
    p = sub.add_parser("sql", help="run a Spark SQL query on the pipeline's catalog")
    pipeline_arg(p)
    p.add_argument("query")
    p.add_argument("--limit", type=int, default=20, help="rows to show")
    p.add_argument(
        "--master", default=None, help="Spark master (default: the spark.conn_id Airflow connection's, else the pipeline's spark.master)"
    )
    p.set_defaults(fn=cmd_sql)


def cmd_data_docs(args: argparse.Namespace) -> int:
    from tidewater.config.parse import load_pipeline
    from tidewater.quality.data_docs import render_pending, site_dir

    spec = load_pipeline(args.pipeline)
    pages = render_pending(spec, args.batch)
    for page in pages:
        print(page)
    print(f"{len(pages)} page(s) rendered; site {site_dir(spec) / 'index.html'}", file=sys.stderr)
    return 0


def add_data_docs(sub: Any) -> None:
    p = sub.add_parser("data-docs", help="render the Data Docs pages of validated batches that have none yet")
    pipeline_arg(p)
    p.add_argument("--batch", default=None, help="only this batch id (default: every batch without a page)")
    p.set_defaults(fn=cmd_data_docs)
