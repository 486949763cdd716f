"""What the command line's commands share: the pipeline argument, the Spark master a command uses, progress on stderr."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def pipeline_arg(p: argparse.ArgumentParser, folder: bool = False) -> None:
    """The pipeline a command acts on: its name (looked up in the pipelines folder) or ``--pipeline FILE``. With
    ``folder``, neither means every pipeline file of the folder."""
    p.add_argument(
        "pipeline_name", nargs="?", metavar="NAME", help="the pipeline's name, looked up in the pipelines folder ($TIDEWATER_PIPELINES_DIR)"
    )
    p.add_argument("--pipeline", metavar="FILE", help="the pipeline file (YAML), instead of a NAME")
    p.set_defaults(pipeline_folder=folder)


def chosen_master(spec: Any, given: str | None) -> str:
    """``--master``, else the master of the Airflow connection the DAGs use (``spark.conn_id``, e.g. from
    ``AIRFLOW_CONN_TIDEWATER_SPARK``), else the pipeline's ``spark.master``."""
    if given:
        return given
    from tidewater.runtime.airflow import spark_master

    return spark_master(spec.spark.conn_id, spec.spark.master)


def progress(line: str) -> None:
    """Progress of long work, on stderr: stdout keeps the command's result (and --json its document alone)."""
    print(line, file=sys.stderr, flush=True)
