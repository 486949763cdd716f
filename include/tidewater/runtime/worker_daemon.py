"""The Python daemon of a Spark Connect server's workers (``spark.python.daemon.module``): pyspark's own daemon,
with what a write task imports loaded first, so every worker it forks starts with it.

Spark kills a Python worker after a minute idle (a constant in Spark 4.0's PythonWorkerFactory), so on a
schedule of minutes every batch would get new workers and pay the imports again. The daemon that forks the
workers lives as long as the server: importing here pays them once per server (profiled before: pyiceberg's
catalog and SQLAlchemy 0.5 s, pyiceberg's pyarrow FileIO 0.35 s of a fresh task's set-up). The list follows from
the imports: the task's module, and the loaders a registry defers. Nothing is opened (no client, catalog, file
or thread), so forking stays safe.
"""

from __future__ import annotations

import importlib

PRELOAD = (
    # a write task and everything it imports (the package imports its own modules and Arrow, pyiceberg and the
    # Kafka client at the top of each module, so this one name brings in the task's whole path)
    "tidewater.write.task",
    # what is loaded by name, on purpose late, in a registry: pyiceberg's SQL catalog (with SQLAlchemy), which
    # table.catalog.load_catalog asks pyiceberg for; the value formats other than JSON load on first use
    "pyiceberg.catalog.sql",
)


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)


if __name__ == "__main__":
    preload()
    from pyspark.daemon import manager

    manager()
