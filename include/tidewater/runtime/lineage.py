"""OpenLineage for the ingest, replay, maintenance and audit tasks, through Airflow's OpenLineage provider.

The provider's listener emits a START and a COMPLETE or FAIL event for every task instance, and asks the
task's operator for lineage through ``get_openlineage_facets_on_complete`` / ``_on_failure`` (its
``DefaultExtractor``). Tidewater's tasks are TaskFlow functions, whose operator has no such methods; each
task attaches what it learned to its own operator instance (``attach``) and the listener, in the same
process, reads it when the task ends. So the provider keeps its transports, namespaces, parent run facets and
``[openlineage]`` settings, and Tidewater only adds what it knows:

- inputs: each Kafka topic, named as OpenLineage names Kafka (namespace ``kafka://<first bootstrap
  host:port>``, name the topic), with the batch's offset ranges (``tidewater_offsetRanges``);
- outputs: each Iceberg table, named by its location as OpenLineage's Spark integration names Iceberg
  tables (``file`` + path, ``s3://bucket`` + key), with a ``symlinks`` identifier ``iceberg://<catalog>`` +
  ``<namespace>.<table>`` (the Airflow asset's name), the ``catalog`` facet, its ``schema``, the snapshot as
  ``version``, ``outputStatistics`` (rows, bytes, files) and the quality gate's checks as
  ``dataQualityAssertions``;
- run facets: ``tidewater_batch`` (batch id, mode, records read, rows, dead letters, skipped, the gate's
  verdict, snapshot), ``tidewater_maintenance`` or ``tidewater_audit``.

Lineage never decides a task's outcome: when the provider is absent or disabled nothing is built, and a
failure to build it is logged as a warning. No setting's value goes into a facet (catalog properties and
Kafka settings hold credentials): only names, locations without user info, and counts.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import attr

from tidewater.batch import GATE_REPORT_NAME, VALIDATION_NAME, read_json
from tidewater.config.spec import PipelineSpec
from tidewater.source.kafka import kafka_settings
from tidewater.steps.lifecycle import batch_path
from tidewater.table.catalog import load_catalog, load_table

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

SCHEMA_BASE = "urn:tidewater:openlineage:facet:"  # the custom facets' schema ids (README: Lineage)


def enabled() -> bool:
    """Whether the OpenLineage provider is installed and configured to emit (a transport is set)."""
    try:
        from airflow.providers.openlineage.conf import is_disabled
    except ImportError:
        return False
    return not is_disabled()


def attach(complete: Any = None, failure: Any = None) -> None:
    """Give this task's operator the lineage the provider's listener asks for when the task ends."""
    from airflow.sdk import get_current_context

    task = get_current_context()["task"]
    # the provider picks its DefaultExtractor by the _on_start or _on_complete method alone, also for a FAIL event
    # (typed as a mapped or unmapped operator: the running task's is always the unmapped one, an instance)
    task.get_openlineage_facets_on_complete = lambda task_instance: complete  # type: ignore[union-attr]
    if failure is not None:
        task.get_openlineage_facets_on_failure = lambda task_instance: failure  # type: ignore[union-attr]


def guarded(build: Any) -> Any:
    """Run ``build`` (which attaches lineage) only when lineage is on; its failure is a warning, never the task's."""
    if not enabled():
        return None
    try:
        return build()
    except Exception as e:  # noqa: BLE001 - lineage must never fail a batch
        log.warning("OpenLineage: lineage of this task was not built (%s: %s)", type(e).__name__, e)
        return None


def _facets() -> Any:
    """The facet classes, defined on first use (the openlineage client is imported only in a task)."""
    global _FACETS
    if _FACETS is None:
        from openlineage.client.facet_v2 import InputDatasetFacet, RunFacet

        def schema(name: str) -> Any:
            return staticmethod(lambda: SCHEMA_BASE + name)

        @attr.define
        class OffsetRanges(InputDatasetFacet):
            """The offset ranges of a topic that the run read: [{partition, start, end}], end exclusive."""

            ranges: list[dict[str, int]] = attr.field(factory=list)
            _get_schema = schema("OffsetRanges")

        @attr.define
        class Batch(RunFacet):
            """One Tidewater batch: what was read and where it went (read = rows + dead letters + skipped)."""

            batchId: str
            mode: str
            pipeline: str
            recordsRead: int
            rows: int
            deadLetters: int
            skipped: int
            gate: str  # passed, failed, warned, quarantined
            status: str | None = None
            snapshotId: str | None = None
            _get_schema = schema("Batch")

        @attr.define
        class Maintenance(RunFacet):
            action: str
            table: str
            report: dict[str, Any] = attr.field(factory=dict)
            _get_schema = schema("Maintenance")

        @attr.define
        class Audit(RunFacet):
            table: str
            clean: bool
            deep: bool
            batches: int
            errors: int
            findings: list[str] = attr.field(factory=list)
            _get_schema = schema("Audit")

        _FACETS = {"OffsetRanges": OffsetRanges, "Batch": Batch, "Maintenance": Maintenance, "Audit": Audit}
    return _FACETS


_FACETS: dict[str, Any] | None = None


# ---- datasets -------------------------------------------------------------------------------------------


def kafka_namespace(spec: PipelineSpec) -> str:
    """``kafka://host:port`` of the first bootstrap server (OpenLineage's naming of Kafka)."""
    first = kafka_settings(spec)["bootstrap.servers"].split(",")[0].strip()
    return "kafka://" + first.split("://", 1)[-1]  # a SASL_SSL://host:port listener name is not part of it


def topic_inputs(spec: PipelineSpec, ranges: Any) -> list[Any]:
    """One input per topic, with the offset ranges read from it."""
    from openlineage.client.event_v2 import InputDataset

    by_topic: dict[str, list[dict[str, int]]] = {}
    for r in ranges:
        by_topic.setdefault(r.topic, []).append({"partition": r.partition, "start": r.start, "end": r.end})
    namespace = kafka_namespace(spec)
    facet = _facets()["OffsetRanges"]
    return [
        InputDataset(
            namespace=namespace, name=topic, inputFacets={"tidewater_offsetRanges": facet(ranges=sorted(rs, key=lambda d: d["partition"]))}
        )
        for topic, rs in sorted(by_topic.items())
    ]


def _location_name(location: str) -> tuple[str, str]:
    """(namespace, name) of a table location: ``file`` + path, or ``scheme://bucket`` + key; no user info."""
    parts = urlsplit(_strip_user_info(location))
    if parts.scheme in ("", "file"):
        return "file", parts.path or location
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")


def _schema_fields(schema: Any) -> list[Any]:
    from openlineage.client.facet_v2 import schema_dataset

    def field(f: Any) -> Any:
        nested = [field(n) for n in f.field_type.fields] if hasattr(f.field_type, "fields") else []
        return schema_dataset.SchemaDatasetFacetFields(name=f.name, type=str(f.field_type), description=f.doc, fields=nested)

    return [field(f) for f in schema.fields]


def table_dataset(
    spec: PipelineSpec,
    table: Table,
    ident: str,
    output: bool = True,
    stats: dict[str, int] | None = None,
    assertions: list[Any] | None = None,
) -> Any:
    """An Iceberg table as an input or output dataset, with its schema, catalog, current snapshot and (outputs)
    the statistics of what this run added."""
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import (
        catalog_dataset,
        data_quality_assertions_dataset,
        dataset_version_dataset,
        output_statistics_output_dataset,
        schema_dataset,
        symlinks_dataset,
    )

    namespace, name = _location_name(table.location())
    warehouse = spec.catalog.properties.get("warehouse")
    facets: dict[str, Any] = {
        "schema": schema_dataset.SchemaDatasetFacet(fields=_schema_fields(table.schema())),
        "symlinks": symlinks_dataset.SymlinksDatasetFacet(
            identifiers=[symlinks_dataset.Identifier(namespace=f"iceberg://{spec.catalog.name}", name=ident, type="TABLE")]
        ),
        "catalog": catalog_dataset.CatalogDatasetFacet(
            framework="iceberg",
            type=spec.catalog.properties.get("type", "sql"),
            name=spec.catalog.name,
            warehouseUri=_strip_user_info(warehouse) if warehouse else None,
            source="tidewater",
        ),
    }
    snapshot = table.current_snapshot()
    if snapshot is not None:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=str(snapshot.snapshot_id))
    if assertions is not None:
        facets["dataQualityAssertions"] = data_quality_assertions_dataset.DataQualityAssertionsDatasetFacet(assertions=assertions)
    if not output:
        return InputDataset(namespace=namespace, name=name, facets=facets)
    out_facets: dict[str, Any] = {}
    if stats is not None:
        out_facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
            rowCount=stats["rows"], size=stats["bytes"], fileCount=stats["files"]
        )
    return OutputDataset(namespace=namespace, name=name, facets=facets, outputFacets=out_facets)


def _strip_user_info(uri: str) -> str:
    """``uri`` without ``user:password@`` (credentials in a location or warehouse URI)."""
    parts = urlsplit(uri)
    if not parts.username and not parts.password:
        return uri
    netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def gate_assertions(report: dict[str, Any] | None) -> list[Any] | None:
    """The quality gate's checks (a ValidationReport's JSON) as OpenLineage assertions."""
    if report is None:
        return None
    from openlineage.client.facet_v2 import data_quality_assertions_dataset as dq

    out = []
    for c in report.get("checks", []):
        kwargs = c.get("kwargs") or {}
        column = kwargs.get("column")
        out.append(
            dq.Assertion(
                assertion=c["expectation"],
                success=bool(c["success"]),
                column=str(column) if column is not None else None,
                params={k: str(v) for k, v in kwargs.items() if k != "column"},
                actual=_observed(c.get("observed")),
            )
        )
    return out


def _observed(observed: Any) -> str | None:
    if not observed:
        return None
    return json.dumps(observed, default=str, sort_keys=True)[:500]


# ---- what each task attaches --------------------------------------------------------------------------------


def batch_lineage(spec: PipelineSpec, plan: Any, manifest: Any, result: Any = None, gate: str | None = None) -> Any:
    """A batch (ingest, replay, change batch): the topics' ranges in; each table it wrote (and the dead-letter
    table) out, with what this batch added; the gate's checks; the batch's counts as a run facet."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    staged = batch_path(spec, plan)
    report = read_json(staged / GATE_REPORT_NAME) if (staged / GATE_REPORT_NAME).is_file() else None
    if gate is None:
        verdict = read_json(staged / VALIDATION_NAME) if (staged / VALIDATION_NAME).is_file() else {}
        gate = "passed" if verdict.get("success", True) else "quarantined" if verdict.get("quarantine") else "warned"
    reports = dict(report.get("tables", [])) if report else {}  # routed: each table's own report
    catalog = load_catalog(spec)
    outputs = []
    for ident, files, rows in _written(plan, manifest):
        table = load_table(catalog, ident)
        if table is None:  # a first batch the gate refused: its table was never created
            continue
        stats = {"rows": rows, "bytes": sum(f.file_size_in_bytes for f in files), "files": len(files)}
        checks = reports.get(ident, report) if ident != manifest.dead_letter_table else None
        outputs.append(table_dataset(spec, table, ident, stats=stats, assertions=gate_assertions(checks)))
    snapshot = getattr(result, "snapshot_id", None)
    run = _facets()["Batch"](
        batchId=plan.batch_id,
        mode=plan.mode,
        pipeline=spec.name,
        recordsRead=manifest.records,
        rows=manifest.rows_in_files,
        deadLetters=manifest.dead_letters,
        skipped=manifest.skipped,
        gate=gate,
        status=getattr(result, "status", None),
        snapshotId=str(snapshot) if snapshot is not None else None,
    )
    return OperatorLineage(inputs=topic_inputs(spec, manifest.partitions), outputs=outputs, run_facets={"tidewater_batch": run})


def _written(plan: Any, manifest: Any) -> list[tuple[str, Any, int]]:
    """(table, staged files, rows) per table the batch wrote, the dead-letter table included."""
    out = [(o.table, o.data_files, o.rows) for o in manifest.outputs if o.data_files or o.table == plan.table]
    if not manifest.outputs:  # a manifest staged by the previous version: a plain batch's files at the top
        out = [(plan.table, manifest.data_files, manifest.rows_in_files)]
    if manifest.dead_letter_table and manifest.dead_letter_files:
        out.append((manifest.dead_letter_table, manifest.dead_letter_files, manifest.dead_letters_in_files))
    return out


def maintenance_lineage(spec: PipelineSpec, reports: list[Any]) -> Any:
    """A maintenance action: each table it worked on is its input and its output (a new snapshot, same rows)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    catalog = load_catalog(spec)
    tables = [(r, t) for r in reports if (t := load_table(catalog, r.table)) is not None]
    facet = _facets()["Maintenance"]
    return OperatorLineage(
        inputs=[table_dataset(spec, t, r.table, output=False) for r, t in tables],
        outputs=[table_dataset(spec, t, r.table) for r, t in tables],
        run_facets={
            "tidewater_maintenance": facet(
                action=reports[0].action if reports else "",
                table=", ".join(r.table for r, _ in tables),
                report=json.loads(json.dumps([r.metadata() for r in reports], default=str)),
            )
        },
    )


AUDIT_CHECKS = ("coverage", "accounting", "outside-write", "kafka", "routed", "deep")  # routed, deep: when they run


def audit_lineage(spec: PipelineSpec, report: Any, deep: bool) -> Any:
    """An audit: the table (a routed pipeline's: each target table audited) in, one assertion per kind of check
    (per table: failed by the findings about it and those about the whole pipeline), the verdict and every
    discrepancy as a run facet."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.facet_v2 import data_quality_assertions_dataset as dq

    errors = [f for f in report.findings if f.severity == "error"]
    # "routed": the report's target tables against their checkpoint (a plain pipeline's report lists none)
    kinds = [k for k in AUDIT_CHECKS if (k != "deep" or deep) and (k != "routed" or report.tables)]
    kinds += sorted({f.check for f in errors} - set(kinds))
    catalog = load_catalog(spec)
    inputs = []
    for ident in report.tables or [report.table]:  # routed: each target table, with the findings that concern it
        mine = [f for f in errors if f.table in (None, ident)]
        assertions = [
            dq.Assertion(
                assertion=f"tidewater_audit_{k}",
                success=not any(f.check == k for f in mine),
                description=next((f.text() for f in mine if f.check == k), None),
            )
            for k in kinds
        ]
        table = load_table(catalog, ident)
        if table is not None:
            inputs.append(table_dataset(spec, table, ident, output=False, assertions=assertions))
    run = _facets()["Audit"](
        table=report.table,
        clean=report.clean,
        deep=deep,
        batches=report.batches,
        errors=len(errors),
        findings=[f.text() for f in errors][:100],
    )
    return OperatorLineage(inputs=inputs, outputs=[], run_facets={"tidewater_audit": run})
