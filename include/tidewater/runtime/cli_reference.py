"""The command-line reference (docs/reference/cli.md), generated from the parser: each command's usage and
arguments come from argparse, its longer description (Markdown, with links into the docs) from ``DETAILS``, which the
parser also shows in ``--help`` (links as plain text). ``tidewater docs --cli FILE`` writes the page; a unit test
checks that the page is what the code generates."""

from __future__ import annotations

import argparse
import re

INTRO = """# Command line

The `tidewater` command is installed in `.venv/bin`. `make tidewater ARGS="..."` runs it with the project's
environment (the demo catalog in `.data/`). A command that acts on one pipeline takes its NAME, looked up in the
pipelines folder (`$TIDEWATER_PIPELINES_DIR`: the file named after the pipeline, else the one file that names it),
or `--pipeline FILE`. A command with `--json` writes its result, and its error, as JSON. Exit codes: 0 done, 1 the
command's own "no" (a discrepancy, a refusal, a problem it warns of), 2 an error retrying cannot help, 75 a
transient error (worth retrying).

This page is generated from the parser (`tidewater docs --cli docs/reference/cli.md`).

```
make tidewater ARGS="status pizzas"
make airflow ARGS="dags list"
```
"""

# The longer description of each command, in Markdown.
DETAILS: dict[str, str] = {
    "init": (
        "write the example pipeline file (`pizzas.yaml`), its expectation suite and the pipeline file's JSON "
        "Schema into `DIR` (default `./pipelines`); refuses, writing nothing, when a file is there"
    ),
    "validate": (
        "check a pipeline (its NAME, or `--pipeline FILE`); errors name the key. With neither, every pipeline "
        "file of the pipelines folder, each with all of its problems (and files that give two pipelines one "
        "name), then how many are valid; exit 2 if any is not. Under a multi-host Airflow executor "
        "(`AIRFLOW__CORE__EXECUTOR` or Airflow's configuration: anything but Local) it also refuses every per-host "
        "place of state (a SQLite catalog, a local warehouse, staging or Data Docs folder outside `airflow.shared_paths`)"
    ),
    "run": ("one batch through plan, write (spark-submit), validate and commit, without Airflow, with progress"),
    "status": (
        "per partition: committed offset, end offset, lag; last snapshot and time; valid-through; dead letters; "
        "per target table when routing. Warns and exits 1 when a committed offset is beyond the log end (topic "
        "recreated or truncated) or below its start (retention deleted records never ingested)"
    ),
    "connections": (
        "resolve the pipeline's Airflow connections (`kafka.conn_id`, `catalog.conn_id`, `format.registry_conn_id`, "
        "`batch.staging_conn_id`) as the write step's driver gets them, and write each as a file named after its "
        "variable (`TIDEWATER_KAFKA_CONFIG`, ...; mode 0600, in a 0700 folder) for `kubectl create secret generic "
        "NAME --from-file=DIR`: the secret `spark.kubernetes_secret` names, from which a driver in cluster deploy "
        "mode on Kubernetes takes them. Prints file names, never values"
    ),
    "history": ("the table's snapshots with batch ids and offsets"),
    "audit": (
        "is the table exactly its topic? (Routed pipelines: all their tables, or `--table T`.) The batches "
        "committed since the last clean audit, or with `--full` every batch in the ledger ([since the last clean "
        "audit](../how-to/audit.md#since-the-last-clean-audit-or-full)). From the ledger ([the ledger and the "
        "audit](../how-to/audit.md)): per partition the committed ranges follow each other with no gap or overlap"
        " (an operator skip is reported as explained), every batch's records read = rows + dead letters + "
        "skipped, no snapshot changed rows outside Tidewater, and no committed offset is below the log start "
        "(deleted by retention before it was read) or beyond the log end. `--deep` (needs `format.metadata`) "
        "reads every row's source offset: none twice, none both a row and a dead letter, none missing unless its "
        "batch skipped it or Kafka holds no record there (transaction markers, compaction; what retention removed"
        " is reported as not checkable); change tables: each key once. Names each discrepancy by topic, "
        "partition, offsets, batch and snapshot; exit 0 clean, 1 discrepancies, 2 error"
    ),
    "sql": ("Spark SQL on the pipeline's catalog"),
    "maintain": ("the maintenance DAG's actions from the command line; `--dry-run` reports what would change"),
    "replay": (
        "re-read a committed range; `--dry-run` prints rows to delete and to add per partition (change tables: "
        "`reapply`, the default for them; routed pipelines: per table, `--tables` for some of them)"
    ),
    "quarantine": (
        "batches the quality gate quarantined: see them, append one to main, or discard it (routed pipelines: "
        "`--table` names the target table)"
    ),
    "publish": (
        "write-audit-publish for `table.branch`: fast-forward main to the branch's head (refused, changing "
        "nothing, when main has a commit the branch lacks)"
    ),
    "skip": (
        "step past records that block a partition: the records before the range are ingested first, the range "
        "becomes dead letters (`OperatorSkip`, with the reason and who asked) and the offset moves past it; "
        "recorded in the table's history (routed pipelines: in the checkpoint table's). Also the `skip_<name>` "
        "DAG (form, dry run by default)"
    ),
    "dead-letters": (
        "dead letters people can act on ([how-to](../how-to/replay-and-backfill.md)). `list`: letters with their "
        "state (open, retrying, resolved, skipped, dropped). `retry`: decode the open letters again with the "
        "current settings (from their stored records: Kafka need not hold them) and commit those that pass once, "
        "as a batch of its own (offsets unchanged; change tables in source order, or refused when a later change "
        "of the key is applied); those that fail again stay open with their new error; an unfinished retry is "
        "finished first. Also the `retry_dead_letters_<name>` DAG. `drop --reason TEXT`: give the open letters up"
        " (kept, with the reason and who asked). Exit 0 done, 2 error, 75 transient"
    ),
    "recover-offsets": (
        "when a table's offsets are gone anyway (the tag removed, the snapshots expired; see Living with other "
        "tools' maintenance): proposes each stuck table's offsets from the ledger and from its rows' own source "
        "offsets, shows both, and commits them only when they agree, or with `--yes`. Refuses, changing nothing, "
        "when neither can prove them. Exit 1 when refused"
    ),
    "connect-import": ("a Kafka Connect Iceberg sink configuration as a pipeline file; lists every key it did not map and why"),
    "broker": ("the embedded broker for the demo (`stop`/`status --port N`: only the broker on that port)"),
    "spark-connect": ("a local Spark Connect server for the write step (`make spark-connect` installs and starts it; default port 15002)"),
    "produce-sample": ("produce Scenario 1 pizza events"),
    "docs": (
        "print (or write) the configuration reference; `--schema FILE` writes the pipeline file's JSON Schema and"
        " `--cli FILE` this command-line reference, generated from the parser"
    ),
    "data-docs": ("render the Data Docs pages that validated batches left for later (see [the quality gate](../how-to/quality-gate.md))"),
}

_LINK = re.compile(r"\[([^\]]+)\]\([^)]+\)")


def plain(markdown: str) -> str:
    """A description for the terminal (``--help``): links as their text, code as is."""
    return _LINK.sub(r"\1", markdown).replace("`", "")


def describe(commands: dict[str, argparse.ArgumentParser]) -> None:
    """Gives every command's parser its description (``--help`` shows it); a command without one is a mistake."""
    missing = sorted(set(commands) - set(DETAILS))
    if missing:
        raise AssertionError(f"cli_reference.DETAILS lacks {missing}")
    for name, parser in commands.items():
        parser.description = plain(DETAILS[name])


def reference(commands: dict[str, argparse.ArgumentParser], summaries: dict[str, str]) -> str:
    """The page: the intro, then per command its one-line help, its usage, its description and its arguments."""
    out = [INTRO]
    for name, parser in commands.items():
        usage = " ".join(parser.format_usage().split()).removeprefix("usage: ")
        out += [
            f"## tidewater {name}",
            "",
            f"{summaries[name][:1].upper()}{summaries[name][1:]}.",
            "",
            "```",
            usage,
            "```",
            "",
            DETAILS[name][:1].upper() + DETAILS[name][1:] + ".",
            "",
        ]
        rows = [_argument(a) for a in parser._actions if a.help != argparse.SUPPRESS and a.dest != "help"]
        out += ["| argument | meaning |", "| --- | --- |", *rows, ""]
    return "\n".join(out)


def _argument(action: argparse.Action) -> str:
    """One row of a command's arguments table: the argument as typed, its help, its choices and default."""
    shown = " ".join(action.metavar) if isinstance(action.metavar, tuple) else action.metavar  # a tuple: one per value
    if action.option_strings:
        name = ", ".join(action.option_strings)
        if action.nargs != 0:
            name += " " + (shown or action.dest.upper())
    else:
        name = shown or "{" + ",".join(action.choices or []) + "}"
    text = (action.help or "").replace("%(default)s", str(action.default)).replace("|", "\\|")
    if action.choices and action.option_strings:
        text += f" (one of: {', '.join(map(str, action.choices))})"
    if action.default not in (None, False, argparse.SUPPRESS) and action.nargs != 0 and "default" not in text:
        text += f" (default: {action.default})"
    return f"| `{name}` | {text or '-'} |"
