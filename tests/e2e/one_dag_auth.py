"""An auth manager for the view's access test: Airflow's simple auth manager, except that the user ``limited`` may
read only the DAGs named in ``TIDEWATER_TEST_READABLE_DAGS`` (comma-separated), as a deployment's DAG-level access
rules (Airflow's FAB roles with per-DAG permissions, Keycloak policies) would allow. Loaded by the API server through
``AIRFLOW__CORE__AUTH_MANAGER=tests.e2e.one_dag_auth.OneDagAuthManager``."""

from __future__ import annotations

import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager


class OneDagAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        if user.get_name() == "limited":
            readable = set(os.environ.get("TIDEWATER_TEST_READABLE_DAGS", "").split(","))
            return method == "GET" and details is not None and details.id in readable
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
