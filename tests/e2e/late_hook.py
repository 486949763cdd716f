"""Callables the end-to-end tests hand to a pipeline's Airflow settings; Airflow imports them (the tests put the
checkout on its PYTHONPATH). ``record``: an ``airflow.on_late`` callable that appends what it was given to the file
named by TIDEWATER_TEST_LATE_FILE. ``FailureFile``: an ``airflow.on_failure`` notifier that appends the failed task
and its exception to the file named by TIDEWATER_TEST_FAILURE_FILE."""

from __future__ import annotations

import json
import os

from airflow.sdk import BaseNotifier


def record(info: dict) -> None:
    with open(os.environ["TIDEWATER_TEST_LATE_FILE"], "a") as f:
        f.write(json.dumps(info, default=str) + "\n")


class FailureFile(BaseNotifier):
    """Made without arguments, as ``airflow.on_failure`` makes a notifier class."""

    def notify(self, context: dict) -> None:
        ti = context["ti"]
        with open(os.environ["TIDEWATER_TEST_FAILURE_FILE"], "a") as f:
            f.write(json.dumps({"dag_id": ti.dag_id, "task_id": ti.task_id, "exception": str(context.get("exception"))}) + "\n")
