"""The write step's spark-submit entry point (``tidewater/runtime/spark_app/ingest_batch.py`` calls :func:`main`): the Spark
driver of one batch reads the staged plan, runs the write job (``write/job.py``) and stages its manifest, or
its error document; it never commits.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from tidewater.batch import ERROR_NAME, MANIFEST_NAME, BatchPlan, read_json, write_json_atomic
from tidewater.config.parse import load_pipeline
from tidewater.errors import BatchWriteError, error_document
from tidewater.runtime.logs import configure_logging
from tidewater.source.kafka import kafka_settings
from tidewater.write.job import deployment_fault, run, stage_manifest

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None, driver_started: float | None = None) -> int:
    """spark-submit entry point: ``ingest_batch.py [--pipeline PIPELINE.yaml] --plan PLAN.json``."""
    from pyspark import SparkConf, SparkContext  # the driver's own: the library's modules never start Spark

    configure_logging()
    ap = argparse.ArgumentParser(prog="ingest_batch.py", description="Write one Tidewater batch (never commits).")
    ap.add_argument("--plan", required=True, help="location of the batch plan JSON (a path or an object-storage URI)")
    ap.add_argument(
        "--pipeline",
        help="the pipeline file (default: the one the plan names); its settings reach the staging area when it is on object storage",
    )
    args = ap.parse_args(argv)
    if args.pipeline:
        spec = load_pipeline(args.pipeline)
        plan_path = spec.stage(args.plan)
        plan = BatchPlan.from_json(read_json(plan_path))
    else:  # a local staging directory: the plan names its pipeline
        plan_path = Path(args.plan)
        plan = BatchPlan.from_json(read_json(plan_path))
        spec = load_pipeline(plan.pipeline_path)
    settings = kafka_settings(spec)
    out_dir = plan_path.parent
    (out_dir / ERROR_NAME).unlink(missing_ok=True)
    timings = {"driver_started": driver_started or time.time(), "imports_done": time.time()}
    # A SparkContext, not a SparkSession: the job is RDD-only and never uses Spark SQL.
    sc = SparkContext(conf=SparkConf().setAppName(f"tidewater-{plan.pipeline}-{plan.batch_id}"))
    timings["session_ready"] = time.time()
    try:
        started = time.monotonic()
        manifest = stage_manifest(out_dir, lambda: run(sc, plan, spec, settings, timings))
        log.info(
            "batch %s: wrote %d records in %d files in %.1fs on Spark %s; manifest %s",
            plan.batch_id,
            manifest.records,
            len(manifest.data_files),
            time.monotonic() - started,
            sc.version,
            out_dir / MANIFEST_NAME,
        )
        return 0
    except BatchWriteError as e:  # its document is staged as error.json
        print(f"TIDEWATER-ERROR: {e}", file=sys.stderr)
        return 3
    except Exception as e:  # Spark could not run the tasks: staged as error.json when no retry can heal it
        fault = deployment_fault(str(e))
        if fault is None:
            raise
        write_json_atomic(out_dir / ERROR_NAME, error_document(fault))
        print(f"TIDEWATER-ERROR: {fault}", file=sys.stderr)
        return 3
    finally:
        sc.stop()
