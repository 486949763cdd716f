"""Tidewater's section of Airflow's configuration, ``[tidewater]``: where the deployment's settings can live beside
Airflow's own (airflow.cfg, ``AIRFLOW__TIDEWATER__*`` variables, and whatever else Airflow's configuration reads once
Airflow is loaded). The provider declares the section (``runtime/provider.py``), so ``airflow config list`` shows it.

Precedence, first set wins: the ``TIDEWATER_*`` variable, ``AIRFLOW__TIDEWATER__<OPTION>``, Airflow's loaded
configuration (inside Airflow's processes), then ``[tidewater]`` of airflow.cfg (``$AIRFLOW_CONFIG``, else
``$AIRFLOW_HOME/airflow.cfg``), read directly so that the command line does not load Airflow for it."""

from __future__ import annotations

import configparser
import os
import sys
from pathlib import Path

SECTION = "tidewater"

# option -> (the TIDEWATER_* variable that overrides it, description); the provider metadata lists them
OPTIONS: dict[str, tuple[str, str]] = {
    "pipelines_dir": (
        "TIDEWATER_PIPELINES_DIR",
        "The folder of pipeline files whose DAGs the DAG file builds and which the Tidewater view reads. "
        "Every Airflow component (DAG processor, scheduler, workers, api-server) must see the same "
        "folder.",
    ),
    "home": (
        "TIDEWATER_HOME",
        "The data folder of the embedded defaults (a SQLite catalog, a warehouse, staging, the repaired Iceberg "
        "jar). Default: ~/.tidewater. A deployment on several hosts sets catalog and staging in each pipeline "
        "instead.",
    ),
}


def setting(option: str) -> str | None:
    """The value of ``option`` (see the module's precedence), or None when nothing sets it."""
    env, _ = OPTIONS[option]
    return os.environ.get(env) or airflow_option(SECTION, option)


def airflow_option(section: str, option: str) -> str | None:
    """An option of Airflow's configuration as Airflow would read it, without loading Airflow (importing its
    configuration writes a default airflow.cfg where there is none): ``AIRFLOW__<SECTION>__<OPTION>``, else the loaded
    configuration inside Airflow's processes, else airflow.cfg. None when nothing sets it."""
    value = os.environ.get(f"AIRFLOW__{section.upper()}__{option.upper()}")
    if value:
        return value
    loaded = sys.modules.get("airflow.configuration")
    if loaded is not None and hasattr(loaded, "conf"):
        return loaded.conf.get(section, option, fallback=None) or None
    return _from_file(section, option)


def _from_file(section: str, option: str) -> str | None:
    """``[section] option`` of airflow.cfg (``$AIRFLOW_CONFIG``, else ``$AIRFLOW_HOME/airflow.cfg``), no interpolation."""
    path = Path(os.environ.get("AIRFLOW_CONFIG") or Path(os.environ.get("AIRFLOW_HOME") or "~/airflow") / "airflow.cfg")
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path.expanduser(), encoding="utf-8")
    except (OSError, configparser.Error):
        return None
    return parser.get(section, option, fallback=None) or None
