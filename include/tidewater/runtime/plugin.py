"""Tidewater in Airflow: the plugin that serves the Tidewater view. Airflow finds it through the package's
``airflow.plugins`` entry point (pyproject.toml), so an Airflow that has the package installed needs no plugins folder.
The provider metadata is ``tidewater.runtime.provider``'s.

- A FastAPI app at ``/tidewater`` on the API server (``tidewater.runtime.ui``): the JSON API, the Data Docs sites, the
  React apps' bundle and a plain HTML page.
- **Airflow 3.1 and later** (``AirflowPlugin.react_apps``), when the bundle is built (``make setup`` builds it
  from the repository's ``ui/``, TypeScript with Airflow's React and Chakra UI as externals; the wheel ships it):
  React apps in Airflow's own UI and look (dark mode included): the "Tidewater" page in the navigation (every
  pipeline, then one in detail), a "Tidewater" tab on every DAG (its pipeline: partitions, lag over time, batches,
  dead letters to browse and retry, quarantine, maintenance), a "Tidewater batch" tab on every DAG run (that run's
  batch) and, on Airflow 3.3, a panel on the dashboard (every pipeline's lag, freshness against its deadline,
  quarantines, dead letters).
- **Without the bundle**: the plain page as the "Tidewater" entry of the navigation (an external view in a frame).
  Airflow 3.0 has neither external views nor React apps (both 3.1): there the plain page answers at ``/tidewater/``
  only, outside Airflow's navigation.
"""

from __future__ import annotations

from pathlib import Path

from airflow.plugins_manager import AirflowPlugin

from tidewater.runtime.ui import STATIC, create_app

BUNDLE = STATIC / "tidewater-ui.js"


def react_apps_supported() -> bool:
    """Airflow's plugin manager knows React apps (3.1 and later)."""
    return hasattr(AirflowPlugin, "react_apps")


def dashboard_supported() -> bool:
    """Airflow's UI takes React apps on its dashboard (``destination: dashboard``, Airflow 3.3): an older API server
    would refuse the destination when it lists the plugins, so the panel is offered only where it is known."""
    try:
        from airflow.api_fastapi.core_api.datamodels.plugins import ReactAppResponse
    except ImportError:  # Airflow 3.0: no React apps at all
        return False
    return "dashboard" in str(ReactAppResponse.model_fields["destination"].annotation)


def react_apps(bundle: Path = BUNDLE) -> list[dict[str, str]]:
    """The React apps (none without the bundle). One bundle serves them all: the component chooses its page from the
    route (its ids, and the dashboard's home page); each app gets its own URL (a query) because the UI imports a bundle
    once per URL and keeps the component it exported under the app's name. The URL is relative: Airflow's UI resolves
    it against the page's base (``new URL(bundle_url, document.baseURI)``), so it holds behind a base-URL prefix
    (``[api] base_url`` with a path), where ``/tidewater/...`` would leave the prefix out."""
    if not bundle.is_file():
        return []
    url = f"tidewater/static/{bundle.name}?v={int(bundle.stat().st_mtime)}"
    nav = {"name": "Tidewater", "bundle_url": url + "&page=nav", "destination": "nav", "url_route": "tidewater"}
    icon = bundle.parent / "tidewater.svg"  # copied from ui/public/ by the build; relative as the bundle's URL
    if icon.is_file():
        nav["icon"] = f"tidewater/static/{icon.name}"
    apps = [
        nav,
        {"name": "Tidewater pipeline", "bundle_url": url + "&page=dag", "destination": "dag", "url_route": "tidewater-pipeline"},
        {"name": "Tidewater batch", "bundle_url": url + "&page=run", "destination": "dag_run", "url_route": "tidewater-batch"},
    ]
    if dashboard_supported():
        apps.append({"name": "Tidewater pipelines", "bundle_url": url + "&page=dashboard", "destination": "dashboard"})
    return apps


def views() -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(React apps, external views): the apps where Airflow loads them, else the plain page."""
    apps = react_apps() if react_apps_supported() else []
    if apps:
        return apps, []
    return [], [{"name": "Tidewater", "href": "/tidewater/", "destination": "nav", "url_route": "tidewater"}]


class TidewaterPlugin(AirflowPlugin):
    name = "tidewater"
    fastapi_apps = [{"app": create_app(), "url_prefix": "/tidewater", "name": "Tidewater"}]
    react_apps, external_views = views()
