"""Spark sessions of this process (queries, maintenance, tests) built from ``spark/conf.py``, and what a Spark
failure means (worth retrying or not).
"""

from __future__ import annotations

from typing import Any

from tidewater.config.spec import PipelineSpec
from tidewater.errors import TerminalError, TransientError
from tidewater.spark.conf import submit_settings


def session(spec: PipelineSpec, app_name: str = "tidewater", master: str | None = None) -> Any:
    """A SparkSession on the pipeline's catalog (for queries and maintenance from Python)."""
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName(app_name).master(master or spec.spark.master)
    s = submit_settings(spec, master)
    for k, v in s["conf"].items():
        b = b.config(k, v)
    if s["jars"]:
        b = b.config("spark.jars", s["jars"])
    if s["packages"]:
        b = b.config("spark.jars.packages", s["packages"])
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def release_catalog(spark: Any, spec: PipelineSpec) -> None:
    """Close the pipeline catalog's connections in this SparkSession; the next query reopens them.

    Iceberg's JDBC catalog keeps a transaction open on its pooled connections: on SQLite that is a read
    lock, and every other writer (ingest commits) gets "database is locked" until the pool is closed.
    """
    manager = spark._jsparkSession.sessionState().catalogManager()
    try:
        catalog = manager.catalog(spec.catalog.name).icebergCatalog()
    except Exception:  # noqa: BLE001 - a Py4J error: the catalog was never initialised in this session, nothing is open
        return
    if hasattr(catalog, "close"):
        catalog.close()
    manager.reset()


# Text of a failure of Spark's own work that a retry can heal (a concurrent commit, a busy or unreachable
# catalog, store or cluster); anything else (bad SQL, a missing table, a bad setting) is terminal.
_TRANSIENT_SPARK = (
    "CommitFailedException",
    "database is locked",
    "Connection refused",
    "ConnectException",
    "UnknownHostException",
    "SocketTimeoutException",
    "ServiceUnavailable",
    "SdkClientException",
    "All masters are unresponsive",
)


def spark_failure(e: BaseException) -> Any:
    """A failure raised by Spark (Py4J or PySpark) as one ``TidewaterError`` line (the Java exception's first line,
    not its stack trace), transient or terminal by its text; None for anything else."""
    module = type(e).__module__ or ""
    if not (module.startswith("py4j") or module.startswith("pyspark")):
        return None
    java = getattr(e, "java_exception", None)
    text = str(java.toString()) if java is not None else str(e)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)[:500]
    cls = TransientError if any(t in text for t in _TRANSIENT_SPARK) else TerminalError
    return cls(f"Spark: {first}")
