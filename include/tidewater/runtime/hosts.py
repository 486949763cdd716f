"""Which hosts Airflow may run a batch's tasks on: its ``[core] executor`` setting, read without starting Airflow.

Used by the DAG factory at parse time and by ``tidewater validate`` (config/validate.check_hosts refuses per-host
places of state under a multi-host executor). Light: Airflow is not loaded for it (``config/airflow_section.airflow_option``:
the variable, Airflow's loaded configuration inside its processes, else airflow.cfg read as a file), so the command
line neither pays for Airflow nor leaves a default airflow.cfg behind.
"""

from __future__ import annotations

from tidewater.config.airflow_section import airflow_option


def airflow_executor() -> str | None:
    """``[core] executor`` as Airflow would read it, or None when nothing sets it (Airflow's default, Local)."""
    return airflow_option("core", "executor")
