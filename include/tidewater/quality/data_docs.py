"""The quality gate's report as great-expectations Data Docs (HTML), one page per batch.

Pages are rendered with great-expectations' own validation-results renderer from the gate's checks
(the suite's expectations and the built-in ones) and written to ``validation.data_docs_dir``
(default ``$TIDEWATER_HOME/data-docs/<pipeline>/``), with an ``index.html`` listing the newest batches.
The validate task logs the page's address.
"""

from __future__ import annotations

import html
import logging
import os
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


def write_page(spec: PipelineSpec, report: Any, table: str) -> Path | None:
    """Render ``report`` and write it; returns the page's path (None if rendering failed: the gate's
    verdict never depends on the page)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    try:
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
    path = directory / f"{report.batch_id}.html"
    path.write_text(page)
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
