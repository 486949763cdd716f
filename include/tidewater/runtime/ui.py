"""The Tidewater view in the Airflow UI: a FastAPI app that Airflow's API server mounts at ``/tidewater``
(registered by ``tidewater.runtime.plugin`` through the package's ``airflow.plugins`` entry point), behind
Airflow's own authentication (the UI's session token, or a bearer token for the API).

| route | what |
| --- | --- |
| ``GET /tidewater/`` | the plain page (HTML), for an Airflow that cannot load the React apps (``plugin.py``) |
| ``GET /tidewater/api/pipelines`` | the pipelines: name, DAG ids, target table |
| ``GET /tidewater/api/summaries`` | a page of pipelines (``offset``, ``limit`` up to 200; sorted by name), each |
| | with its lag, freshness, last audit, quarantined batches and open dead letters (``tidewater.ops.pipelines``: |
| | one metadata and one offsets request per broker for the page), and ``total`` |
| ``GET /tidewater/api/problems`` | pipeline files that do not load on this server: file, failing DAG id, error |
| ``GET /tidewater/api/pipelines/{name}`` | one pipeline's overview (``tidewater.ops.overview``): lag and |
| | committed vs end offsets per partition, freshness, the last batches, dead letters by error class, |
| | quarantined batches, maintenance state |
| ``GET /tidewater/api/pipelines/{name}/lag-history`` | lag when each recent batch was planned (the ledger) |
| ``GET /tidewater/api/pipelines/{name}/dead-letters`` | the dead letters (``state``, ``error_class``, ``batch``, |
| | ``limit``) with a payload preview, and the counts per state (``table/letters.py``) |
| ``GET /tidewater/api/pipelines/{name}/runs/{run id}`` | the batch a DAG run committed: ranges, counts, verdict, |
| | snapshot and offsets, per table for routed pipelines |
| ``GET /tidewater/static/{file}`` | the React apps' bundle (``plugin.py``; static files, without the sign-in) |
| ``GET /tidewater/data-docs/{name}/{path}`` | the pipeline's great-expectations Data Docs site (``index.html``, |
| | its pages and static files); ``{batch id}.html`` redirects to that batch's page, rendering it on first |
| | request if the batch left it for later |

Every route but the bundle's requires Airflow's sign-in. Each pipeline is shown only to users whom Airflow's auth
manager lets read its ingest DAG (``GET`` on that DAG: the list leaves the others out, their routes answer 403), so
a deployment's DAG-level access rules cover the view too.

Read-only itself: the view's actions are DAG runs, so every change is audited: Publish and Drop of a
quarantined batch trigger the quarantine DAG, Retry of dead letters the retry DAG (Airflow's REST API, with the
user's own session), replay and skip link to their DAGs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

from airflow.api_fastapi.core_api.security import GetUserDep, requires_authenticated
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from tidewater.errors import ConfigError, TidewaterError

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "ui_static"  # the React apps' bundle, built by `make setup` (from ui/)
PAGE = 50  # pipelines on a page of the navigation page and the dashboard panel


# pipeline file -> ((modification time, size), its spec or None when it does not load, why not): see _pipelines
_LOADED: dict[Path, tuple[tuple[int, int], Any, str | None]] = {}


def _loaded(path: Path) -> Any:
    """The pipeline of ``path`` (None when it does not load or is gone), loaded again only when the file changed (its
    modification time or size). A broken file is logged when it is first seen broken."""
    from tidewater.config.parse import load_pipeline

    try:
        st = path.stat()
    except OSError:  # no such file, or removed since the folder was listed
        _LOADED.pop(path, None)
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _LOADED.get(path)
    if cached is None or cached[0] != stamp:
        spec, error = None, None
        try:
            spec = load_pipeline(path)
        except Exception as e:  # noqa: BLE001 - a broken file is shown as such (_problems), never hides the others
            log.warning("pipeline file %s: %s", path, e)
            error = str(e)
        cached = _LOADED[path] = (stamp, spec, error)
    return cached[1]


def _problems() -> list[dict[str, str]]:
    """Every pipeline file of the folder that does not load here, on the API server (a `${VAR}` unset on this host,
    a mistake in the file): its file, the DAG id it has in Airflow (the failing ``ingest_invalid_<file>`` DAG, when the
    DAG processor fails it too) and the error."""
    from tidewater.config.parse import discover_pipelines, invalid_dag_id

    out = []
    for path in discover_pipelines():
        if _loaded(path) is None and path in _LOADED:
            out.append({"file": path.name, "dag_id": invalid_dag_id(path), "error": _LOADED[path][2] or ""})
    return out


def _pipelines() -> dict[str, Any]:
    """Every pipeline of the pipelines folder that loads, by name (each file loaded again only when it changed)."""
    from tidewater.config.parse import discover_pipelines

    paths = discover_pipelines()
    for gone in set(_LOADED) - set(paths):
        _LOADED.pop(gone, None)
    return {spec.name: spec for spec in map(_loaded, paths) if spec is not None}


def _pipeline(name: str) -> Any:
    """The pipeline ``name``, or None. The navigation page asks for the list, then for each pipeline's overview, and
    each of those requests looks its pipeline up: from the file named after it (one file, as ``tidewater init`` and
    the examples name them), else from every file. Loading every file per request made the page's cost grow with the
    square of the pipelines (``make bench-scale``)."""
    from tidewater.config.locations import pipelines_dir

    for path in (pipelines_dir() / f"{name}.yaml", pipelines_dir() / f"{name}.yml"):
        spec = _loaded(path)
        if spec is not None and spec.name == name:
            return spec
    return _pipelines().get(name)


def _readable(user: Any, dag_ids: set[str]) -> set[str]:
    """The DAG ids among ``dag_ids`` the auth manager lets ``user`` read."""
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().filter_authorized_dag_ids(dag_ids=dag_ids, user=user, method="GET")


def readable_pipeline(name: str, user: GetUserDep) -> Any:
    """The dependency of every route of one pipeline: the pipeline ``name``, for a user the auth manager lets read
    its ingest DAG (404 when there is none by that name, 403 when the user may not read it)."""
    spec = _pipeline(name)
    if spec is None:
        raise HTTPException(status_code=404, detail=f"no pipeline named {name!r}")
    if not _readable(user, {spec.dag_id}):
        raise HTTPException(status_code=403, detail=f"pipeline {name!r}: no access to its DAG {spec.dag_id}")
    return spec


Pipeline = Annotated[Any, Depends(readable_pipeline)]

api = APIRouter(prefix="/api")


@api.get("/pipelines")
def listed(user: GetUserDep) -> list[dict[str, Any]]:
    specs = _pipelines().values()
    readable = _readable(user, {s.dag_id for s in specs})
    return [_ref(s) for s in specs if s.dag_id in readable]


@api.get("/summaries")
def summaries_page(user: GetUserDep, offset: int = 0, limit: int = PAGE) -> dict[str, Any]:
    """A page of the pipelines the user may read, one line each (the navigation page and the dashboard panel),
    asking each broker once for the page."""
    from tidewater.ops.pipelines import summaries

    specs = _pipelines()
    readable = _readable(user, {s.dag_id for s in specs.values()})
    shown = [specs[name] for name in sorted(specs) if specs[name].dag_id in readable]
    offset, limit = max(0, offset), max(1, min(limit, 200))
    chosen = shown[offset : offset + limit]
    lines = summaries(chosen)
    return {
        "total": len(shown),
        "offset": offset,
        "limit": limit,
        "pipelines": [{"ref": _ref(spec), "summary": line} for spec, line in zip(chosen, lines, strict=True)],
    }


@api.get("/problems")
def problems(user: GetUserDep) -> list[dict[str, str]]:
    """Pipeline files that do not load on this server, for users who may read their failing DAG."""
    found = _problems()
    readable = _readable(user, {p["dag_id"] for p in found})
    return [p for p in found if p["dag_id"] in readable]


@api.get("/pipelines/{name}")
def overview_of(spec: Pipeline, batches: int = 20) -> dict[str, Any]:
    from tidewater.ops.overview import overview

    return overview(spec, batches=max(1, min(batches, 200)))


@api.get("/pipelines/{name}/lag-history")
def lag_history_of(spec: Pipeline, limit: int = 100) -> list[dict[str, Any]]:
    from tidewater.ops.overview import lag_history

    return lag_history(spec, max(1, min(limit, 1000)))


@api.get("/pipelines/{name}/dead-letters")
def dead_letters(spec: Pipeline, state: str = "open", error_class: str = "", batch: str = "", limit: int = 50) -> dict[str, Any]:
    """The dead letters with their payloads: only for users who may read the pipeline's DAG (``Pipeline``)."""
    from tidewater.table.letters import listing

    return listing(spec, state=state, error_class=error_class or None, batch=batch or None, limit=max(1, min(limit, 500)))


@api.get("/pipelines/{name}/runs/{run_id:path}")
def run_of(spec: Pipeline, run_id: str) -> dict[str, Any]:
    from tidewater.ops.overview import run_detail

    return run_detail(spec, run_id)


pages = APIRouter()


@pages.get("/", response_class=HTMLResponse)
def view() -> str:
    return (Path(__file__).parent / "ui_page.html").read_text()


@pages.get("/data-docs/{name}/{page:path}")
def data_docs(spec: Pipeline, page: str) -> Any:
    """A file of the pipeline's Data Docs site; ``<batch id>.html`` redirects to that batch's page, rendering it
    first if the batch left it for later."""
    from tidewater.quality.data_docs import page_of, render_pending, report_path, site_dir

    missing = HTTPException(status_code=404, detail=f"no Data Docs file {page} for pipeline {spec.name}")
    if "/" not in page and page.endswith(".html") and page != "index.html":  # <batch id>.html: that batch's page
        batch = page.removesuffix(".html")
        if page_of(spec, batch) is None and report_path(spec, batch).is_file():
            render_pending(spec, batch)
        found = page_of(spec, batch)
        if found is None:
            raise HTTPException(status_code=404, detail=f"no Data Docs page for batch {batch} of pipeline {spec.name}")
        # relative, so that the page's own relative links (Home, the suite, static files) resolve in the site
        return RedirectResponse(found.relative_to(site_dir(spec)).as_posix(), status_code=307)
    return _site_file(site_dir(spec), page, missing)


class Bundle(StaticFiles):
    """The React apps' bundle (``plugin.py`` gives Airflow its URL), each file revalidated on every load
    (``Cache-Control: no-cache``) so that an upgraded bundle is never run stale beside a new API. Mounted, it is
    served without Airflow's sign-in, as Airflow serves its own UI's files: code that is in the package, no data."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "no-cache"
        return response


def tidewater_error(request: Request, e: Exception) -> JSONResponse:
    """Tidewater's errors as HTTP errors, in FastAPI's shape (``detail``): a bad setting or parameter 400, a transient
    error 503 (worth retrying), a terminal one 500."""
    status = 400 if isinstance(e, ConfigError) else 503 if isinstance(e, TidewaterError) and e.transient else 500
    return JSONResponse({"detail": str(e)}, status_code=status)


def create_app() -> FastAPI:
    """The FastAPI app: every route requires an authenticated Airflow user, and each pipeline's routes the right to
    read its ingest DAG (``Pipeline``); Tidewater's errors answer as HTTP errors (``tidewater_error``)."""
    app = FastAPI(
        title="Tidewater",
        description="Lag, freshness, batches and dead letters of Tidewater pipelines",
        dependencies=[Depends(requires_authenticated())],
    )
    app.add_exception_handler(TidewaterError, tidewater_error)
    app.include_router(api)
    app.include_router(pages)
    if STATIC.is_dir():  # built by `make setup`; without it the bundle's URLs answer 404
        app.mount("/static", Bundle(directory=STATIC), name="static")
    return app


def _ref(spec: Any) -> dict[str, Any]:
    """A pipeline as the view lists it: its name, tables and the ids of its DAGs (the DAG tab finds its pipeline by
    any of them; a DAG the pipeline does not have, by ``airflow.dags`` or its quarantine policy, is null)."""
    dags = spec.dag_ids()
    return {
        "name": spec.name,
        "dag_id": spec.dag_id,
        "table": spec.checkpoint_table(),
        "targets": spec.describe_targets(),
        "dag_ids": list(dags.values()),
        "replay_dag_id": dags.get("replay"),
        "skip_dag_id": dags.get("skip"),
        "quarantine_dag_id": dags.get("quarantine"),
        "retry_dag_id": dags.get("retry_dead_letters"),
        "freshness_deadline_s": int(fresh.total_seconds()) if (fresh := spec.airflow.freshness_interval()) else None,
    }


def _site_file(site: Any, page: str, missing: Exception) -> Any:
    """A file of a Data Docs site, local or on object storage (raises ``missing`` when absent or outside it)."""
    import mimetypes

    from fastapi.responses import FileResponse

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
