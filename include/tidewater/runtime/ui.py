"""The Tidewater view in the Airflow UI: a FastAPI app that Airflow's API server mounts at ``/tidewater``
(registered by ``tidewater.runtime.plugin`` through the package's ``airflow.plugins`` entry point), behind
Airflow's own authentication (the UI's session token, or a bearer token for the API).

| route | what |
| --- | --- |
| ``GET /tidewater/`` | the view (HTML; the Airflow navigation embeds it) |
| ``GET /tidewater/api/pipelines`` | the pipelines: name, DAG ids, target table |
| ``GET /tidewater/api/pipelines/{name}`` | one pipeline's overview (``tidewater.ops.overview``): lag and |
| | committed vs end offsets per partition, freshness, the last batches, dead letters by error class, |
| | quarantined batches, maintenance state |
| ``GET /tidewater/data-docs/{name}/{path}`` | the pipeline's great-expectations Data Docs site (``index.html``, |
| | its pages and static files); ``{batch id}.html`` redirects to that batch's page, rendering it on first |
| | request if the batch left it for later |

Each pipeline is shown only to users whom Airflow's auth manager lets read its ingest DAG (``GET`` on that DAG:
the list leaves the others out, their routes answer 403), so a deployment's DAG-level access rules cover the
view too.

Read-only itself: the view's actions are DAG runs, so every change is audited: Publish and Drop of a
quarantined batch trigger the quarantine DAG (Airflow's REST API, with the user's own session), replay and
skip link to their DAGs' trigger forms.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _pipelines() -> dict[str, Any]:
    from tidewater.config.parse import discover_pipelines, load_pipeline

    out = {}
    for path in discover_pipelines():
        try:
            spec = load_pipeline(path)
        except Exception as e:  # noqa: BLE001 - a broken file is shown as such, never hides the others
            log.warning("pipeline file %s: %s", path, e)
            continue
        out[spec.name] = spec
    return out


def _readable(user: Any, dag_ids: set[str]) -> set[str]:
    """The DAG ids among ``dag_ids`` the auth manager lets ``user`` read."""
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().filter_authorized_dag_ids(dag_ids=dag_ids, user=user, method="GET")


def create_app() -> Any:
    """The FastAPI app (every route requires an authenticated Airflow user, and each pipeline's routes the right to
    read its ingest DAG)."""
    from airflow.api_fastapi.core_api.security import get_user, requires_authenticated
    from fastapi import Depends, FastAPI, HTTPException
    from fastapi.responses import HTMLResponse

    app = FastAPI(title="Tidewater", description="Lag, freshness, batches and dead letters of Tidewater pipelines",
                  dependencies=[Depends(requires_authenticated())])

    def spec_of(name: str, user: Any) -> Any:
        spec = _pipelines().get(name)
        if spec is None:
            raise HTTPException(status_code=404, detail=f"no pipeline named {name!r}")
        if not _readable(user, {spec.dag_id}):
            raise HTTPException(status_code=403, detail=f"pipeline {name!r}: no access to its DAG {spec.dag_id}")
        return spec

    @app.get("/", response_class=HTMLResponse)
    def view() -> str:
        return (Path(__file__).parent / "ui_page.html").read_text()

    @app.get("/api/pipelines")
    def pipelines(user: Any = Depends(get_user)) -> list[dict[str, Any]]:  # noqa: B008 - FastAPI's idiom
        specs = _pipelines().values()
        readable = _readable(user, {s.dag_id for s in specs})
        return [{"name": s.name, "dag_id": s.dag_id, "table": s.checkpoint_table(), "targets": s.describe_targets(),
                 "replay_dag_id": f"replay_{s.name}", "quarantine_dag_id": f"quarantine_{s.name}"}
                for s in specs if s.dag_id in readable]

    @app.get("/api/pipelines/{name}")
    def pipeline(name: str, batches: int = 20, user: Any = Depends(get_user)) -> dict[str, Any]:  # noqa: B008
        from tidewater.errors import TidewaterError
        from tidewater.ops.overview import overview

        try:
            return overview(spec_of(name, user), batches=max(1, min(batches, 200)))
        except TidewaterError as e:
            raise HTTPException(status_code=503 if e.transient else 500, detail=str(e)) from None

    @app.get("/data-docs/{name}/{page:path}")
    def data_docs(name: str, page: str, user: Any = Depends(get_user)) -> Any:  # noqa: B008
        from fastapi.responses import RedirectResponse

        from tidewater.quality.data_docs import page_of, render_pending, report_path, site_dir

        spec = spec_of(name, user)
        if "/" not in page and page.endswith(".html") and page != "index.html":  # <batch id>.html: that batch's page
            batch = page.removesuffix(".html")
            if page_of(spec, batch) is None and report_path(spec, batch).is_file():
                render_pending(spec, batch)
            found = page_of(spec, batch)
            if found is None:
                raise HTTPException(status_code=404, detail=f"no Data Docs page for batch {batch} of pipeline {name}")
            # relative, so that the page's own relative links (Home, the suite, static files) resolve in the site
            return RedirectResponse(found.relative_to(site_dir(spec)).as_posix(), status_code=307)
        return _site_file(site_dir(spec), page, HTTPException(status_code=404, detail=f"no Data Docs file {page} for "
                                                                                       f"pipeline {name}"))

    return app


def _site_file(site: Any, page: str, missing: Exception) -> Any:
    """A file of a Data Docs site, local or on object storage (raises ``missing`` when absent or outside it)."""
    import mimetypes

    from fastapi.responses import FileResponse, Response

    if isinstance(site, Path):
        root = site.resolve()
        path = (root / page).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            raise missing
        return FileResponse(path)
    parts = page.split("/")  # on object storage: read through the file layer
    if not page or ".." in parts or "" in parts or not (site / page).is_file():
        raise missing
    return Response((site / page).read_bytes(), media_type=mimetypes.guess_type(page)[0] or "application/octet-stream")
