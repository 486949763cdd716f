"""The Python daemon of a Spark Connect server's workers (``spark.python.daemon.module``): pyspark's own daemon,
with what a write task imports loaded first, so every worker it forks starts with it.

Spark kills a Python worker after a minute idle (a constant in Spark 4.0's PythonWorkerFactory), so on a
schedule of minutes every batch would get new workers and pay the imports again. The daemon that forks the
workers lives as long as the server: importing here pays them once per server. Most of a fresh task's set-up
was imports made lazily inside functions (profiled: pyiceberg's catalog and SQLAlchemy 0.5 s, pyiceberg's
pyarrow FileIO 0.35 s): they are listed here. Nothing is opened (no client, catalog, file or thread), so
forking stays safe.
"""

from __future__ import annotations

import importlib

PRELOAD = (
    # the write step's own modules
    "tidewater.write.task", "tidewater.write.sinks", "tidewater.write.parquet", "tidewater.write.dead_letters",
    "tidewater.transform.chunk", "tidewater.decode.json", "tidewater.table.catalog", "tidewater.table.evolution",
    "tidewater.source.kafka", "tidewater.transform.source_columns",
    # what they import inside functions on a task's path (catalog, table, file IO, Kafka client, Parquet)
    "pyiceberg.catalog", "pyiceberg.catalog.sql", "pyiceberg.io.pyarrow", "pyiceberg.table", "sqlalchemy",
    "confluent_kafka", "pyarrow.json", "pyarrow.parquet", "pyarrow.compute",
)


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)


if __name__ == "__main__":
    preload()
    from pyspark.daemon import manager

    manager()
