"""An ``airflow.on_late`` callable for the freshness-deadline test: Airflow's triggerer imports it (the test puts the
checkout on its PYTHONPATH) and it appends what it was given to the file named by TIDEWATER_TEST_LATE_FILE."""

from __future__ import annotations

import json
import os


def record(info: dict) -> None:
    with open(os.environ["TIDEWATER_TEST_LATE_FILE"], "a") as f:
        f.write(json.dumps(info, default=str) + "\n")
