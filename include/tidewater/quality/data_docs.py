"""The quality gate's report as great-expectations Data Docs (HTML), one page per batch.

Pages are rendered with great-expectations' own validation-results renderer from the gate's checks
(the suite's expectations and the built-in ones) and written to ``validation.data_docs_dir``
(default ``$TIDEWATER_HOME/data-docs/<pipeline>/``), with an ``index.html`` listing the newest batches.
The validate task logs the page's address.

The gate's report is always saved first (``<batch id>.json`` next to the pages). Importing
great-expectations costs 2-4 s, more than a small batch's whole data path, so the validate step renders
the page at once only when great-expectations is loaded anyway (a suite ran) or the batch failed; a
batch checked by the built-in checks alone gets its page from :func:`render_pending`, which the ingest
DAG runs as its ``data_docs`` task next to the commit (never before it) and ``tidewater run`` starts in
the background once the batch is committed (``tidewater data-docs`` renders them by hand).
"""

from __future__ import annotations

import html
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tidewater.config.spec import PipelineSpec, home_dir

log = logging.getLogger(__name__)


INDEX_ROWS = 200


EXTRA = ("table", "scope")  # our own qualifiers of a check, shown as notes


def docs_dir(spec: PipelineSpec) -> Path:
    base = Path(spec.validation.data_docs_dir) if spec.validation.data_docs_dir else home_dir() / "data-docs"
    return base / spec.name


def _result(check: Any) -> Any:
    """A great-expectations result for one of our checks (built-in ones shown as the nearest expectation,
    with their own name in the notes)."""
    from great_expectations.core import ExpectationValidationResult
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration
    from great_expectations.expectations.registry import get_expectation_impl

    kwargs = {k: v for k, v in check.kwargs.items() if k not in EXTRA}
    etype, meta = check.expectation, {}
    try:
        get_expectation_impl(etype)
    except Exception:
        meta = {"notes": {"format": "markdown", "content": [f"Tidewater check: **{check.expectation}** "
                                                                 f"{html.escape(str(check.kwargs))}"]}}
        etype, kwargs = "expect_table_row_count_to_equal", {"value": check.kwargs.get("read", 0)}
    for k in EXTRA:
        if k in check.kwargs:
            meta.setdefault("notes", {"format": "markdown", "content": []})["content"].append(f"{k}: `{check.kwargs[k]}`")
    result = {k: v for k, v in check.observed.items() if k in ("observed_value", "element_count", "unexpected_count",
                                                               "partial_unexpected_list")}
    if "unexpected_count" in result and result.get("element_count"):
        result["unexpected_percent"] = 100.0 * result["unexpected_count"] / result["element_count"]
    return ExpectationValidationResult(success=check.success, result=result,
                                       expectation_config=ExpectationConfiguration(type=etype, kwargs=kwargs, meta=meta))


def report_path(spec: PipelineSpec, batch_id: str) -> Path:
    return docs_dir(spec) / f"{batch_id}.json"


def page_path(spec: PipelineSpec, batch_id: str) -> Path:
    return docs_dir(spec) / f"{batch_id}.html"


def save_report(spec: PipelineSpec, report: Any, table: str) -> Path:
    """Keep the gate's report for its page (rendered now or by :func:`render_pending`)."""
    import json

    from tidewater.batch import write_json_atomic

    path = report_path(spec, report.batch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, json.loads(json.dumps({"table": table, "report": report.to_json()}, default=str)))
    return path


def publish(spec: PipelineSpec, report: Any, table: str) -> tuple[Path, bool]:
    """Save the report and render its page when that is cheap (great-expectations already loaded) or
    needed now (the batch failed). Returns (the page's path, whether it was rendered now)."""
    import sys

    save_report(spec, report, table)
    if "great_expectations" in sys.modules or not report.success:
        return page_path(spec, report.batch_id), write_page(spec, report, table) is not None
    return page_path(spec, report.batch_id), False


def render_pending(spec: PipelineSpec, batch_id: str | None = None) -> list[Path]:
    """Render the pages of saved reports that have none yet (only ``batch_id``'s when given)."""
    from tidewater.batch import read_json
    from tidewater.quality.gate import ValidationReport

    directory = docs_dir(spec)
    reports = [report_path(spec, batch_id)] if batch_id else sorted(directory.glob("*.json"))
    done = []
    for path in reports:
        if not path.is_file() or path.with_suffix(".html").is_file():
            continue
        doc = read_json(path)
        page = write_page(spec, ValidationReport.from_json(doc["report"]), doc["table"])
        if page is not None:
            done.append(page)
    return done


def render_in_background(spec: PipelineSpec, batch_id: str) -> None:
    """Start ``tidewater data-docs`` for one batch in its own session (it outlives this process)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "tidewater.runtime.cli", "data-docs", "--pipeline", str(spec.source_path),
           "--batch", batch_id]
    subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)


def write_page(spec: PipelineSpec, report: Any, table: str) -> Path | None:
    """Render ``report`` and write it; returns the page's path (None if rendering failed: the gate's
    verdict never depends on the page)."""
    from tidewater.quality.gate import import_great_expectations

    try:
        import_great_expectations()
        from great_expectations.core import ExpectationSuiteValidationResult
        from great_expectations.render.renderer import ValidationResultsPageRenderer
        from great_expectations.render.view import DefaultJinjaPageView

        results = [_result(c) for c in report.checks]
        ok = sum(c.success for c in report.checks)
        now = datetime.now(timezone.utc)
        suite = ExpectationSuiteValidationResult(
            success=report.success, results=results, suite_name=report.suite,
            statistics={"evaluated_expectations": len(results), "successful_expectations": ok,
                        "unsuccessful_expectations": len(results) - ok,
                        "success_percent": 100.0 * ok / len(results) if results else 100.0},
            meta={"batch_id": report.batch_id, "run_id": {"run_name": report.batch_id, "run_time": now.isoformat()},
                  "active_batch_definition": {"datasource_name": spec.catalog.name, "data_connector_name": "staged-files",
                                              "data_asset_name": table, "batch_identifiers": {"batch": report.batch_id}}},
        )
        page = DefaultJinjaPageView().render(ValidationResultsPageRenderer().render(suite))
    except Exception as e:  # noqa: BLE001 - the page is documentation, not the gate
        log.warning("could not render the Data Docs page of batch %s: %r", report.batch_id, e)
        return None
    directory = docs_dir(spec)
    directory.mkdir(parents=True, exist_ok=True)
    path = page_path(spec, report.batch_id)
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(page)
    tmp.replace(path)
    _write_index(directory, spec)
    return path


def _write_index(directory: Path, spec: PipelineSpec) -> None:
    pages = sorted((p for p in directory.glob("*.html") if p.name != "index.html"), key=lambda p: p.stat().st_mtime,
                   reverse=True)[:INDEX_ROWS]
    rows = "".join(f'<li><a href="{html.escape(p.name)}">{html.escape(p.stem)}</a></li>' for p in pages)
    (directory / "index.html").write_text(
        f"<!doctype html><title>{html.escape(spec.name)}: validation results</title>"
        f"<h1>{html.escape(spec.name)}: validation results (newest first)</h1><ul>{rows}</ul>"
    )
