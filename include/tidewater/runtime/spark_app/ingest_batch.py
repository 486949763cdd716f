"""spark-submit entry point of the write step: read a planned offset range, write data files, never commit.

Usage: spark-submit ... ingest_batch.py --pipeline PIPELINE.yaml --plan STAGING/<pipeline>/<batch>/plan.json
(STAGING: a local directory or an object-storage URI, `batch.staging_dir`). ``tidewater.config.locations.spark_app_path``
names this file; `TIDEWATER_SPARK_APP` names another.
"""

from __future__ import annotations

import sys
import time

STARTED = time.time()  # when spark-submit's JVM had started this Python driver (the write step's breakdown)

from tidewater.runtime.spark_job import main  # noqa: E402 - after the timestamp on purpose

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], driver_started=STARTED))
