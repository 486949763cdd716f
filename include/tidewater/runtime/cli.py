"""The ``tidewater`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from tidewater import __version__
from tidewater.errors import TidewaterError


def _pipeline_arg(p: argparse.ArgumentParser, folder: bool = False) -> None:
    """The pipeline a command acts on: its name (looked up in the pipelines folder) or ``--pipeline FILE``. With
    ``folder``, neither means every pipeline file of the folder."""
    p.add_argument(
        "pipeline_name", nargs="?", metavar="NAME", help="the pipeline's name, looked up in the pipelines folder ($TIDEWATER_PIPELINES_DIR)"
    )
    p.add_argument("--pipeline", metavar="FILE", help="the pipeline file (YAML), instead of a NAME")
    p.set_defaults(pipeline_folder=folder)


def _resolve_pipeline(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Sets ``args.pipeline`` (a file) from the NAME, or checks that exactly one of NAME and --pipeline was given."""
    if not hasattr(args, "pipeline_folder"):
        return
    if args.pipeline_name and args.pipeline:
        ap.error(f"{args.command}: give a pipeline NAME or --pipeline FILE, not both")
    if args.pipeline_name:
        from tidewater.config.parse import find_pipeline

        args.pipeline = str(find_pipeline(args.pipeline_name))
    elif not args.pipeline and not args.pipeline_folder:
        ap.error(f"{args.command}: which pipeline? Give its NAME (from the pipelines folder) or --pipeline FILE")


def cmd_validate(args: argparse.Namespace) -> int:
    """One pipeline (NAME or --pipeline): its first error fails the command. No pipeline: every file of the pipelines
    folder, each reported with all of its problems (and pipelines that share a name), then the exit code."""
    from tidewater.config.locations import pipelines_dir
    from tidewater.config.parse import discover_pipelines
    from tidewater.errors import ConfigError

    if args.pipeline:
        report = _validated(Path(args.pipeline))
        if report["problems"]:
            raise ConfigError(f"{args.pipeline}: " + "; ".join(report["problems"]))
        reports = [report]
    else:
        paths = discover_pipelines()
        if not paths:
            raise ConfigError(
                f"no pipeline files (*.yaml, *.yml) in {pipelines_dir()}: set TIDEWATER_PIPELINES_DIR, or give a NAME or --pipeline FILE"
            )
        reports = [_validated(p) for p in paths]
        _shared_names(reports)
    failed = [r for r in reports if r["problems"]]
    if args.json:
        print(json.dumps({"ok": not failed, "pipelines": reports}, indent=1))
    else:
        for r in reports:
            if r["problems"]:
                print(f"{r['file']}: {len(r['problems'])} problem(s)", *(f"  - {x}" for x in r["problems"]), sep="\n")
            else:
                print(f"{r['file']}: ok ({r['summary']})")
        if len(reports) > 1:
            print(f"{len(reports) - len(failed)} of {len(reports)} pipeline files are valid")
    return 2 if failed else 0


def _validated(path: Path) -> dict[str, Any]:
    """What ``validate`` says of one file: the pipeline, its DAG and targets, or every problem (a ConfigError's)."""
    from tidewater.config.parse import load_pipeline
    from tidewater.config.validate import check_hosts
    from tidewater.errors import ConfigError, problems_of
    from tidewater.runtime.hosts import airflow_executor

    try:
        spec = load_pipeline(path)
        check_hosts(spec, airflow_executor())  # as the DAG factory does: per-host places under a multi-host executor
    except ConfigError as e:
        prefix = f"{path}: "
        return {"file": str(path), "pipeline": None, "problems": [x.removeprefix(prefix) for x in problems_of(e)]}
    return {
        "file": str(path),
        "pipeline": spec.name,
        "dag_id": spec.dag_id,
        "problems": [],
        "summary": f"pipeline {spec.name}, DAG {spec.dag_id}, {len(spec.topics)} topic(s)"
        f"{' + pattern ' + repr(spec.topic_pattern) if spec.topic_pattern else ''} -> {spec.describe_targets()}",
    }


def _shared_names(reports: list[dict[str, Any]]) -> None:
    """Two files of one folder naming the same pipeline would give the same DAG ids: a problem of each."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for r in reports:
        if r["pipeline"]:
            by_name.setdefault(r["pipeline"], []).append(r)
    for name, same in by_name.items():
        for r in same if len(same) > 1 else []:
            others = ", ".join(Path(o["file"]).name for o in same if o is not r)
            r["problems"].append(f"name: pipeline {name!r} is also the name in {others} (its DAG ids would clash)")


def cmd_run(args: argparse.Namespace) -> int:
    from tidewater.runtime.progress import BatchProgress
    from tidewater.steps.lifecycle import run_once

    result = run_once(args.pipeline, master=args.master, progress=BatchProgress(), wait_for_spark=False)
    if args.json:
        print(json.dumps(result))
    return 0


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
        report = audit(load_pipeline(args.pipeline), args.table, deep=args.deep, full=args.full, progress=_progress if args.deep else None)
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


def _master(spec: Any, given: str | None) -> str:
    """``--master``, else the master of the Airflow connection the DAGs use (``spark.conn_id``, e.g. from
    ``AIRFLOW_CONN_TIDEWATER_SPARK``), else the pipeline's ``spark.master``."""
    if given:
        return given
    from tidewater.runtime.airflow import spark_master

    return spark_master(spec.spark.conn_id, spec.spark.master)


def cmd_sql(args: argparse.Namespace) -> int:
    from tidewater.config.parse import load_pipeline
    from tidewater.spark import session as spark_session

    spec = load_pipeline(args.pipeline)
    spark = spark_session.session(spec, app_name="tidewater-sql", master=_master(spec, args.master))
    try:
        spark.sql(f"USE {spec.catalog.name}")
        spark.sql(args.query).show(args.limit, truncate=False)
    finally:
        spark.stop()
    return 0


def _dev_tool(name: str, command: str) -> Any:
    """A module of the checkout's development tools (``include/tidewater_dev``: the embedded broker, the local Spark
    Connect server, the sample data), which the installed package does not ship."""
    import importlib

    from tidewater.errors import ConfigError

    try:
        return importlib.import_module(f"tidewater_dev.{name}")
    except ModuleNotFoundError as e:
        if e.name not in ("tidewater_dev", f"tidewater_dev.{name}"):
            raise
        raise ConfigError(
            f"`tidewater {command}` is a development tool of a Tidewater checkout (include/tidewater_dev, "
            "used by `make demo` and the tests); the installed package does not ship it. Use your own "
            "Kafka cluster and Spark, or run it from a checkout"
        ) from None


def cmd_broker(args: argparse.Namespace) -> int:
    broker = _dev_tool("broker", "broker")

    if args.action == "start":
        b = broker.start_background(args.port or 19092)
        print(f"embedded broker running: pid {b.pid}, bootstrap {b.bootstrap}, log {b.log_path}")
    elif args.action == "stop":
        print("embedded broker stopped" if broker.stop_background(args.port) else "no embedded broker was recorded")
    else:
        b = broker.read_state()
        if b is None or not b.alive() or (args.port is not None and b.port != args.port):
            print("embedded broker: not running" + (f" on port {args.port}" if args.port is not None else ""))
            return 1
        print(f"embedded broker: pid {b.pid}, bootstrap {b.bootstrap}")
    return 0


def cmd_spark_connect(args: argparse.Namespace) -> int:
    spark_connect = _dev_tool("spark_connect", "spark-connect")

    if args.action == "start":
        server = spark_connect.start_background(args.port)
        print(f"Spark Connect server running: pid {server.pid}, spark.connect_url {server.url}, log {server.log_path}")
    elif args.action == "stop":
        print("Spark Connect server stopped" if spark_connect.stop_background() else "no Spark Connect server was recorded")
    else:
        server = spark_connect.read_state()
        if server is None or not server.alive():
            print("Spark Connect server: not running")
            return 1
        print(f"Spark Connect server: pid {server.pid}, spark.connect_url {server.url}, log {server.log_path}")
    return 0


def _add_spark_connect(sub: Any) -> None:
    p = sub.add_parser("spark-connect", help="a local Spark Connect server for the write step (`make spark-connect` installs it)")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--port", type=int, default=15002, help="start: the port to listen on (default 15002)")
    p.set_defaults(fn=cmd_spark_connect)


def cmd_produce_sample(args: argparse.Namespace) -> int:
    sample = _dev_tool("sample_data", "produce-sample")
    counts = sample.produce(args.bootstrap, args.topic, sample.pizza_events(args.count, seed=args.seed), partitions=args.partitions)
    print(f"produced {sum(counts.values())} pizza events to {args.topic} ({args.partitions} partitions)")
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from tidewater.config.reference import reference_markdown

    text = reference_markdown()
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    elif not args.schema and not args.cli:
        sys.stdout.write(text)
    if args.cli:
        Path(args.cli).write_text(cli_reference())
        print(f"wrote {args.cli}")
    if args.schema:
        import json

        from tidewater.config.schema import pipeline_schema

        Path(args.schema).write_text(json.dumps(pipeline_schema(), indent=2) + "\n")
        print(f"wrote {args.schema}")
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from tidewater.config.schema import pipeline_schema
    from tidewater.examples import EXAMPLE, write_example

    folder = Path(args.dir)
    for path in write_example(folder, schema=pipeline_schema()):
        print(f"wrote {path}")
    pipeline = folder / f"{EXAMPLE}.yaml"
    print(
        f"next: edit {pipeline} (topics, kafka.bootstrap_servers, table.identifier), then\n"
        f"  tidewater validate --pipeline {pipeline}\n  tidewater run --pipeline {pipeline}\n"
        f"and point TIDEWATER_PIPELINES_DIR at {folder.resolve()} for the DAGs and the Tidewater view"
    )
    return 0


def _add_init(sub: Any) -> None:
    p = sub.add_parser("init", help="write the example pipeline file and its expectation suite into a pipelines folder")
    p.add_argument("--dir", default="pipelines", help="the pipelines folder (created if missing; default ./pipelines)")
    p.set_defaults(fn=cmd_init)


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
                spec, actions=actions, dry_run=args.dry_run, master=_master(spec, args.master), table=args.table, progress=_progress
            )
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        print(reports_json(reports))
    else:
        for r in maintain(
            spec, actions=actions, dry_run=args.dry_run, master=_master(spec, args.master), table=args.table, progress=_progress
        ):
            print(r.text())
    return 0


def _progress(line: str) -> None:
    """Progress of long work, on stderr: stdout keeps the command's result (and --json its document alone)."""
    print(line, file=sys.stderr, flush=True)


def cmd_connect_import(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from tidewater.config.parse import parse_pipeline
    from tidewater.errors import ConfigError
    from tidewater.interop.connect import convert, to_yaml

    try:
        doc = json.loads(Path(args.connector).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{args.connector}: cannot read the connector JSON: {e}") from None
    res = convert(
        doc, name=args.name, bootstrap=args.bootstrap_servers, catalog=args.catalog, catalog_uri=args.catalog_uri, warehouse=args.warehouse
    )
    text = to_yaml(res)
    import yaml

    try:  # the result must load as it is (environment references resolved to placeholders for the check)
        parse_pipeline(yaml.safe_load(_placeholders(text, res)))
    except ConfigError as e:
        raise ConfigError(f"the imported pipeline does not validate: {e}") from None
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}\n{res.report()}", file=sys.stderr)
    else:
        sys.stdout.write(text)  # the report is in the file's header comments
    return 0


def _placeholders(text: str, res: object) -> str:
    import os

    env = {var: "x" for _, var in getattr(res, "env", [])}
    for var, value in env.items():
        if var not in os.environ:
            text = text.replace("${" + var + "}", value if var != "KAFKA_BOOTSTRAP_SERVERS" else "127.0.0.1:9092")
    return text


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
    common = {"error_class": args.error_class or None, "batch": args.batch or None}
    if args.action == "list":
        result = listing(spec, state=args.state, limit=args.limit, **common)
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
        result = dead_letters.retry(spec, dry_run=args.dry_run, out=say, **common)
    else:
        result = dead_letters.drop(spec, reason=args.reason, dry_run=args.dry_run, out=say, **common)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    return 0


def _add_dead_letters(sub: Any) -> None:
    p = sub.add_parser("dead-letters", help="list dead letters; retry them with the current settings, or drop them")
    p.add_argument(
        "action",
        choices=["list", "retry", "drop"],
        help="list: letters and their state; retry: decode the open letters again and commit those that pass "
        "(once, as a batch of its own); drop: give the open letters up, with --reason",
    )
    _pipeline_arg(p)
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


def _add_skip(sub: Any) -> None:
    p = sub.add_parser("skip", help="dead-letter the records that block a partition and move its offset past them")
    _pipeline_arg(p)
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


def _add_recover_offsets(sub: Any) -> None:
    p = sub.add_parser(
        "recover-offsets", help="propose a table's lost offsets from the ledger and its rows; commit them when both agree (or with --yes)"
    )
    _pipeline_arg(p)
    p.add_argument("--dry-run", action="store_true", help="show the evidence and the proposal; change nothing")
    p.add_argument("--yes", action="store_true", help="commit the proposal even where the evidence does not agree")
    p.add_argument("--by", default=None, help="who asks (default: the user running the command)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=cmd_recover_offsets)


def _add_validate(sub: Any) -> None:
    p = sub.add_parser("validate", help="check a pipeline, or every pipeline file of the pipelines folder")
    _pipeline_arg(p, folder=True)
    p.add_argument("--json", action="store_true", help="print the result (every file and its problems) as JSON")
    p.set_defaults(fn=cmd_validate)


def _add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="run one batch (plan, write, validate, commit) without Airflow")
    _pipeline_arg(p)
    p.add_argument("--master", default=None, help="Spark master (default: the pipeline's spark.master)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=cmd_run)


def _add_connect_import(sub: Any) -> None:
    p = sub.add_parser("connect-import", help="turn a Kafka Connect Iceberg sink configuration into a pipeline file")
    p.add_argument("connector", metavar="CONNECTOR.json", help="the connector JSON (with or without name/config)")
    p.add_argument("--name", default=None, help="pipeline name (default: the connector's name)")
    p.add_argument(
        "--bootstrap-servers",
        default=None,
        help="Kafka brokers (the connector inherits them from its worker; default ${KAFKA_BOOTSTRAP_SERVERS})",
    )
    p.add_argument(
        "--catalog",
        choices=["local"],
        default=None,
        help="use the local default catalog (SQLite under $TIDEWATER_HOME) instead of the connector's",
    )
    p.add_argument(
        "--catalog-uri",
        default=None,
        metavar="URI",
        help="another catalog: a REST catalog's http(s) URL or a SQLAlchemy URL (replaces the connector's)",
    )
    p.add_argument("--warehouse", default=None, help="the catalog's warehouse location (catalog.properties.warehouse)")
    p.add_argument("--output", "-o", default=None, help="write the pipeline YAML here (default: stdout)")
    p.set_defaults(fn=cmd_connect_import)


def _add_replay(sub: Any) -> None:
    p = sub.add_parser("replay", help="re-read an offset range (or time range) into the table(s): replace, append-missing or reapply")
    _pipeline_arg(p)
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


def _add_quarantine(sub: Any) -> None:
    p = sub.add_parser("quarantine", help="list, publish or drop batches quarantined by the quality gate")
    p.add_argument("action", choices=["list", "publish", "drop"])
    _pipeline_arg(p)
    p.add_argument("--batch", default=None, help="batch id (publish, drop)")
    p.add_argument("--table", default=None, help="routed pipelines: the target table (publish, drop; list: default all)")
    p.add_argument("--reason", default="", help="drop: why the batch is given up (kept in the drop's record on main)")
    p.add_argument(
        "--by", default=None, help="publish, drop: who decides, kept in the table's history (default: the user running the command)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_quarantine)


def _add_publish(sub: Any) -> None:
    p = sub.add_parser("publish", help="fast-forward main to the table's branch (table.branch: write-audit-publish)")
    _pipeline_arg(p)
    p.add_argument("--table", default=None, help="the target table (routed pipelines)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_publish)


def _add_status(sub: Any) -> None:
    p = sub.add_parser("status", help="committed offsets, end offsets and lag per partition")
    _pipeline_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_status)


def _add_audit(sub: Any) -> None:
    p = sub.add_parser(
        "audit",
        help="check that the table is exactly its topic: ranges, counts, outside writes, Kafka (exit 0 clean, 1 discrepancies, 2 error)",
    )
    _pipeline_arg(p)
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


def _add_history(sub: Any) -> None:
    p = sub.add_parser("history", help="the table's snapshots with batch ids and offsets")
    _pipeline_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_history)


def _add_sql(sub: Any) -> None:
    p = sub.add_parser("sql", help="run a Spark SQL query on the pipeline's catalog")
    _pipeline_arg(p)
    p.add_argument("query")
    p.add_argument("--limit", type=int, default=20, help="rows to show")
    p.add_argument(
        "--master", default=None, help="Spark master (default: the spark.conn_id Airflow connection's, else the pipeline's spark.master)"
    )
    p.set_defaults(fn=cmd_sql)


def _add_maintain(sub: Any) -> None:
    p = sub.add_parser("maintain", help="compact, rewrite manifests, expire snapshots, remove orphan files")
    _pipeline_arg(p)
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


def _add_broker(sub: Any) -> None:
    p = sub.add_parser("broker", help="the embedded Kafka-compatible broker (demo and tests)")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument(
        "--port", type=int, default=None, help="start: the port to listen on (default 19092); stop and status: only the broker on this port"
    )
    p.set_defaults(fn=cmd_broker)


def _add_produce_sample(sub: Any) -> None:
    p = sub.add_parser("produce-sample", help="produce Scenario 1 pizza events")
    p.add_argument("--bootstrap", default="127.0.0.1:19092")
    p.add_argument("--topic", default="completed-pizzas")
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_produce_sample)


def cmd_data_docs(args: argparse.Namespace) -> int:
    from tidewater.config.parse import load_pipeline
    from tidewater.quality.data_docs import render_pending, site_dir

    spec = load_pipeline(args.pipeline)
    pages = render_pending(spec, args.batch)
    for page in pages:
        print(page)
    print(f"{len(pages)} page(s) rendered; site {site_dir(spec) / 'index.html'}", file=sys.stderr)
    return 0


def _add_data_docs(sub: Any) -> None:
    p = sub.add_parser("data-docs", help="render the Data Docs pages of validated batches that have none yet")
    _pipeline_arg(p)
    p.add_argument("--batch", default=None, help="only this batch id (default: every batch without a page)")
    p.set_defaults(fn=cmd_data_docs)


def cmd_connections(args: argparse.Namespace) -> int:
    """Write the settings the pipeline resolves from Airflow connections, one private file per variable, for a
    Kubernetes secret (``spark.kubernetes_secret``). Prints the files' names, never their content."""
    from tidewater.config.parse import load_pipeline
    from tidewater.runtime.airflow import resolved_connections

    resolved = resolved_connections(load_pipeline(args.pipeline))
    if not resolved:
        print("the pipeline takes no setting from an Airflow connection: nothing to write")
        return 0
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)
    for name, value in resolved.items():
        fd = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value)
        print(f"wrote {out / name} (mode 0600)")
    print(f"next: kubectl create secret generic <spark.kubernetes_secret> --from-file={out}, then remove {out}")
    return 0


def _add_connections(sub: Any) -> None:
    p = sub.add_parser(
        "connections",
        help="write the settings the pipeline takes from Airflow connections, one "
        "private file per variable, for a Kubernetes secret (cluster deploy mode)",
    )
    _pipeline_arg(p)
    p.add_argument("--output", required=True, metavar="DIR", help="the folder to write them into (made 0700)")
    p.set_defaults(fn=cmd_connections)


def _add_docs(sub: Any) -> None:
    p = sub.add_parser("docs", help="print (or write) the configuration reference, and the pipeline file's JSON Schema")
    p.add_argument("--output", default=None, help="write the reference (Markdown) here instead of printing it")
    p.add_argument("--schema", default=None, help="write the JSON Schema of a pipeline file here (for editors)")
    p.add_argument("--cli", default=None, metavar="FILE", help="write the command-line reference (Markdown) here")
    p.set_defaults(fn=cmd_docs)


_COMMANDS = (
    _add_init,
    _add_validate,
    _add_run,
    _add_connect_import,
    _add_connections,
    _add_replay,
    _add_dead_letters,
    _add_quarantine,
    _add_publish,
    _add_skip,
    _add_recover_offsets,
    _add_status,
    _add_history,
    _add_audit,
    _add_sql,
    _add_maintain,
    _add_broker,
    _add_spark_connect,
    _add_produce_sample,
    _add_docs,
    _add_data_docs,
)


def build_parser() -> argparse.ArgumentParser:
    return _parser_and_commands()[0]


def _parser_and_commands() -> tuple[argparse.ArgumentParser, Any]:
    """The parser and its sub-commands' action (``choices``: each command's parser; ``_choices_actions``: their help)."""
    from tidewater.runtime.cli_reference import describe

    ap = argparse.ArgumentParser(prog="tidewater", description="Exactly-once Kafka to Iceberg micro-batches.")
    ap.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING")
    ap.add_argument("--version", action="version", version=f"tidewater {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    for add in _COMMANDS:
        add(sub)
    describe(sub.choices)
    return ap, sub


def cli_reference() -> str:
    """docs/reference/cli.md: generated from the parser (``tidewater docs --cli FILE``)."""
    from tidewater.runtime.cli_reference import reference

    _, sub = _parser_and_commands()
    summaries = {a.dest: a.help for a in sub._choices_actions}
    return reference(dict(sub.choices), summaries)


# commands that only read: they leave no file behind where nothing was (a missing default catalog stays missing)
READ_ONLY = ("status", "history", "validate", "docs")


def main(argv: list[str] | None = None) -> int:
    from tidewater.runtime.logs import configure_logging

    ap = build_parser()
    args = ap.parse_args(argv)
    configure_logging(args.log_level or ("WARNING" if args.command in ("status", "history", "docs", "audit") else None))
    from tidewater.config.locations import READ_ONLY_ENV

    read_only = args.command in READ_ONLY or (args.command in ("dead-letters", "quarantine") and args.action == "list")
    before = os.environ.get(READ_ONLY_ENV)
    if read_only:
        os.environ[READ_ONLY_ENV] = "1"  # creates no catalog or warehouse where there is none (table/catalog.py)
    try:
        _resolve_pipeline(ap, args)
        return int(args.fn(args) or 0)
    except Exception as e:  # one line per error: ours, or Spark's (never a Py4J stack trace)
        if not isinstance(e, TidewaterError):
            from tidewater.spark.session import spark_failure

            failure = spark_failure(e)
            if failure is None:
                raise
            e = failure
        kind = "transient" if e.transient else "error"
        print(f"tidewater: {kind}: {e}", file=sys.stderr)
        code = 75 if e.transient else 2
        if getattr(args, "json", False):  # a caller that reads JSON reads the error as JSON too
            from tidewater.errors import error_document

            print(json.dumps({"error": {**error_document(e), "exit": code}}, indent=1, default=str))
        return code
    finally:
        if read_only and before is None:
            os.environ.pop(READ_ONLY_ENV, None)


def entry() -> Any:
    sys.exit(main())


if __name__ == "__main__":
    entry()
