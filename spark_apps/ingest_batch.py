"""The write step's spark-submit entry point, for clusters given this repository's file rather than the installed
package's: it runs the one the package ships (``tidewater/runtime/spark_app/ingest_batch.py``, which the write step
submits by default; ``TIDEWATER_SPARK_APP`` names another).

Usage: spark-submit ... spark_apps/ingest_batch.py --pipeline PIPELINE.yaml --plan STAGING/<pipeline>/<batch>/plan.json
"""

import runpy
from pathlib import Path

import tidewater.runtime.spark_app as app

if __name__ == "__main__":
    runpy.run_path(str(Path(app.__file__).parent / "ingest_batch.py"), run_name="__main__")
