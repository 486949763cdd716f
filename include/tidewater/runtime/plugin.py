"""Tidewater in Airflow: the plugin that serves the Tidewater view (a FastAPI app at ``/tidewater`` on the API server
and a "Tidewater" entry in the UI's navigation; the app is ``tidewater.runtime.ui``). Airflow finds it through the
package's ``airflow.plugins`` entry point (pyproject.toml), so an Airflow that has the package installed needs no
plugins folder. The provider metadata is ``tidewater.runtime.provider``'s.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from tidewater.runtime.ui import create_app


class TidewaterPlugin(AirflowPlugin):
    name = "tidewater"
    fastapi_apps = [{"app": create_app(), "url_prefix": "/tidewater", "name": "Tidewater"}]
    external_views = [{"name": "Tidewater", "href": "/tidewater/", "destination": "nav", "url_route": "tidewater"}]
