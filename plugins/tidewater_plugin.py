"""Registers the Tidewater view with Airflow: a FastAPI app at /tidewater on the API server and a
"Tidewater" entry in the UI's navigation that shows it (the app itself is tidewater.runtime.ui)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from tidewater.runtime.ui import create_app


class TidewaterPlugin(AirflowPlugin):
    name = "tidewater"
    fastapi_apps = [{"app": create_app(), "url_prefix": "/tidewater", "name": "Tidewater"}]
    external_views = [{"name": "Tidewater", "href": "/tidewater/", "destination": "nav", "url_route": "tidewater"}]
