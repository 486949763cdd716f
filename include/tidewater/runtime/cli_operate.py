"""The command line's commands that change tables: ``run``, ``replay``, ``dead-letters``, ``quarantine``, ``publish``,
``skip``, ``recover-offsets`` and ``maintain``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tidewater.runtime.cli_common import chosen_master, pipeline_arg, progress


def cmd_run(args: argparse.Namespace) -> int:
    from tidewater.runtime.progress import BatchProgress
    from tidewater.steps.lifecycle import run_once

    result = run_once(args.pipeline, master=args.master, progress=BatchProgress(), wait_for_spark=False)
    if args.json:
        print(json.dumps(result))
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    from tidewater.config.parse import load_pipeline
    from tidewater.errors import ConfigError
    from tidewater.ops.maintenance import ACTIONS, maintain, reports_json

    spec = load_pipeline(args.pipeline)
    spec.targets.named(args.table, spec.name)  # a plain pipeline's maintenance names its own table or none
    actions = [a.strip() for a in args.actions.split(",")] if args.actions else None
    for a in actions or []:
        if a not in ACTIONS:
            raise ConfigError(f"--actions: {a!r} is not one of {', '.join(ACTIONS)}")
    if args.json:
        # Spark's JVM writes its log to file descriptor 1: keep stdout for the JSON document alone.
        import os

        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
        try:
            reports = maintain(
                spec, actions=actions, dry_run=args.dry_run, master=chosen_master(spec, args.master), table=args.table, progress=progress
            )
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        print(reports_json(reports))
    else:
        for r in maintain(
            spec, actions=actions, dry_run=args.dry_run, master=chosen_master(spec, args.master), table=args.table, progress=progress
        ):
            print(r.text())
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from tidewater.config.parse import load_pipeline
    from tidewater.ops.replay import run_replay
    from tidewater.plan.replay import ReplayRequest

    spec = load_pipeline(args.pipeline)
    req = ReplayRequest.from_params(
        {
            "topic": args.topic,
            "partitions": args.partitions,
            "start_offset": args.start_offset,
            "end_offset": args.end_offset,
            "start_time": args.start_time,
            "end_time": args.end_time,
            "mode": args.mode or spec.replay_modes[0],
            "dry_run": args.dry_run,
            "tables": args.tables,
        }
    )
    result = run_replay(spec, req, master=args.master, out=None if args.json else print)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    return 0


def cmd_dead_letters(args: argparse.Namespace) -> int:
    from tidewater.config.parse import load_pipeline
    from tidewater.ops import dead_letters
    from tidewater.table.letters import listing

    spec = load_pipeline(args.pipeline)
    say = None if args.json else print
    error_class, batch = args.error_class or None, args.batch or None
    if args.action == "list":
        result = listing(spec, state=args.state, limit=args.limit, error_class=error_class, batch=batch)
        if not args.json:
            print(", ".join(f"{n} {s}" for s, n in result["counts"].items()) + " dead letters")
            for r in result["letters"]:
                print(
                    f"{r['topic']}[{r['partition']}]@{r['offset']} {r['status']:<12} {r['error_class']}: "
                    f"{(r['error_message'] or '')[:120]} (batch {r['letter_batch_id']})"
                )
            if result["matching"] > len(result["letters"]):
                print(f"... {result['matching'] - len(result['letters'])} more (--limit)")
    elif args.action == "retry":
        result = dead_letters.retry(spec, dry_run=args.dry_run, out=say, error_class=error_class, batch=batch)
    else:
        result = dead_letters.drop(spec, reason=args.reason, dry_run=args.dry_run, out=say, error_class=error_class, batch=batch)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    return 0


def add_dead_letters(sub: Any) -> None:
    p = sub.add_parser("dead-letters", help="list dead letters; retry them with the current settings, or drop them")
    p.add_argument(
        "action",
        choices=["list", "retry", "drop"],
        help="list: letters and their state; retry: decode the open letters again and commit those that pass "
        "(once, as a batch of its own); drop: give the open letters up, with --reason",
    )
    pipeline_arg(p)
    p.add_argument("--class", dest="error_class", default="", help="only letters of this error class")
    p.add_argument("--batch", default="", help="only letters this batch dead-lettered")
    p.add_argument(
        "--state",
        default="open",
        choices=["open", "retrying", "resolved", "skipped", "dropped", "all"],
        help="list: letters in this state (default open)",
    )
    p.add_argument("--limit", type=int, default=100, help="list: at most this many letters")
    p.add_argument("--reason", default="", help="drop: why they are given up (kept with each letter)")
    p.add_argument("--dry-run", action="store_true", help="retry, drop: say what would be done; change nothing")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_dead_letters)


def cmd_quarantine(args: argparse.Namespace) -> int:
    import getpass

    from tidewater.config.parse import load_pipeline
    from tidewater.errors import ConfigError
    from tidewater.ops import quarantine

    spec = load_pipeline(args.pipeline)
    if args.action == "list":
        rows = quarantine.list_all(spec, args.table)
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for q in rows:
                v = q["validation"] or {}
                print(
                    f"{q['batch_id']}  {q['table']} branch {q['branch']}  {q['rows']} rows in {q['files']} files  "
                    f"failed {v.get('failed', '?')}/{v.get('checks', '?')} checks ({v.get('suite', '?')})"
                )
            if not rows:
                print("no quarantined batches")
        return 0
    if not args.batch:
        raise ConfigError(f"--batch: required for {args.action}")
    view = quarantine.view_for(spec, args.table)
    by = args.by or getpass.getuser()
    result = (
        quarantine.publish(view, args.batch, by=by)
        if args.action == "publish"
        else quarantine.drop(view, args.batch, reason=args.reason, by=by)
    )
    print(json.dumps(result) if args.json else f"{result['status']} batch {result['batch_id']}: {result['rows']} rows")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from tidewater.config.parse import load_pipeline
    from tidewater.ops.publish import publish_branch

    r = publish_branch(load_pipeline(args.pipeline), args.table)
    print(
        json.dumps(r)
        if args.json
        else f"published branch {r['branch']} of {r['table']}: main at {r['main_after']} ({r['snapshots']} snapshot(s) gained)"
    )
    return 0


def cmd_skip(args: argparse.Namespace) -> int:
    import getpass

    from tidewater.config.parse import load_pipeline
    from tidewater.ops.skip import SkipRequest, skip

    spec = load_pipeline(args.pipeline)
    req = SkipRequest(
        args.topic, args.partition, args.start_offset, args.end_offset, args.reason, args.by or getpass.getuser(), args.dry_run
    )
    result = skip(spec, req)
    if args.json:
        print(json.dumps(result))
    elif result["status"] == "dry-run":
        print(
            f"dry run: would dead-letter {req.topic}[{req.partition}] [{req.start_offset}, {req.end_offset}) and move "
            f"the offset to {req.end_offset}"
        )
    else:
        lost = f", {result['deleted_unread']} deleted by retention unread" if result["deleted_unread"] else ""
        print(
            f"{result['status']}: {result['dead_letters']} records of {req.topic}[{req.partition}] "
            f"[{req.start_offset}, {req.end_offset}) dead-lettered as OperatorSkip{lost} ({result['batch_id']})"
        )
    return 0


def add_skip(sub: Any) -> None:
    p = sub.add_parser("skip", help="dead-letter the records that block a partition and move its offset past them")
    pipeline_arg(p)
    p.add_argument("--topic", required=True, help="the blocked topic")
    p.add_argument("--partition", type=int, required=True, help="the blocked partition")
    p.add_argument(
        "--start-offset",
        type=int,
        required=True,
        help="the partition's committed offset or later (below its log start: records retention deleted)",
    )
    p.add_argument("--end-offset", type=int, required=True, help="exclusive: the first offset ingested again")
    p.add_argument("--reason", required=True, help="why (kept with the dead letters and in the table's history)")
    p.add_argument("--by", default=None, help="who asks (default: the user running the command)")
    p.add_argument("--dry-run", action="store_true", help="check and describe; change nothing")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=cmd_skip)


def cmd_recover_offsets(args: argparse.Namespace) -> int:
    import getpass

    from tidewater.config.parse import load_pipeline
    from tidewater.ops.recover import recover

    doc = recover(load_pipeline(args.pipeline), args.by or getpass.getuser(), dry_run=args.dry_run, confirmed=args.yes)
    if args.json:
        print(json.dumps(doc))
        return 0 if doc["status"] != "refused" else 1
    if doc["status"] == "nothing-to-recover":
        print("nothing to recover: every table's committed offsets are readable")
    for t in doc["tables"]:
        print(f"{t['table']}: {'the ledger and the rows agree' if t['agree'] else 'the evidence does not agree'}")
        print(f"  from the ledger: {json.dumps(t['ledger'])}")
        print(f"  from the rows:   {json.dumps(t['rows']) if t['rows'] is not None else '(no metadata columns)'}")
        for d in t["disagreements"]:
            print(f"  ! {d}")
        print(f"  proposed:        {json.dumps(t['offsets'])}")
    if doc["status"] == "refused":
        print("nothing committed: check the evidence, then run again with --yes to commit the proposal")
    elif doc["status"] == "dry-run":
        print("dry run: nothing committed")
    elif doc["status"] == "committed":
        print(f"committed: {doc['batch_id']} (the planner reads these offsets from now on)")
    return 1 if doc["status"] == "refused" else 0


def add_recover_offsets(sub: Any) -> None:
    p = sub.add_parser(
        "recover-offsets", help="propose a table's lost offsets from the ledger and its rows; commit them when both agree (or with --yes)"
    )
    pipeline_arg(p)
    p.add_argument("--dry-run", action="store_true", help="show the evidence and the proposal; change nothing")
    p.add_argument("--yes", action="store_true", help="commit the proposal even where the evidence does not agree")
    p.add_argument("--by", default=None, help="who asks (default: the user running the command)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=cmd_recover_offsets)


def add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="run one batch (plan, write, validate, commit) without Airflow")
    pipeline_arg(p)
    p.add_argument("--master", default=None, help="Spark master (default: the pipeline's spark.master)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=cmd_run)


def add_replay(sub: Any) -> None:
    p = sub.add_parser("replay", help="re-read an offset range (or time range) into the table(s): replace, append-missing or reapply")
    pipeline_arg(p)
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", default="", help="comma-separated partition numbers (default: all)")
    p.add_argument("--start-offset", type=int, default=None)
    p.add_argument("--end-offset", type=int, default=None, help="exclusive")
    p.add_argument("--start-time", default=None, help="ISO-8601 (naive: UTC); instead of offsets")
    p.add_argument("--end-time", default=None, help="ISO-8601, exclusive")
    p.add_argument(
        "--mode",
        default=None,
        choices=["replace", "append-missing", "reapply"],
        help="default: reapply for change tables, replace otherwise; routed pipelines: the append tables' "
        "mode (their change tables are always reapplied)",
    )
    p.add_argument(
        "--tables",
        default="",
        help="routed pipelines: comma-separated target tables to replay (default: every table the re-read records route to)",
    )
    p.add_argument("--dry-run", action="store_true", help="print rows to delete and to add per partition; change nothing")
    p.add_argument("--master", default=None, help="Spark master (default: the pipeline's spark.master)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_replay)


def add_quarantine(sub: Any) -> None:
    p = sub.add_parser("quarantine", help="list, publish or drop batches quarantined by the quality gate")
    p.add_argument("action", choices=["list", "publish", "drop"])
    pipeline_arg(p)
    p.add_argument("--batch", default=None, help="batch id (publish, drop)")
    p.add_argument("--table", default=None, help="routed pipelines: the target table (publish, drop; list: default all)")
    p.add_argument("--reason", default="", help="drop: why the batch is given up (kept in the drop's record on main)")
    p.add_argument(
        "--by", default=None, help="publish, drop: who decides, kept in the table's history (default: the user running the command)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_quarantine)


def add_publish(sub: Any) -> None:
    p = sub.add_parser("publish", help="fast-forward main to the table's branch (table.branch: write-audit-publish)")
    pipeline_arg(p)
    p.add_argument("--table", default=None, help="the target table (routed pipelines)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_publish)


def add_maintain(sub: Any) -> None:
    p = sub.add_parser("maintain", help="compact, rewrite manifests, expire snapshots, remove orphan files")
    pipeline_arg(p)
    p.add_argument("--table", default=None, help="the table to maintain (default: the pipeline's table)")
    p.add_argument(
        "--actions",
        default=None,
        metavar="A,B",
        help="comma-separated subset of rewrite_data_files, rewrite_manifests, expire_snapshots, "
        "remove_orphan_files (default: those enabled in the pipeline's maintenance section)",
    )
    p.add_argument("--dry-run", action="store_true", help="report what would change; change nothing")
    p.add_argument(
        "--master", default=None, help="Spark master (default: the spark.conn_id Airflow connection's, else the pipeline's spark.master)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_maintain)
