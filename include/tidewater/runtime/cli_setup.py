"""The command line's commands for pipeline files: ``init``, ``validate``, ``connect-import`` and ``connections``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from tidewater.runtime.cli_common import pipeline_arg


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


def add_init(sub: Any) -> None:
    p = sub.add_parser("init", help="write the example pipeline file and its expectation suite into a pipelines folder")
    p.add_argument("--dir", default="pipelines", help="the pipelines folder (created if missing; default ./pipelines)")
    p.set_defaults(fn=cmd_init)


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


def add_validate(sub: Any) -> None:
    p = sub.add_parser("validate", help="check a pipeline, or every pipeline file of the pipelines folder")
    pipeline_arg(p, folder=True)
    p.add_argument("--json", action="store_true", help="print the result (every file and its problems) as JSON")
    p.set_defaults(fn=cmd_validate)


def add_connect_import(sub: Any) -> None:
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


def add_connections(sub: Any) -> None:
    p = sub.add_parser(
        "connections",
        help="write the settings the pipeline takes from Airflow connections, one "
        "private file per variable, for a Kubernetes secret (cluster deploy mode)",
    )
    pipeline_arg(p)
    p.add_argument("--output", required=True, metavar="DIR", help="the folder to write them into (made 0700)")
    p.set_defaults(fn=cmd_connections)
