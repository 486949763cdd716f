"""The ``tidewater`` command line: its table of commands (``COMMANDS``), the parser built from it, and ``main``, which
runs a command and turns its failure into one line and an exit code (2: fix something; 75: worth retrying)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidewater import __version__
from tidewater.errors import TidewaterError
from tidewater.runtime import cli_inspect, cli_operate, cli_setup


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


def _add_docs(sub: Any) -> None:
    p = sub.add_parser("docs", help="print (or write) the configuration reference, and the pipeline file's JSON Schema")
    p.add_argument("--output", default=None, help="write the reference (Markdown) here instead of printing it")
    p.add_argument("--schema", default=None, help="write the JSON Schema of a pipeline file here (for editors)")
    p.add_argument("--cli", default=None, metavar="FILE", help="write the command-line reference (Markdown) here")
    p.set_defaults(fn=cmd_docs)


# The checkout's development commands (include/tidewater_dev/cli.py), outside the product's wheel
DEV_COMMANDS = ("broker", "spark-connect", "produce-sample")


def _not_shipped(args: argparse.Namespace) -> int:
    from tidewater.errors import ConfigError

    raise ConfigError(
        f"`tidewater {args.command}` is a development tool of a Tidewater checkout (include/tidewater_dev, used by "
        "`make demo` and the tests); the installed package does not ship it. Use your own Kafka cluster and Spark, "
        "or run it from a checkout"
    )


def _add_dev(sub: Any) -> None:
    """The checkout's development commands; in an installed package, a stand-in for each that says where they are."""
    try:
        dev = importlib.import_module("tidewater_dev.cli")
    except ModuleNotFoundError as e:
        if e.name not in ("tidewater_dev", "tidewater_dev.cli"):
            raise
        for name in DEV_COMMANDS:
            p = sub.add_parser(name, help="a development tool of a Tidewater checkout (not in the installed package)")
            p.add_argument("arguments", nargs=argparse.REMAINDER, help="its arguments (in a checkout)")
            p.set_defaults(fn=_not_shipped)
        return
    for add in dev.COMMANDS:
        add(sub)


# The table of commands, in the order `tidewater --help` and docs/reference/cli.md list them: each entry adds one
# sub-command (its arguments and the function it runs), kept in the module of its kind: pipeline files
# (cli_setup), changing tables (cli_operate), reading them (cli_inspect); _add_dev adds the checkout's.
COMMANDS: tuple[Callable[[Any], None], ...] = (
    cli_setup.add_init,
    cli_setup.add_validate,
    cli_operate.add_run,
    cli_setup.add_connect_import,
    cli_setup.add_connections,
    cli_operate.add_replay,
    cli_operate.add_dead_letters,
    cli_operate.add_quarantine,
    cli_operate.add_publish,
    cli_operate.add_skip,
    cli_operate.add_recover_offsets,
    cli_inspect.add_status,
    cli_inspect.add_history,
    cli_inspect.add_audit,
    cli_inspect.add_sql,
    cli_operate.add_maintain,
    _add_dev,
    _add_docs,
    cli_inspect.add_data_docs,
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
    for add in COMMANDS:
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
