"""Where a pipeline's files live: the environment variables and the ``[tidewater]`` settings that say so."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from tidewater.config.airflow_section import setting

if TYPE_CHECKING:
    pass


PIPELINES_DIR_ENV = "TIDEWATER_PIPELINES_DIR"
HOME_ENV = "TIDEWATER_HOME"
# Set by read-only commands (`tidewater status`, ...): the embedded default catalog is not created when it is missing
READ_ONLY_ENV = "TIDEWATER_READ_ONLY"
KAFKA_CONFIG_ENV = "TIDEWATER_KAFKA_CONFIG"


def home_dir() -> Path:
    """The data directory for embedded defaults (catalog, warehouse, staging, repaired jars): ``$TIDEWATER_HOME``,
    else ``[tidewater] home`` of Airflow's configuration (``config/airflow_section.py``), else ``~/.tidewater``."""
    return Path(setting("home") or Path.home() / ".tidewater").expanduser().resolve()


def pipelines_dir() -> Path:
    """Where pipeline specifications live: ``$TIDEWATER_PIPELINES_DIR``, else ``[tidewater] pipelines_dir`` of
    Airflow's configuration (``config/airflow_section.py``), else ``include/pipelines`` beside the package."""
    where = setting("pipelines_dir")
    if where:
        return Path(where).expanduser().resolve()
    return Path(__file__).resolve().parents[2] / "pipelines"


def spark_app_path() -> Path:
    """The write step's spark-submit entry point: the one the package ships (``TIDEWATER_SPARK_APP``: another)."""
    env = os.environ.get("TIDEWATER_SPARK_APP")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / "runtime" / "spark_app" / "ingest_batch.py"
