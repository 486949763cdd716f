"""The data-quality gate: a great-expectations suite run on a staged batch before it is committed.

Built-in expectations: the staged files hold exactly as many rows as records were read, and the
configured ``validation.not_null`` columns have no nulls. A per-pipeline suite file adds more.
Only the columns the expectations name are read from the staged files.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from tidewater.batch import BatchManifest
from tidewater.config import PipelineSpec
from tidewater.errors import ConfigError, ValidationFailedError

log = logging.getLogger(__name__)

_COLUMN_KWARGS = ("column", "column_A", "column_B")


@dataclass(frozen=True)
class CheckResult:
    expectation: str
    kwargs: dict[str, Any]
    success: bool
    observed: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items() if k != "batch_id")
        status = "ok  " if self.success else "FAIL"
        obs = ", ".join(f"{k}={v!r}" for k, v in self.observed.items())
        return f"  {status} {self.expectation}({args}){'  -> ' + obs if obs and not self.success else ''}"


@dataclass(frozen=True)
class ValidationReport:
    batch_id: str
    suite: str
    success: bool
    rows: int
    checks: tuple[CheckResult, ...]

    def text(self) -> str:
        head = f"validation of batch {self.batch_id} ({self.rows} rows, suite {self.suite}): " + (
            "passed" if self.success else "FAILED"
        )
        return "\n".join([head, *(c.line() for c in self.checks)])

    def summary(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "success": self.success,
            "rows": self.rows,
            "checks": len(self.checks),
            "failed": sum(not c.success for c in self.checks),
        }


def load_suite_file(spec: PipelineSpec) -> list[dict[str, Any]]:
    path = spec.suite_path()
    if path is None:
        return []
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"validation.suite: cannot read {path}: {e}") from None
    exps = doc.get("expectations") if isinstance(doc, dict) else None
    if not isinstance(exps, list):
        raise ConfigError(f"validation.suite: {path} must hold {{\"expectations\": [...]}}")
    for i, e in enumerate(exps):
        if not isinstance(e, dict) or not isinstance(e.get("type"), str) or not isinstance(e.get("kwargs", {}), dict):
            raise ConfigError(f"validation.suite: {path}: expectations[{i}] needs a string 'type' and a 'kwargs' mapping")
    return exps


def _read_columns(table: Any, manifest: BatchManifest, columns: list[str]) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pieces = []
    for f in manifest.data_files:
        with table.io.new_input(f["file_path"]).open() as fh:
            pf = pq.ParquetFile(fh)
            present = [c for c in columns if c in pf.schema_arrow.names]
            t = pf.read(columns=present)
            if not present:
                t = pa.table({"__row": pa.nulls(pf.metadata.num_rows, pa.int8())})
            pieces.append(t)
    if not pieces:
        return pa.table({c: pa.array([], pa.null()) for c in columns} or {"__row": pa.array([], pa.int8())})
    return pa.concat_tables(pieces, promote_options="permissive")


def validate_batch(spec: PipelineSpec, table: Any, manifest: BatchManifest) -> ValidationReport:
    """Run the suite on the staged files. Returns the report; does not raise on failure."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    expectations: list[dict[str, Any]] = [
        {"type": "expect_table_row_count_to_equal", "kwargs": {"value": manifest.records}},
        *({"type": "expect_column_values_to_not_be_null", "kwargs": {"column": c}} for c in spec.validation.not_null),
        *load_suite_file(spec),
    ]
    columns: list[str] = []
    for e in expectations:
        for k in _COLUMN_KWARGS:
            c = e.get("kwargs", {}).get(k)
            if isinstance(c, str) and c not in columns:
                columns.append(c)
        for c in e.get("kwargs", {}).get("column_list", []) or []:
            if c not in columns:
                columns.append(c)
    df = _read_columns(table, manifest, columns).to_pandas()

    ctx = gx.get_context(mode="ephemeral")
    try:
        from great_expectations.data_context.types.base import ProgressBarsConfig

        ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    except Exception:  # progress bars are cosmetic
        pass
    asset = ctx.data_sources.add_pandas("tidewater").add_dataframe_asset(name="staged_batch")
    definition = asset.add_batch_definition_whole_dataframe("batch")
    suite_name = f"{spec.name}.{os.path.basename(str(spec.suite_path()))}" if spec.suite_path() else f"{spec.name}.builtin"
    suite = gx.ExpectationSuite(name=suite_name)
    for e in expectations:
        suite.add_expectation_configuration(ExpectationConfiguration(type=e["type"], kwargs=e.get("kwargs", {})))
    suite = ctx.suites.add(suite)
    vd = ctx.validation_definitions.add(gx.ValidationDefinition(name=f"{spec.name}-batch", data=definition, suite=suite))
    try:
        result = vd.run(batch_parameters={"dataframe": df}, result_format="SUMMARY")
    except Exception as e:
        raise ConfigError(f"validation.suite: great-expectations could not run the suite: {e}") from e
    checks = []
    for r in result.results:
        res = r.result or {}
        observed = {
            k: res[k]
            for k in ("observed_value", "unexpected_count", "unexpected_percent", "partial_unexpected_list")
            if k in res and res[k] not in (None, [])
        }
        if r.exception_info and r.exception_info.get("raised_exception"):
            observed["error"] = r.exception_info.get("exception_message")
        checks.append(CheckResult(r.expectation_config.type, dict(r.expectation_config.kwargs), bool(r.success), observed))
    report = ValidationReport(manifest.batch_id, suite_name, bool(result.success), len(df), tuple(checks))
    log.info("%s", report.text())
    return report


def require_valid(report: ValidationReport) -> None:
    if not report.success:
        raise ValidationFailedError(report.text() + "\nNothing was committed; the offsets did not move.", batch_id=report.batch_id)
