"""Spark sessions of this process (queries, maintenance, tests) built from ``spark/conf.py``, and what a Spark
failure means (worth retrying or not).
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Iterator
from typing import Any

from tidewater.config.secrets import SPARK_REDACTION_REGEX, split_secrets
from tidewater.config.spec import PipelineSpec
from tidewater.errors import TerminalError, TransientError
from tidewater.spark.conf import jvm_env, process_env, properties_file, remove_properties_file, spark_defaults_file, submit_settings


def session(spec: PipelineSpec, app_name: str = "tidewater", master: str | None = None) -> Any:
    """A SparkSession on the pipeline's catalog (for queries and maintenance from Python).

    pyspark starts the JVM with spark-submit and puts every setting given before then on its command line, where
    any user of the host can read it (``ps``). The secret ones (``config/secrets.py``: a catalog's password or
    token, an S3 secret key) go in a private properties file instead, named on the command line through
    ``PYSPARK_SUBMIT_ARGS`` (as ``tidewater run``'s spark-submit does) and removed once the JVM has read it. A
    JVM already running in this process takes them at run time, which no command line sees. A Glue catalog's
    credentials reach the JVM in its environment (``jvm_env``): Iceberg's Glue client reads no keys from settings;
    a JVM already running keeps the environment it started with."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName(app_name).master(master or spec.spark.master)
    s = submit_settings(spec, master)
    public, secret = split_secrets({"spark.redaction.regex": SPARK_REDACTION_REGEX, **s["conf"]})
    for k, v in public.items():
        b = b.config(k, v)
    if s["jars"]:
        b = b.config("spark.jars", s["jars"])
    if s["packages"]:
        b = b.config("spark.jars.packages", s["packages"])
    env = jvm_env(spec)
    if SparkContext._active_spark_context is not None or not (secret or env):
        for k, v in secret.items():
            b = b.config(k, v)
        spark = b.getOrCreate()
    else:
        with _secrets_for_the_jvm(secret, env):
            spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


@contextlib.contextmanager
def _secrets_for_the_jvm(secret: dict[str, str], env: dict[str, str]) -> Iterator[None]:
    """``secret`` in a private properties file that the JVM pyspark starts in this block reads (the cluster's
    spark-defaults.conf copied in first, as ``tidewater run`` does: spark-submit reads one properties file), and
    ``env`` in its environment; this process's environment is as it was afterwards."""
    path = properties_file(secret, spark_defaults_file()) if secret else None
    changed = dict(env)
    if path is not None:
        given = os.environ.get("PYSPARK_SUBMIT_ARGS") or "pyspark-shell"
        changed["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {shlex.quote(str(path))} {given}"
    try:
        with process_env(changed):
            yield
    finally:
        remove_properties_file(path)


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
