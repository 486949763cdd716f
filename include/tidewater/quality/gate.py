"""The data-quality gate: a great-expectations suite run on a staged batch before it is committed.

Built-in expectations: the staged files hold exactly as many rows as records were read, and the
configured ``validation.not_null`` columns have no nulls (both from the counts in the manifest). A
per-pipeline suite file adds more; only the columns its expectations name are read, in chunks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tidewater.batch import BatchManifest, StagedFile, TableOutput
from tidewater.config.spec import PipelineSpec
from tidewater.errors import ConfigError, TerminalError, ValidationFailedError
from tidewater.table.catalog import load_table
from tidewater.table.filters import one_of
from tidewater.transform.changes import deletes_mask

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)


_COLUMN_KWARGS = ("column", "column_A", "column_B")


@dataclass(frozen=True)
class CheckResult:
    expectation: str
    kwargs: dict[str, Any]
    success: bool
    observed: dict[str, Any] = field(default_factory=dict)

    def call(self) -> str:
        """The expectation with its arguments, as it reads in a report: ``expect_x(column='a')``."""
        return f"{self.expectation}({', '.join(f'{k}={v!r}' for k, v in self.kwargs.items() if k != 'batch_id')})"

    def observed_text(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.observed.items())

    def line(self) -> str:
        status = "ok  " if self.success else "FAIL"
        obs = self.observed_text()
        return f"  {status} {self.call()}{'  -> ' + obs if obs and not self.success else ''}"


@dataclass(frozen=True)
class ValidationReport:
    batch_id: str
    suite: str
    success: bool
    rows: int
    checks: tuple[CheckResult, ...]
    tables: tuple[tuple[str, ValidationReport], ...] = ()  # routed pipelines: the report of each target table

    def text(self) -> str:
        head = f"validation of batch {self.batch_id} ({self.rows} rows, suite {self.suite}): " + ("passed" if self.success else "FAILED")
        return "\n".join([head, *(c.line() for c in self.checks)])

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "suite": self.suite,
            "success": self.success,
            "rows": self.rows,
            "checks": [
                {"expectation": c.expectation, "kwargs": c.kwargs, "success": c.success, "observed": c.observed} for c in self.checks
            ],
            "tables": [[t, r.to_json()] for t, r in self.tables],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ValidationReport:
        return cls(
            doc["batch_id"],
            doc["suite"],
            doc["success"],
            doc["rows"],
            tuple(CheckResult(**c) for c in doc["checks"]),
            tuple((t, cls.from_json(r)) for t, r in doc.get("tables", [])),
        )

    def summary(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "success": self.success,
            "rows": self.rows,
            "checks": len(self.checks),
            "failed": sum(not c.success for c in self.checks),
            **({"tables": {t: r.summary() for t, r in self.tables}} if self.tables else {}),
        }


@dataclass(frozen=True)
class TableFiles:
    """One target table's staged files and the records behind their rows: what its checks hold the files to.

    A plain pipeline's one table takes every record of the batch, so its counts are the batch's (read = rows +
    dead letters + skipped + already present: ``of_batch``). A routed pipeline's table is held to the rows the
    writer routed to it (``of_output``); the batch's own accounting is then checked once, over all its tables
    (``routed_accounting``)."""

    table: str
    data_files: tuple[StagedFile, ...]
    records: int  # records read into this table
    dead_letters: int = 0
    skipped: int = 0
    present: int = 0
    dead_letters_in_files: int = 0

    @classmethod
    def of_batch(cls, manifest: BatchManifest) -> TableFiles:
        return cls(
            manifest.table,
            tuple(manifest.data_files),
            manifest.records,
            manifest.dead_letters,
            manifest.skipped,
            manifest.present,
            manifest.dead_letters_in_files,
        )

    @classmethod
    def of_output(cls, out: TableOutput) -> TableFiles:
        return cls(out.table, tuple(out.data_files), out.rows)

    @property
    def rows_expected(self) -> int:
        """Rows the data files must hold (see ``BatchManifest.rows_expected``)."""
        return self.records - self.dead_letters - self.skipped - self.present

    @property
    def rows_in_files(self) -> int:
        return sum(f.record_count for f in self.data_files)


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
        raise ConfigError(f'validation.suite: {path} must hold {{"expectations": [...]}}')
    for i, exp in enumerate(exps):
        if not isinstance(exp, dict) or not isinstance(exp.get("type"), str) or not isinstance(exp.get("kwargs", {}), dict):
            raise ConfigError(f"validation.suite: {path}: expectations[{i}] needs a string 'type' and a 'kwargs' mapping")
    return exps


# Expectations that judge each row on its own: exact when run chunk by chunk and the counts summed.
_ROW_WISE_EXCLUDED = {
    "expect_column_values_to_be_unique",
    "expect_column_values_to_be_increasing",
    "expect_column_values_to_be_decreasing",
}


_ROW_WISE_OTHER = {
    "expect_column_pair_values_to_be_equal",
    "expect_column_pair_values_a_to_be_greater_than_b",
    "expect_column_pair_values_to_be_in_set",
    "expect_multicolumn_sum_to_equal",
    "expect_select_column_values_to_be_unique_within_record",
}


def is_row_wise(expectation_type: str) -> bool:
    return expectation_type in _ROW_WISE_OTHER or (
        expectation_type.startswith("expect_column_values_to_") and expectation_type not in _ROW_WISE_EXCLUDED
    )


def _columns_of(expectations: list[dict[str, Any]]) -> list[str]:
    columns: list[str] = []
    for e in expectations:
        kwargs = e.get("kwargs", {})
        for c in [*(kwargs.get(k) for k in _COLUMN_KWARGS), *(kwargs.get("column_list") or [])]:
            if isinstance(c, str) and c not in columns:
                columns.append(c)
    return columns


def row_images(spec: PipelineSpec) -> tuple[str, dict[str, str]] | None:
    """Change tables: the gate judges the new row images (insert and update records), never the delete
    records, whose images may carry the key alone. (op column, op values), or None for append tables."""
    op = spec.op_column() if spec.applies_changes else None
    return (op, dict(spec.table.op_values)) if op else None


def chunks(
    table: Table, files: TableFiles, columns: list[str], chunk_rows: int, images: tuple[str, dict[str, str]] | None = None
) -> Iterator[Any]:
    """The named columns of the staged files, as Arrow tables of at most ``chunk_rows`` rows (with
    ``images``: the delete records left out, see ``row_images``)."""
    read = columns + [images[0]] if images and images[0] not in columns else columns
    pending: list[Any] = []
    size = 0
    for f in files.data_files:
        with table.io.new_input(f.file_path).open() as fh:
            pf = pq.ParquetFile(fh)
            present = [c for c in read if c in pf.schema_arrow.names]
            for rb in pf.iter_batches(batch_size=chunk_rows, columns=present):
                t = pa.Table.from_batches([rb]) if present else pa.table({"__row": pa.nulls(rb.num_rows, pa.int8())})
                if images:
                    t = t.filter(pc.invert(deletes_mask(t, images[0] if images[0] in t.column_names else None, images[1])))
                    t = t.select([c for c in t.column_names if c in columns or c == "__row"])
                pending.append(t)
                size += t.num_rows
                if size >= chunk_rows:
                    full = pa.concat_tables(pending, promote_options="permissive")
                    cut = size - size % chunk_rows
                    for at in range(0, cut, chunk_rows):
                        yield full.slice(at, chunk_rows)
                    pending = [full.slice(cut)] if cut < size else []
                    size -= cut
    if pending:
        yield pa.concat_tables(pending, promote_options="permissive")


def _whole(table: Any, files: TableFiles, columns: list[str], images: tuple[str, dict[str, str]] | None = None) -> Any:
    pieces = list(chunks(table, files, columns, 1 << 30, images))
    if not pieces:
        return pa.table({c: pa.array([], pa.null()) for c in columns} or {"__row": pa.array([], pa.int8())})
    return pa.concat_tables(pieces, promote_options="permissive")


def builtin_checks(spec: PipelineSpec, table: Table | None, files: TableFiles) -> list[CheckResult]:
    """Row count and not-null, from the row and null counts the writer put in the manifest: no data is read.

    A not-null column without a null count in some file (a struct or list column, or metrics switched
    off) is counted by reading that column in chunks.
    """
    rows = files.rows_in_files
    checks = [
        CheckResult(
            "expect_table_row_count_to_equal",
            {"value": files.rows_expected},
            rows == files.rows_expected,
            {"observed_value": rows},
        ),
        CheckResult(
            "accounting: records read = rows + dead letters + skipped",
            {
                "read": files.records,
                "dead_letters": files.dead_letters,
                "skipped": files.skipped,
                **({"already_present": files.present} if files.present else {}),
            },
            files.records == rows + files.dead_letters_in_files + files.skipped + files.present,
            {
                "observed_value": f"{rows} rows + {files.dead_letters_in_files} dead letters + {files.skipped} skipped"
                + (f" + {files.present} already present" if files.present else "")
            },
        ),
    ]
    for column in spec.validation.not_null:
        if not files.data_files or table is None:  # no rows (every record dead-lettered or skipped): nothing can be null
            checks.append(CheckResult("expect_column_values_to_not_be_null", {"column": column}, True, {}))
            continue
        try:
            field = table.schema().find_field(column)
        except ValueError:
            checks.append(
                CheckResult(
                    "expect_column_values_to_not_be_null",
                    {"column": column},
                    False,
                    {"error": f"column {column!r} is not in table {files.table}"},
                )
            )
            continue
        nulls = 0
        images = row_images(spec)
        if images:  # change tables: the new row images only (a delete record may carry its key alone)
            nulls = sum(
                t.column(column).null_count if column in t.column_names else t.num_rows
                for t in chunks(table, files, [column], spec.validation.chunk_rows, images)
            )
        for f in files.data_files if not images else ():
            counted = f.metrics["null_value_counts"].get(str(field.field_id))
            if counted is None or not field.field_type.is_primitive:
                nulls += _count_nulls(table, f, column, spec.validation.chunk_rows)
            else:
                nulls += int(counted)
        observed = {"element_count": files.rows_in_files, "unexpected_count": nulls} if nulls else {}
        checks.append(CheckResult("expect_column_values_to_not_be_null", {"column": column}, nulls == 0, observed))
    # a change table's batch holds several changes per key by design; the commit keeps keys unique in the table
    if spec.validation.unique_ids != "none" and spec.table.id_columns and table is not None and not spec.applies_changes:
        checks += unique_id_checks(table, files, spec.table.id_columns, spec.validation.unique_ids == "table")
    return checks


IN_CHUNK = 10_000  # ids per table lookup


def unique_id_checks(table: Table, files: TableFiles, id_columns: list[str], against_table: bool) -> list[CheckResult]:
    """No two rows of the batch share an id; with ``against_table``, no id of the batch is in the table yet."""
    ids = _whole(table, files, id_columns)
    if any(c not in ids.column_names for c in id_columns):
        return [
            CheckResult(
                "expect_compound_columns_to_be_unique",
                {"column_list": id_columns},
                False,
                {"error": f"id columns {id_columns} are not all in the staged files"},
            )
        ]
    one_column = len(id_columns) == 1
    kind = "expect_column_values_to_be_unique" if one_column else "expect_compound_columns_to_be_unique"
    args: dict[str, Any] = {"column": id_columns[0]} if one_column else {"column_list": list(id_columns)}
    groups = ids.group_by(id_columns).aggregate([([], "count_all")])
    dup_rows = int(pc.sum(pc.subtract(groups.column("count_all"), 1)).as_py() or 0) if groups.num_rows else 0
    sample = groups.filter(pc.greater(groups.column("count_all"), 1)).select(id_columns).slice(0, 20).to_pylist()
    observed: dict[str, Any] = {"element_count": ids.num_rows}
    if dup_rows:
        observed.update(unexpected_count=dup_rows, partial_unexpected_list=sample)
    checks = [CheckResult(kind, args, dup_rows == 0, observed)]
    if against_table:
        existing = 0
        found: list[Any] = []
        if table.current_snapshot() is not None:
            first = pc.unique(ids.column(id_columns[0]).combine_chunks()).drop_null()
            for i in range(0, len(first), IN_CHUNK):
                values = first.slice(i, IN_CHUNK).to_pylist()
                held = table.scan(row_filter=one_of(id_columns[0], values), selected_fields=tuple(id_columns)).to_arrow()
                if held.num_rows:
                    keys = held.group_by(id_columns).aggregate([])
                    hits = groups.select(id_columns).join(keys.cast(groups.select(id_columns).schema), keys=id_columns, join_type="inner")
                    existing += hits.num_rows
                    found += hits.slice(0, 20 - len(found)).to_pylist() if len(found) < 20 else []
        observed = {"element_count": groups.num_rows}
        if existing:
            observed.update(unexpected_count=existing, partial_unexpected_list=found)
        checks.append(CheckResult(kind, {**args, "scope": "table"}, existing == 0, observed))
    return checks


def _count_nulls(table: Table, data_file: StagedFile, column: str, chunk_rows: int) -> int:
    with table.io.new_input(data_file.file_path).open() as fh:
        pf = pq.ParquetFile(fh)
        if column not in pf.schema_arrow.names:
            return pf.metadata.num_rows
        return sum(rb.column(0).null_count for rb in pf.iter_batches(batch_size=chunk_rows, columns=[column]))


def import_great_expectations() -> Any:
    """great_expectations, imported quietly: its import logs about 210 INFO lines (one per documented
    function) that would bury the task's own log, so its loggers are at WARNING first."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    import great_expectations

    return great_expectations


class _Runner:
    """One ephemeral great-expectations context and suite, run on any number of dataframes."""

    def __init__(self, name: str, expectations: list[dict[str, Any]]) -> None:
        gx = import_great_expectations()
        from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

        ctx = gx.get_context(mode="ephemeral")
        try:
            from great_expectations.data_context.types.base import ProgressBarsConfig

            ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
        except Exception:  # noqa: BLE001 - progress bars are cosmetic: a failure to switch them off is ignored
            pass
        asset = ctx.data_sources.add_pandas("tidewater").add_dataframe_asset(name="staged_batch")
        definition = asset.add_batch_definition_whole_dataframe("batch")
        suite = gx.ExpectationSuite(name=name)
        for e in expectations:
            suite.add_expectation_configuration(ExpectationConfiguration(type=e["type"], kwargs=e.get("kwargs", {})))
        suite = ctx.suites.add(suite)
        self._vd = ctx.validation_definitions.add(gx.ValidationDefinition(name=name, data=definition, suite=suite))
        self._expectations = expectations

    def run(self, df: Any) -> list[CheckResult]:
        try:
            result = self._vd.run(batch_parameters={"dataframe": df}, result_format="SUMMARY")
        except Exception as e:
            raise ConfigError(f"validation.suite: great-expectations could not run the suite: {e}") from e
        checks = []
        for r in result.results:
            res = r.result or {}
            observed = {
                k: res[k]
                for k in ("observed_value", "element_count", "unexpected_count", "partial_unexpected_list")
                if k in res and res[k] not in (None, [])
            }
            if r.exception_info and r.exception_info.get("raised_exception"):
                observed["error"] = r.exception_info.get("exception_message")
            kwargs = {k: v for k, v in dict(r.expectation_config.kwargs).items() if k != "batch_id"}
            checks.append(CheckResult(r.expectation_config.type, kwargs, bool(r.success), observed))
        return [_pop_match(checks, e) for e in self._expectations]


def _pop_match(checks: list[CheckResult], e: dict[str, Any]) -> CheckResult:
    """The result of expectation ``e`` (great-expectations adds default kwargs, so match on a subset)."""
    for i, c in enumerate(checks):
        if c.expectation == e["type"] and all(c.kwargs.get(k) == v for k, v in e.get("kwargs", {}).items()):
            return checks.pop(i)
    raise ConfigError(f"validation.suite: great-expectations returned no result for {e['type']} {e.get('kwargs')}")


def _merge(per_chunk: list[list[CheckResult]]) -> list[CheckResult]:
    """Sum the counts of row-wise checks run chunk by chunk; a check passes when it passed on every chunk."""
    merged = []
    for runs in zip(*per_chunk):
        first = runs[0]
        observed: dict[str, Any] = {}
        for k in ("element_count", "unexpected_count"):
            if any(k in r.observed for r in runs):
                observed[k] = sum(int(r.observed.get(k, 0)) for r in runs)
        samples = [v for r in runs for v in r.observed.get("partial_unexpected_list", [])][:20]
        if samples:
            observed["partial_unexpected_list"] = samples
        errors = [r.observed["error"] for r in runs if "error" in r.observed]
        if errors:
            observed["error"] = errors[0]
        merged.append(CheckResult(first.expectation, first.kwargs, all(r.success for r in runs), observed))
    return merged


def validate_table(spec: PipelineSpec, table: Any, files: TableFiles, batch_id: str) -> ValidationReport:
    """Run the gate on one table's staged files. Returns the report; does not raise on failure.

    Memory stays bounded by ``validation.chunk_rows``: built-in checks use the manifest's counts,
    row-wise expectations run chunk by chunk on the columns they name, and only whole-column
    expectations (uniqueness, means, ...) read their columns for the whole batch.
    """
    suite_path = spec.suite_path()
    suite_name = f"{spec.name}.{suite_path.name}" if suite_path else f"{spec.name}.builtin"
    checks = builtin_checks(spec, table, files)
    user = load_suite_file(spec)
    row_wise = [e for e in user if is_row_wise(e["type"])]
    whole = [e for e in user if not is_row_wise(e["type"])]
    results: dict[int, CheckResult] = {}
    if row_wise:
        runner = _Runner(f"{suite_name}.row-wise", row_wise)
        images = row_images(spec)
        per_chunk = [runner.run(t.to_pandas()) for t in chunks(table, files, _columns_of(row_wise), spec.validation.chunk_rows, images)]
        if per_chunk:
            for e, c in zip(row_wise, _merge(per_chunk)):
                results[id(e)] = c
        else:  # no rows: judge an empty frame so the report still lists every expectation
            for e, c in zip(row_wise, runner.run(_whole(table, files, _columns_of(row_wise), images).to_pandas())):
                results[id(e)] = c
    if whole:
        runner = _Runner(f"{suite_name}.whole", whole)
        for e, c in zip(whole, runner.run(_whole(table, files, _columns_of(whole), row_images(spec)).to_pandas())):
            results[id(e)] = c
    checks += [results[id(e)] for e in user]
    report = ValidationReport(batch_id, suite_name, all(c.success for c in checks), files.rows_in_files, tuple(checks))
    log.info("%s", report.text())
    return report


ROUTED_ACCOUNTING = "accounting: records read = records routed + dead letters + skipped"


ACCOUNTING_CHECKS = ("expect_table_row_count_to_equal", "accounting: records read = rows + dead letters + skipped", ROUTED_ACCOUNTING)


def routed_accounting(manifest: BatchManifest) -> CheckResult:
    """A routed batch's accounting, over all its tables: every record read went to some table, was a dead letter
    or was skipped (a record may go to several tables, so the tables' rows are not added up)."""
    routed = manifest.routed
    return CheckResult(
        ROUTED_ACCOUNTING,
        {"read": manifest.records, "dead_letters": manifest.dead_letters, "skipped": manifest.skipped},
        routed is not None and manifest.records == routed + manifest.dead_letters_in_files + manifest.skipped,
        {"observed_value": f"{routed} routed + {manifest.dead_letters_in_files} dead letters + {manifest.skipped} skipped"},
    )


def _table_view(spec: PipelineSpec, ident: str, table: Table) -> PipelineSpec:
    """A routed pipeline's settings for one target table's checks: the pipeline's not-null columns where the
    table has them, plus the table's id columns."""
    view = spec.for_table(ident, table)
    names = {f.name for f in table.schema().fields}
    not_null = [c for c in spec.validation.not_null if c in names]
    not_null += [c for c in view.table.id_columns if c not in spec.validation.not_null]
    return dataclasses.replace(view, validation=dataclasses.replace(spec.validation, not_null=not_null))


def require_valid(report: ValidationReport, on_failure: str = "fail") -> None:
    """Raise ValidationFailedError when the gate fails. With ``warn`` and ``quarantine``, only the
    accounting checks raise (they guard exactly-once); with ``warn`` other failures are logged and the
    batch is committed, with ``quarantine`` the commit step puts the batch on a quarantine branch."""
    if on_failure in ("warn", "quarantine") and not any(not c.success and c.expectation in ACCOUNTING_CHECKS for c in report.checks):
        if not report.success:
            log.warning(
                "validation.on_failure is %s: %s\n%s",
                on_failure,
                "committing despite" if on_failure == "warn" else "the batch goes to a quarantine branch",
                report.text(),
            )
        return
    if not report.success:
        raise ValidationFailedError(report.text() + "\nNothing was committed; the offsets did not move.", batch_id=report.batch_id)


def judge(spec: PipelineSpec, catalog: Catalog, manifest: BatchManifest) -> ValidationReport:
    """The gate's verdict on a staged batch: each target table's checks on its files (``validate_table``).

    A plain pipeline is one table that takes every record, so the batch's accounting is among its checks and its
    report is the batch's (when every record was a dead letter or skipped before the table exists, the accounting
    alone). A routed batch's accounting is checked once over its tables (``routed_accounting``), and each table
    that got files is judged on its own, its checks named with the table."""
    if spec.targets.fused:
        return _judge_one(spec, catalog, manifest)
    checks = [routed_accounting(manifest)]
    reports = []
    for files in (TableFiles.of_output(out) for out in manifest.outputs if out.data_files):
        table = load_table(catalog, files.table)
        if table is None:
            checks.append(
                CheckResult("table exists", {"table": files.table}, False, {"error": "staged files exist but the table does not"})
            )
            continue
        report = validate_table(_table_view(spec, files.table, table), table, files, manifest.batch_id)
        reports.append((files.table, report))
        checks += [dataclasses.replace(c, kwargs={"table": files.table, **c.kwargs}) for c in report.checks]
    suite = spec.suite_path()
    return ValidationReport(
        manifest.batch_id,
        f"{spec.name}.{suite.name if suite else 'builtin'}",
        all(c.success for c in checks),
        sum(o.rows for o in manifest.outputs),
        tuple(checks),
        tuple(reports),
    )


def _judge_one(spec: PipelineSpec, catalog: Catalog, manifest: BatchManifest) -> ValidationReport:
    files = TableFiles.of_batch(manifest)
    table = load_table(catalog, files.table)
    if table is not None:
        return validate_table(spec, table, files, manifest.batch_id)
    if files.data_files:
        raise TerminalError("staged files exist but the table does not", table=files.table)
    if files.records:  # every record dead-lettered or skipped: only the accounting to check
        checks = tuple(builtin_checks(spec, None, files))
        return ValidationReport(manifest.batch_id, "builtin", all(c.success for c in checks), 0, checks)
    return ValidationReport(manifest.batch_id, "builtin", True, 0, (CheckResult("no records", {}, True),))
