"""Which hosts Airflow may run a batch's tasks on: its ``[core] executor`` setting, read without starting Airflow.

Used by the DAG factory at parse time and by ``tidewater validate`` (config/validate.check_hosts refuses the per-host
defaults under a multi-host executor). Light: Airflow's configuration is read only when the environment does not set
the executor, and a machine without Airflow (the package installed alone) has none.
"""

from __future__ import annotations

import os


def airflow_executor() -> str | None:
    """``AIRFLOW__CORE__EXECUTOR``, else Airflow's configured executor, else None (no Airflow here)."""
    env = os.environ.get("AIRFLOW__CORE__EXECUTOR")
    if env:
        return env
    try:
        from airflow.configuration import conf
    except ImportError:  # the package installed without Airflow: no executor to ask
        return None
    return conf.get("core", "executor", fallback=None)
