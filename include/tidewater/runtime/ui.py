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
| ``GET /tidewater/static/{file}`` | the React apps' bundle (``plugin.py``) |
| ``GET /tidewater/data-docs/{name}/{path}`` | the pipeline's great-expectations Data Docs site (``index.html``, |
| | its pages and static files); ``{batch id}.html`` redirects to that batch's page, rendering it on first |
| | request if the batch left it for later |

Each pipeline is shown only to users whom Airflow's auth manager lets read its ingest DAG (``GET`` on that DAG:
the list leaves the others out, their routes answer 403), so a deployment's DAG-level access rules cover the
view too.

Read-only itself: the view's actions are DAG runs, so every change is audited: Publish and Drop of a
quarantined batch trigger the quarantine DAG, Retry of dead letters the retry DAG (Airflow's REST API, with the
user's own session), replay and skip link to their DAGs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

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


def _page_route(app: Any) -> None:
    """``GET /api/summaries``: a page of the pipelines the user may read, one line each (the navigation page and the
    dashboard panel), asking each broker once for the page."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi import Depends

    @app.get("/api/summaries")
    def page(offset: int = 0, limit: int = PAGE, user: Any = Depends(get_user)) -> dict[str, Any]:  # noqa: B008
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
            "pipelines": [{"ref": _ref(spec), "summary": line} for spec, line in zip(chosen, lines)],
        }


def _problem_route(app: Any) -> None:
    """``GET /api/problems``: pipeline files that do not load on this server, for users who may read their failing DAG."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi import Depends

    @app.get("/api/problems")
    def problems(user: Any = Depends(get_user)) -> list[dict[str, str]]:  # noqa: B008 - FastAPI's idiom
        found = _problems()
        readable = _readable(user, {p["dag_id"] for p in found})
        return [p for p in found if p["dag_id"] in readable]


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

    app = FastAPI(
        title="Tidewater",
        description="Lag, freshness, batches and dead letters of Tidewater pipelines",
        dependencies=[Depends(requires_authenticated())],
    )

    def spec_of(name: str, user: Any) -> Any:
        spec = _pipeline(name)
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
        return [_ref(s) for s in specs if s.dag_id in readable]

    _page_route(app)
    _problem_route(app)

    @app.get("/api/pipelines/{name}")
    def pipeline(name: str, batches: int = 20, user: Any = Depends(get_user)) -> dict[str, Any]:  # noqa: B008
        from tidewater.ops.overview import overview

        return _answer(lambda: overview(spec_of(name, user), batches=max(1, min(batches, 200))))

    _history_letters_and_runs(app, spec_of)
    _bundle(app)

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
        return _site_file(site_dir(spec), page, HTTPException(status_code=404, detail=f"no Data Docs file {page} for pipeline {name}"))

    return app


def _history_letters_and_runs(app: Any, spec_of: Any) -> None:
    """The routes of the React apps' charts, dead letters and DAG run tab."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi import Depends

    @app.get("/api/pipelines/{name}/lag-history")
    def lag_history(name: str, limit: int = 100, user: Any = Depends(get_user)) -> list[dict[str, Any]]:  # noqa: B008
        from tidewater.ops.overview import lag_history

        return _answer(lambda: lag_history(spec_of(name, user), max(1, min(limit, 1000))))

    @app.get("/api/pipelines/{name}/dead-letters")
    def letters(
        name: str,
        state: str = "open",
        error_class: str = "",
        batch: str = "",
        limit: int = 50,
        user: Any = Depends(get_user),  # noqa: B008
    ) -> dict[str, Any]:
        from tidewater.table.letters import listing

        spec = spec_of(name, user)  # payloads only for users who may read the pipeline's DAG
        return _answer(
            lambda: listing(spec, state=state, error_class=error_class or None, batch=batch or None, limit=max(1, min(limit, 500)))
        )

    @app.get("/api/pipelines/{name}/runs/{run_id:path}")
    def run(name: str, run_id: str, user: Any = Depends(get_user)) -> dict[str, Any]:  # noqa: B008
        from tidewater.ops.overview import run_detail

        return _answer(lambda: run_detail(spec_of(name, user), run_id))


def _bundle(app: Any) -> None:
    """The React apps' bundle (``plugin.py`` gives Airflow its URL)."""
    from fastapi import HTTPException

    @app.get("/static/{file}")
    def static(file: str) -> Any:
        from fastapi.responses import FileResponse

        path = STATIC / file
        if "/" in file or not path.is_file():
            raise HTTPException(status_code=404, detail=f"no file {file}")
        return FileResponse(path, media_type="text/javascript" if file.endswith(".js") else None, headers={"Cache-Control": "no-cache"})


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


def _answer(make: Any) -> Any:
    """``make()``, with Tidewater's errors as HTTP errors: transient 503 (worth retrying), terminal 500, a bad
    parameter 400."""
    from fastapi import HTTPException

    from tidewater.errors import ConfigError, TidewaterError

    try:
        return make()
    except ConfigError as e:
        raise HTTPException(status_code=400, detail=str(e)) from None
    except TidewaterError as e:
        raise HTTPException(status_code=503 if e.transient else 500, detail=str(e)) from None


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
