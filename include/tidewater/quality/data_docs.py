"""The quality gate's report as great-expectations Data Docs: a great-expectations file data context per
pipeline, its validation results store and its Data Docs site.

The context lives in ``validation.data_docs_dir`` (default ``$TIDEWATER_HOME/data-docs/<pipeline>/``,
``gx/`` inside it). Each batch's checks (the suite's expectations and the built-in ones) become one
validation result in the context's store (suite = the batch's suite, run name = the batch id, batch
identifier = the table), and ``build_data_docs`` renders its page and the site's index, with the Home and
suite links of a real site. The store keeps the newest ``INDEX_ROWS`` results (older ones, and their pages,
leave the site), so a page costs about the same after a thousand batches as after two hundred. The Tidewater view
serves the site (``runtime/ui.py``), with ``<batch id>.html`` redirecting to the batch's page.

The gate's report is always saved first (``<batch id>.json`` next to ``gx/``). Importing
great-expectations costs 2-4 s, more than a small batch's whole data path, so the validate step renders
the page at once only when great-expectations is loaded anyway (a suite ran) or the batch failed; a
batch checked by the built-in checks alone gets its page from :func:`render_pending`, which the ingest
DAG runs as its ``data_docs`` task next to the commit (never before it) and ``tidewater run`` starts in
the background once the batch is committed (``tidewater data-docs`` renders them by hand). A rendered
batch's report file is removed (the result is in the store).

On object storage (``validation.data_docs_dir: s3://...``) the project lives under the same prefix layout.
great-expectations 1.x keeps a project on local files only (its S3, GCS and Azure store backends were removed;
its advice is to keep the files and copy them), so a page is rendered in a private copy of the project in a
temporary directory and what changed is copied back (:func:`_working_copy`); reports and pages are read from
the bucket directly, by the Tidewater view too.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tidewater.batch import read_json, write_json_atomic
from tidewater.config.locations import home_dir
from tidewater.config.spec import PipelineSpec
from tidewater.quality.gate import ValidationReport, import_great_expectations

log = logging.getLogger(__name__)


INDEX_ROWS = 200  # validation results kept in the context's store (the site's index lists them)


EXTRA = ("table", "scope")  # our own qualifiers of a check, shown as notes


def docs_dir(spec: PipelineSpec) -> Any:
    """The pipeline's project: a local directory (a Path) or a prefix on object storage (an ObjectPath)."""
    if spec.validation.data_docs_dir:
        return spec.stage(spec.validation.data_docs_dir, "validation.data_docs_dir") / spec.name
    return home_dir() / "data-docs" / spec.name


def _result(check: Any) -> Any:
    """A great-expectations result for one of our checks (built-in ones shown as the nearest expectation,
    with their own name in the notes)."""
    from great_expectations.core import ExpectationValidationResult
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration
    from great_expectations.expectations.registry import get_expectation_impl

    kwargs = {k: v for k, v in check.kwargs.items() if k not in EXTRA}
    etype = check.expectation
    meta: dict[str, Any] = {}
    try:
        get_expectation_impl(etype)
    except Exception:  # noqa: BLE001 - not a great-expectations expectation (GX's own kinds): a Tidewater check
        meta = {"notes": {"format": "markdown", "content": [f"Tidewater check: **{check.expectation}** {html.escape(str(check.kwargs))}"]}}
        etype, kwargs = "expect_table_row_count_to_equal", {"value": check.kwargs.get("read", 0)}
    for k in EXTRA:
        if k in check.kwargs:
            meta.setdefault("notes", {"format": "markdown", "content": []})["content"].append(f"{k}: `{check.kwargs[k]}`")
    result = {
        k: v for k, v in check.observed.items() if k in ("observed_value", "element_count", "unexpected_count", "partial_unexpected_list")
    }
    if "unexpected_count" in result and result.get("element_count"):
        result["unexpected_percent"] = 100.0 * result["unexpected_count"] / result["element_count"]
    return ExpectationValidationResult(
        success=check.success, result=result, expectation_config=ExpectationConfiguration(type=etype, kwargs=kwargs, meta=meta)
    )


def report_path(spec: PipelineSpec, batch_id: str) -> Any:
    return docs_dir(spec) / f"{batch_id}.json"


SITE = "gx/uncommitted/data_docs/local_site"  # great-expectations' default local site, in the project
RESULTS = "gx/uncommitted/validations"  # its validation results store


def site_dir(spec: PipelineSpec) -> Any:
    """The root of the context's Data Docs site."""
    return docs_dir(spec) / SITE


_BATCH_ID = re.compile(r"^[A-Za-z0-9_.:+-]+$")


def page_of(spec: PipelineSpec, batch_id: str) -> Any:
    """The batch's page in the site (``validations/<suite>/<batch id>/<run time>/<table>.html``), if rendered."""
    if not _BATCH_ID.match(batch_id):
        return None
    root = site_dir(spec) / "validations"
    if isinstance(root, Path):
        pages = sorted(root.glob(f"**/{batch_id}/*/*.html"))  # a dotted suite name nests
    else:
        pages = sorted(p for p in root.rglob("*") if p.name.endswith(".html") and p.parent.parent.name == batch_id)
    return pages[-1] if pages else None


def has_page(spec: PipelineSpec, batch_id: str) -> bool:
    """The batch has a page, rendered or pending (its report saved)."""
    return page_of(spec, batch_id) is not None or report_path(spec, batch_id).is_file()


def save_report(spec: PipelineSpec, report: Any, table: str) -> Any:
    """Keep the gate's report for its page (rendered now or by :func:`render_pending`)."""
    path = report_path(spec, report.batch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, json.loads(json.dumps({"table": table, "report": report.to_json()}, default=str)))
    return path


def publish(spec: PipelineSpec, report: Any, table: str) -> Any:
    """Save the report and render its page when that is cheap (great-expectations already loaded) or
    needed now (the batch failed). Returns the page's path, or None when it is left for later."""
    save_report(spec, report, table)
    if "great_expectations" in sys.modules or not report.success:
        return write_page(spec, report, table)
    return None


def render_pending(spec: PipelineSpec, batch_id: str | None = None) -> list[Any]:
    """Render the pages of saved reports that have none yet (only ``batch_id``'s when given)."""
    directory = docs_dir(spec)
    if batch_id:
        reports = [report_path(spec, batch_id)]
    else:
        reports = sorted(p for p in directory.iterdir() if p.name.endswith(".json")) if directory.is_dir() else []
    done = []
    for path in reports:
        if not path.is_file():
            continue
        doc = read_json(path)
        page = write_page(spec, ValidationReport.from_json(doc["report"]), doc["table"])
        if page is not None:
            done.append(page)
    return done


def render_in_background(spec: PipelineSpec, batch_id: str) -> None:
    """Start ``tidewater data-docs`` for one batch in its own session (it outlives this process)."""
    cmd = [sys.executable, "-m", "tidewater.runtime.cli", "data-docs", "--pipeline", str(spec.source_path), "--batch", batch_id]
    subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def write_page(spec: PipelineSpec, report: Any, table: str) -> Any:
    """Store ``report`` as a validation result in the pipeline's data context and build its page; returns the
    page's path (None if that failed: the gate's verdict never depends on the page). The saved report
    file is removed once the page exists."""
    project = docs_dir(spec)
    if isinstance(project, Path):
        _render(project, report, table, spec)
    else:
        try:
            with _working_copy(project) as local:
                _render(local, report, table, spec)
        except Exception as e:  # noqa: BLE001 - the page is documentation, not the gate
            log.warning("could not keep the Data Docs page of batch %s in %s: %r", report.batch_id, project, e)
            return None
    page = page_of(spec, report.batch_id)
    if page is not None:
        report_path(spec, report.batch_id).unlink(missing_ok=True)
    return page


def _render(project: Path, report: Any, table: str, spec: PipelineSpec) -> None:
    """Build the batch's page in the local project ``project`` (a failure is logged, not raised)."""
    try:
        import_great_expectations()
        import great_expectations as gx
        from great_expectations.core.run_identifier import RunIdentifier
        from great_expectations.data_context.types.resource_identifiers import (
            ExpectationSuiteIdentifier,
            ValidationResultIdentifier,
        )

        now = datetime.now(timezone.utc)
        context = gx.get_context(mode="file", project_root_dir=str(project))
        key = ValidationResultIdentifier(
            expectation_suite_identifier=ExpectationSuiteIdentifier(name=report.suite),
            run_id=RunIdentifier(run_name=report.batch_id, run_time=now),
            batch_identifier=table,
        )
        results = [_result(c) for c in report.checks]
        context.validation_results_store.set(key, _suite_result(spec, report, table, now, results))
        _keep_newest(context.validation_results_store, project)
        context.build_data_docs(resource_identifiers=[key, *_suite_page(context, report.suite, results)])
    except Exception as e:  # noqa: BLE001 - the page is documentation, not the gate
        log.warning("could not render the Data Docs page of batch %s: %r", report.batch_id, e)


@contextlib.contextmanager
def _working_copy(project: Any) -> Iterator[Path]:
    """A private local copy of the project on object storage, for great-expectations to work in; afterwards what
    it added or changed is copied back and what it removed (results past ``INDEX_ROWS``) is removed there, with
    their pages. The pages of earlier batches, the bulk of the site, are not copied: they stand as empty files
    (the site's index lists the pages it finds), and a build only adds its own page and rewrites the index and
    the suite's page. Two renders at once each keep their own result and page; the index of the later one wins
    and lists both once a next page is built."""
    remote = project / "gx"
    pages = SITE.removeprefix("gx/") + "/validations/"
    empty = hashlib.sha256(b"").hexdigest()
    with tempfile.TemporaryDirectory(prefix="tidewater-data-docs-") as tmp:
        local = Path(tmp) / "gx"
        copied: dict[str, str] = {}
        for obj in remote.rglob("*"):
            rel = obj.relative_to(remote).as_posix()
            data = b"" if rel.startswith(pages) else obj.read_bytes()
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
            (local / rel).write_bytes(data)
            copied[rel] = hashlib.sha256(data).hexdigest()
        yield Path(tmp)
        now = {f.relative_to(local).as_posix(): f for f in local.rglob("*") if f.is_file()}
        for rel, f in now.items():
            data = f.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if copied.get(rel) != digest and not (rel.startswith(pages) and digest == empty):
                (remote / rel).write_bytes(data)
        results = RESULTS.removeprefix("gx/") + "/"
        for rel in sorted(copied.keys() - now.keys()):
            (remote / rel).unlink(missing_ok=True)
            if rel.startswith(results) and rel.endswith(".json"):  # a dropped result: its page goes too
                (remote / (pages + rel[len(results) : -len(".json")] + ".html")).unlink(missing_ok=True)


def _suite_page(context: Any, suite: str, results: list[Any]) -> list[Any]:
    """Keep the suite, as this batch was checked against it, in the context's expectation store, so that the
    page's link to its suite has a page. Returns the suite's identifier to build ([] if it could not be kept)."""
    from great_expectations.core import ExpectationSuite
    from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier

    try:
        expectations, seen = [], set()
        for r in results:
            config = r.expectation_config
            if repr(config.to_json_dict()) not in seen:
                seen.add(repr(config.to_json_dict()))
                expectations.append(config.to_domain_obj())
        context.suites.add_or_update(ExpectationSuite(name=suite, expectations=expectations))
    except Exception as e:  # noqa: BLE001 - the batch's page does not need it
        log.warning("could not keep suite %s in the Data Docs site: %r", suite, e)
        return []
    return [ExpectationSuiteIdentifier(name=suite)]


def _suite_result(spec: PipelineSpec, report: Any, table: str, now: datetime, results: list[Any]) -> Any:
    """The gate's report as a great-expectations suite validation result."""
    import great_expectations as gx
    from great_expectations.core import ExpectationSuiteValidationResult

    ok = sum(c.success for c in report.checks)
    return ExpectationSuiteValidationResult(
        success=report.success,
        results=results,
        suite_name=report.suite,
        statistics={
            "evaluated_expectations": len(results),
            "successful_expectations": ok,
            "unsuccessful_expectations": len(results) - ok,
            "success_percent": 100.0 * ok / len(results) if results else 100.0,
        },
        meta={
            "great_expectations_version": gx.__version__,
            "batch_id": report.batch_id,
            "run_id": {"run_name": report.batch_id, "run_time": now.isoformat()},
            "active_batch_definition": {
                "datasource_name": spec.catalog.name,
                "data_connector_name": "staged-files",
                "data_asset_name": table,
                "batch_identifiers": {"batch": report.batch_id},
            },
        },
    )


def _keep_newest(store: Any, project: Path) -> None:
    """Drop all but the newest ``INDEX_ROWS`` results from the store (the index is built from it and would
    grow with every batch; great-expectations then drops their pages from the site too), and the directories
    they leave empty (the store lists keys by walking them)."""
    keys = store.list_keys()
    if len(keys) <= INDEX_ROWS:
        return
    for key in sorted(keys, key=lambda k: k.run_id.run_time)[:-INDEX_ROWS]:
        store.remove_key(key)
    for root in (project / RESULTS, project / SITE / "validations"):
        _remove_empty_dirs(root)


def _remove_empty_dirs(root: Path) -> None:
    for here, _dirs, _files in sorted(os.walk(root), key=lambda w: -len(w[0])):  # deepest first
        if Path(here) != root and not any(Path(here).iterdir()):
            Path(here).rmdir()
