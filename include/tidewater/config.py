"""Pipeline specifications: one YAML file per pipeline.

A specification is parsed into frozen dataclasses. Every field has a default (or is marked required)
and a ``doc`` string; ``docs/configuration.md`` is generated from these (``tidewater docs``) and a test
checks that the page matches the code.

Strings may reference the environment as ``${NAME}`` or ``${NAME:-default}``; a reference to an unset
variable without a default is an error naming the key. Secrets (keys that look like passwords, tokens,
JAAS configs or private keys) are never logged: use :func:`redact` on anything that leaves the process.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tidewater.errors import ConfigError

PIPELINES_DIR_ENV = "TIDEWATER_PIPELINES_DIR"
HOME_ENV = "TIDEWATER_HOME"
KAFKA_CONFIG_ENV = "TIDEWATER_KAFKA_CONFIG"

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_IDENTIFIER_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_SECRET_KEY = re.compile(r"(password|secret|jaas|token|credential|private|ssl\.key\.pem|api[._-]?key)", re.I)
REDACTED = "***"


def home_dir() -> Path:
    """The data directory for embedded defaults (catalog, warehouse, staging, repaired jars)."""
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".tidewater").resolve()


def pipelines_dir() -> Path:
    """Where pipeline specifications live: ``$TIDEWATER_PIPELINES_DIR`` or ``include/pipelines``."""
    env = os.environ.get(PIPELINES_DIR_ENV)
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parent.parent / "pipelines"


def _doc(text: str, **kw: Any) -> Any:
    return field(metadata={"doc": text}, **kw)


@dataclass(frozen=True)
class KafkaSpec:
    """How to reach Kafka. Either ``conn_id`` or ``bootstrap_servers``."""

    bootstrap_servers: str | None = _doc(
        "Comma-separated host:port list (librdkafka `bootstrap.servers`). Required unless `conn_id` is set.",
        default=None,
    )
    conn_id: str | None = _doc(
        "Airflow connection id holding the brokers (host[:port], comma-separated hosts allowed) and, in its "
        "extra JSON, librdkafka settings; its password becomes `sasl.password`.",
        default=None,
    )
    settings: dict[str, str] = _doc(
        "Any librdkafka consumer setting passed through as-is (SASL/SSL included), e.g. "
        "`security.protocol: SASL_SSL`, `sasl.password: ${KAFKA_PASSWORD}`. Secrets are redacted in logs.",
        default_factory=dict,
    )
    read_timeout_seconds: float = _doc(
        "Fail a partition read (transient error naming the partition and position) when no progress is made "
        "for this long.",
        default=60.0,
    )


@dataclass(frozen=True)
class FormatSpec:
    """How record values are decoded."""

    value: str = _doc(
        "Value format: `json` (one JSON object per record, no schema; fields become columns), `connect_json` "
        "(Kafka Connect JsonConverter with schemas: the payload's fields, typed by the declared schema; Timestamp and "
        "Date logical types converted), `debezium` (change events, plain or Connect-enveloped: the `after` image, "
        "or `before` for deletes, plus an `_op` column c/u/d/r; tombstones are counted as skipped), `avro` (Confluent "
        "wire format, writer schema by id from `registry_url`; unknown ids are dead letters), `string` (the "
        "value as one UTF-8 column `value`; invalid UTF-8 is a dead letter) or `bytes` (one binary column `value`).",
        default="json",
    )
    registry_url: str | None = _doc("Schema registry URL for `value: avro` (Confluent REST API).", default=None)
    registry_basic_auth: str | None = _doc(
        "`user:password` for the schema registry (use `${ENV_VAR}`; never logged).", default=None
    )
    timestamps: dict[str, str] = _doc(
        "Columns parsed into UTC timestamps (a field inside an object as `a.b`), column -> format: a strftime pattern "
        "(`%Y-%m-%d %H:%M:%S`), `iso8601` (with or without a zone: `2024-02-29T12:23:03`, `...+01:00`, `...Z`), "
        "`epoch_millis` or `epoch_seconds`. A value that does not parse makes its record a dead letter.",
        default_factory=dict,
    )
    timezone: str = _doc("Time zone of date-times without a zone (IANA name, e.g. `Europe/Oslo`).", default="UTC")
    key: str = _doc(
        "Message key as a column `_kafka_key`: `none` (default), `string` (UTF-8; invalid bytes replaced) or `bytes`.",
        default="none",
    )
    headers: bool = _doc("Message headers as a column `_kafka_headers` (map of string to bytes).", default=False)
    metadata: str = _doc(
        "Kafka metadata columns: `none` (default), `prefixed` (`_kafka_topic`, `_kafka_partition`, `_kafka_offset`, "
        "`_kafka_timestamp`) or `struct` (one column `_kafka` with fields topic, partition, offset, timestamp).",
        default="none",
    )
    flatten: bool = _doc(
        "Flatten nested objects into top-level columns (`a.b.c` -> `a_b_c`). Off: objects stay struct columns. "
        "`format.timestamps` and `table.partition_by` then name the flattened columns.",
        default=False,
    )
    flatten_separator: str = _doc("Joins the names of flattened fields (letters, digits, `_`).", default="_")
    flatten_max_depth: int = _doc(
        "Object levels flattened; objects nested deeper stay struct columns (1: only top-level objects).", default=8
    )
    map_columns: list[str] = _doc(
        "Top-level fields whose objects have open-ended keys (attributes, labels, ...), stored as one "
        "`map<string, V>` column instead of a struct with a column per key. V is the values' common type "
        "(long, double or string; mixed scalars become strings). Not flattened.",
        default_factory=list,
    )


@dataclass(frozen=True)
class DeadLetterSpec:
    """What happens to records that cannot be decoded (invalid JSON, wrong types, tombstones, ...)."""

    policy: str = _doc(
        "`dead_letter`: written to the dead-letter table in the same batch (records read = rows + dead "
        "letters); `fail`: the batch fails naming the first bad record (topic, partition, offset); `skip`: "
        "dropped and counted in the snapshot summary (`tidewater.skipped`).",
        default="dead_letter",
    )
    table: str | None = _doc(
        "Dead-letter table identifier. Default: the target table's name with `_dead_letters` appended, in "
        "the same namespace. Columns: topic, partition, offset, timestamp, key, value, headers, "
        "error_class, error_message, batch_id, pipeline.",
        default=None,
    )
    topic: str | None = _doc(
        "Also send dead letters to this Kafka topic (same cluster and settings), raw key, value and headers "
        "kept, with headers `tidewater.topic`, `.partition`, `.offset`, `.timestamp`, `.error.class`, "
        "`.error.message`, `.batch-id`, `.pipeline`. Sent by the commit step before the dead-letter table's "
        "commit; at least once (a failure between the two sends them again: deduplicate on batch id + offset).",
        default=None,
    )


@dataclass(frozen=True)
class TableSpec:
    """The target Iceberg table."""

    identifier: str = _doc("Table identifier `namespace.name` (nested namespaces allowed: `a.b.name`).", default="")
    auto_create: bool = _doc(
        "Create the namespace and table when missing, with the schema inferred from the data.", default=True
    )
    evolve_schema: bool = _doc(
        "Add columns for new top-level or nested fields found in the data. When off, new fields are left out "
        "of the rows and reported (snapshot summary `tidewater.ignored-fields`, the write step's log).",
        default=True,
    )
    properties: dict[str, str] = _doc(
        "Iceberg table properties used when the table is auto-created (e.g. `write.target-file-size-bytes`).",
        default_factory=dict,
    )
    case_insensitive: bool = _doc(
        "Match record field names to the table's columns ignoring case (`OrderId` fills `orderid`). Field names are "
        "always matched through the table's name mapping (`schema.name-mapping.default` aliases) too. New fields "
        "keep their spelling.",
        default=False,
    )
    partition_by: list[str] = _doc(
        "Partition spec used when the table is auto-created, one entry per field: `col` (identity), `year(col)`, "
        "`month(col)`, `day(col)`, `hour(col)`, `bucket(N, col)`, `truncate(W, col)`; nested columns as `a.b`. "
        "An existing table keeps its own spec (the writer follows whatever spec the table has). Each Spark task "
        "keeps one open file per partition it sees.",
        default_factory=list,
    )
    sort_by: list[str] = _doc(
        "Sort order set when the table is auto-created: `col [asc|desc] [nulls first|nulls last]` per entry. "
        "Ingest files are written unsorted (marked so); `maintenance.rewrite_data_files.strategy: auto` sorts.",
        default_factory=list,
    )
    suite: str | None = _doc(
        "This table's great-expectations suite file (relative to the pipeline file); replaces `validation.suite` "
        "for this table.",
        default=None,
    )
    id_columns: list[str] = _doc(
        "Columns that identify a row. Set as the table's identifier fields (required columns) when it is "
        "auto-created; a record without a value for one is a dead letter (`MissingId`).",
        default_factory=list,
    )
    branch: str | None = _doc(
        "Commit to this branch instead of `main` (created by the first commit). The committed offsets are "
        "read from the same branch.",
        default=None,
    )


@dataclass(frozen=True)
class RouteTableSpec(TableSpec):
    """One target table of a routed pipeline (`tables:` entries). Every `table.*` key is accepted, and
    `table` gives the defaults; these keys are added."""

    topics: list[str] = _doc(
        "Records of these topics go to this table (empty: records of every topic). Many tables may share a "
        "topic, and many topics may feed one table.",
        default_factory=list,
    )
    route_regex: str | None = _doc(
        "Static routing: the record's `routing.field` value must fully match this regular expression. A "
        "record can match several tables and goes to each.",
        default=None,
    )


@dataclass(frozen=True)
class RoutingSpec:
    """How a pipeline with several target tables routes records (with `tables:` or `routing.dynamic`)."""

    field: str | None = _doc("Route field: a dotted path into the record value (`meta.type`).", default=None)
    dynamic: bool = _doc(
        "The route field's value names the table: `table_template` with `{value}` replaced; names are "
        "checked (letters, digits, `_`; at most 255 characters); tables are auto-created with the `table` "
        "settings (an entry in `tables` overrides them for one table) when `table.auto_create` is on, "
        "otherwise their records are dead letters (`UnknownTable`).",
        default=False,
    )
    table_template: str = _doc(
        "Dynamic table name, e.g. `payments_{value}` or `ns.{value}`; without a namespace the table goes to "
        "`routing.namespace`.",
        default="{value}",
    )
    namespace: str | None = _doc(
        "Namespace of the pipeline's own tables (`<name>_checkpoints`: one row and the committed offsets per "
        "batch; `<name>_dead_letters`) and of dynamic tables without one. Required when routing.",
        default=None,
    )
    unmatched: str = _doc(
        "Records that go to no table (no entry matches, route field missing): `dead_letter` (error class "
        "`Unrouted`) or `skip` (counted in `tidewater.skipped`).",
        default="dead_letter",
    )


@dataclass(frozen=True)
class CatalogSpec:
    """The Iceberg catalog (pyiceberg properties). Spark uses the same catalog under the same name."""

    name: str = _doc("Catalog name. Spark's catalog gets the same name (it is stored in the catalog tables).", default="tidewater")
    properties: dict[str, str] = _doc(
        "pyiceberg catalog properties (`type: sql|rest|glue|hive`, `uri`, `warehouse`, ...). Default: a SQLite "
        "SqlCatalog at `$TIDEWATER_HOME/catalog.db` with the warehouse at `$TIDEWATER_HOME/warehouse`.",
        default_factory=dict,
    )


@dataclass(frozen=True)
class BatchSpec:
    """Limits of one micro-batch."""

    max_records: int = _doc(
        "Cap on records per batch over all partitions; shared fairly between partitions with a backlog.",
        default=1_000_000,
    )
    records_per_task: int = _doc(
        "A partition range longer than this is split into sub-ranges read by separate Spark tasks.",
        default=250_000,
    )
    chunk_records: int = _doc(
        "Records decoded and written at a time inside one Spark task (bounds memory per task).", default=50_000
    )
    staging_dir: str | None = _doc(
        "Where batch plans and manifests are staged. Default: `$TIDEWATER_HOME/staging`.", default=None
    )


@dataclass(frozen=True)
class ValidationSpec:
    """The data-quality gate that runs on a staged batch before it is committed."""

    not_null: list[str] = _doc("Columns that must be non-null in every row of the batch.", default_factory=list)
    suite: str | None = _doc(
        "A great-expectations suite file (JSON, `{\"expectations\": [{\"type\": ..., \"kwargs\": {...}}]}`), "
        "relative to the pipeline file, whose expectations are added to the built-in ones. Row-wise "
        "expectations (`expect_column_values_to_*`, column pairs) run chunk by chunk; whole-column ones "
        "(uniqueness, means, ...) read their columns for the whole batch.",
        default=None,
    )
    chunk_rows: int = _doc(
        "Rows of the checked columns held in memory at a time while validating (bounds the gate's memory).",
        default=500_000,
    )
    unique_ids: str = _doc(
        "Uniqueness of the table's `id_columns`: `none`, `batch` (no two rows of the batch share an id) or "
        "`table` (also none of the batch's ids is already in the table; reads the table's id columns for "
        "the batch's ids).",
        default="none",
    )
    data_docs_dir: str | None = _doc(
        "Where the gate writes its great-expectations Data Docs page per batch (HTML; the validate task logs "
        "its path). Default: `$TIDEWATER_HOME/data-docs`; pages go to `<dir>/<pipeline>/<batch id>.html`.",
        default=None,
    )
    on_failure: str = _doc(
        "`fail`: a failing expectation stops the batch (nothing committed, offsets unchanged); `warn`: the batch "
        "is committed and the failure is logged and recorded in the snapshot summary (`tidewater.validation`); "
        "`quarantine`: the batch's files are committed to a branch `quarantine-<batch id>` of the table, main gets "
        "an empty snapshot that advances the offsets (main stays clean), the run fails with the report, and a "
        "person publishes or drops it (`tidewater quarantine publish|drop`). The accounting checks (row count, "
        "read = rows + dead letters + skipped) always fail the batch.",
        default="fail",
    )


@dataclass(frozen=True)
class SparkSpec:
    """How the write step's Spark job is submitted."""

    master: str = _doc("Spark master for `tidewater run` (the DAG uses the Airflow connection).", default="local[*]")
    conn_id: str = _doc(
        "Airflow Spark connection used by the ingest DAG's SparkSubmitOperator.", default="tidewater_spark"
    )
    conf: dict[str, str] = _doc("Extra Spark configuration passed to spark-submit.", default_factory=dict)
    iceberg_packages: str | None = _doc(
        "Maven coordinates for the Iceberg Spark runtime (production). Unset: the bundled offline jar is "
        "repaired and used.",
        default=None,
    )


@dataclass(frozen=True)
class AirflowSpec:
    """DAG settings."""

    retries: int = _doc("Task retries.", default=2)
    retry_delay_seconds: int = _doc("Delay between task retries.", default=60)
    owner: str = _doc("DAG owner shown in the UI.", default="tidewater")
    tags: list[str] = _doc("Extra DAG tags (`tidewater` and `ingest` are always set).", default_factory=list)
    task_timeout_minutes: int = _doc(
        "Execution timeout of each ingest task. With retries it bounds the longest possible batch, which "
        "`maintenance.remove_orphan_files.older_than_hours` may never undercut.",
        default=60,
    )

    def dag_kwargs(self, kind: str) -> dict[str, Any]:
        """Arguments every DAG of the pipeline shares (``kind``: ingest, replay, quarantine, maintenance)."""
        from datetime import datetime, timezone

        return {
            "start_date": datetime(2024, 1, 1, tzinfo=timezone.utc),
            "catchup": False,
            "max_active_runs": 1,
            "tags": sorted({"tidewater", kind, *self.tags}),
            "default_args": self.default_args(),
        }

    def default_args(self) -> dict[str, Any]:
        """Airflow ``default_args`` shared by the pipeline's DAGs."""
        from datetime import timedelta

        return {
            "owner": self.owner,
            "retries": self.retries,
            "retry_delay": timedelta(seconds=self.retry_delay_seconds),
            "execution_timeout": timedelta(minutes=self.task_timeout_minutes),
        }


@dataclass(frozen=True)
class CompactionSpec:
    """Rewrite data files (Spark `rewrite_data_files`): small files into files near the target size."""

    enabled: bool = _doc("Run this task.", default=True)
    strategy: str = _doc(
        "`auto` (sort when the table has a sort order, else bin-pack), `binpack`, `sort`, or `zorder`.",
        default="auto",
    )
    zorder_columns: list[str] = _doc("Columns for `strategy: zorder`.", default_factory=list)
    target_file_size_bytes: int | None = _doc(
        "Target size of rewritten files. Default: the table's `write.target-file-size-bytes`.", default=None
    )
    min_input_files: int = _doc("A file group is rewritten only when it has at least this many files.", default=5)
    partial_progress: bool = _doc(
        "Commit file groups as they finish (big tables make progress even if the task dies).", default=True
    )
    partial_progress_max_commits: int = _doc("Most commits one run makes with partial progress.", default=10)


@dataclass(frozen=True)
class ExpirySpec:
    """Expire old snapshots (Spark `expire_snapshots`). The newest snapshot carrying the committed
    offsets, and every snapshot after it, are always kept."""

    enabled: bool = _doc("Run this task.", default=True)
    older_than_hours: float = _doc("Expire snapshots older than this.", default=120.0)
    retain_last: int = _doc("Always keep at least this many of the newest snapshots.", default=10)


@dataclass(frozen=True)
class OrphanSpec:
    """Delete files in the table's location that no snapshot references (Spark `remove_orphan_files`)."""

    enabled: bool = _doc("Run this task.", default=True)
    older_than_hours: float = _doc(
        "Only files older than this are removed. Must exceed the longest possible batch (see "
        "`airflow.task_timeout_minutes`); files of a batch still in flight are never removed.",
        default=72.0,
    )


@dataclass(frozen=True)
class MaintenanceSpec:
    """The `maintain_<name>` DAG and `tidewater maintain`."""

    schedule: str | None = _doc("Airflow schedule of the maintenance DAG. `null`: triggered only.", default="@daily")
    rewrite_data_files: CompactionSpec = _doc("Compaction.", default_factory=CompactionSpec)
    rewrite_manifests: bool = _doc("Rewrite manifests (Spark `rewrite_manifests`).", default=True)
    expire_snapshots: ExpirySpec = _doc("Snapshot expiry.", default_factory=ExpirySpec)
    remove_orphan_files: OrphanSpec = _doc("Orphan file removal.", default_factory=OrphanSpec)


@dataclass(frozen=True)
class PipelineSpec:
    """One pipeline: Kafka topics into one Iceberg table."""

    name: str = _doc("Pipeline name: lower-case letters, digits and `_`. The DAG id is `ingest_<name>`.", default="")
    topics: list[str] = _doc("Kafka topics to ingest.", default_factory=list)
    topic_pattern: str | None = _doc(
        "Regular expression (full match) selecting more topics, e.g. `logs\\.\\d{8}` for daily topics. Matching "
        "topics are listed at every plan, so topics created later are picked up; their offsets are tracked like "
        "the others. Internal topics (`__...`) never match.",
        default=None,
    )
    table: TableSpec = _doc(
        "Target table. With `tables` or `routing.dynamic`: the defaults of every target table (no identifier).",
        default_factory=TableSpec,
    )
    tables: list[RouteTableSpec] = _doc(
        "Several target tables (see `tables[]` below): records go to tables by topic and/or `routing`. Each "
        "table gets one commit per batch and records its own offsets; the pipeline's position is kept in "
        "`<routing.namespace>.<name>_checkpoints`.",
        default_factory=list,
    )
    routing: RoutingSpec = _doc("Routing between several tables.", default_factory=RoutingSpec)
    schedule: str | None = _doc("Airflow schedule (cron or preset). `null`: triggered only.", default="*/5 * * * *")
    description: str = _doc("Shown as the DAG's documentation.", default="")
    kafka: KafkaSpec = _doc("Kafka connection.", default_factory=KafkaSpec)
    format: FormatSpec = _doc("Record format.", default_factory=FormatSpec)
    dead_letter: DeadLetterSpec = _doc("Records that cannot be decoded.", default_factory=DeadLetterSpec)
    catalog: CatalogSpec = _doc("Iceberg catalog.", default_factory=CatalogSpec)
    batch: BatchSpec = _doc("Batch limits.", default_factory=BatchSpec)
    validation: ValidationSpec = _doc("Data-quality gate.", default_factory=ValidationSpec)
    spark: SparkSpec = _doc("Spark job submission.", default_factory=SparkSpec)
    airflow: AirflowSpec = _doc("Airflow DAG settings.", default_factory=AirflowSpec)
    maintenance: MaintenanceSpec = _doc("Table maintenance.", default_factory=MaintenanceSpec)
    source_path: str | None = field(default=None, metadata={"internal": True})

    # ---- derived values -------------------------------------------------------------------------
    @property
    def dag_id(self) -> str:
        return f"ingest_{self.name}"

    def catalog_properties(self) -> dict[str, str]:
        props = dict(self.catalog.properties)
        if not props:
            home = home_dir()
            props = {
                "type": "sql",
                "uri": f"sqlite:///{home / 'catalog.db'}",
                "warehouse": f"file://{home / 'warehouse'}",
            }
        return props

    @property
    def routed(self) -> bool:
        """Several target tables (static `tables` or dynamic routing)."""
        return bool(self.tables) or self.routing.dynamic

    def table_spec(self, identifier: str) -> TableSpec:
        """Settings of one target table: its `tables` entry, else the `table` defaults under that name."""
        for t in self.tables:
            if t.identifier == identifier:
                return TableSpec(**{f.name: getattr(t, f.name) for f in dataclasses.fields(TableSpec)})
        return dataclasses.replace(self.table, identifier=identifier)

    def for_table(self, identifier: str) -> PipelineSpec:
        """A single-table view of a routed pipeline (for the gate and maintenance of one target table)."""
        return dataclasses.replace(
            self, table=self.table_spec(identifier), tables=[], routing=RoutingSpec(),
            dead_letter=dataclasses.replace(self.dead_letter, table=self.dead_letter_table()),
        )

    def describe_targets(self) -> str:
        """The target table(s), for logs and DAG documentation."""
        if not self.routed:
            return self.table.identifier
        if self.routing.dynamic:
            return f"tables named by {self.routing.field!r} ({self.routing.table_template})"
        return ", ".join(t.identifier for t in self.tables)

    def checkpoint_table(self) -> str:
        """Where the pipeline's position lives: the target table, or the checkpoint table when routing."""
        return f"{self.routing.namespace}.{self.name}_checkpoints" if self.routed else self.table.identifier

    def dead_letter_table(self) -> str:
        if self.dead_letter.table:
            return self.dead_letter.table
        return f"{self.routing.namespace}.{self.name}_dead_letters" if self.routed else f"{self.table.identifier}_dead_letters"

    def longest_batch_seconds(self) -> int:
        """Upper bound on a batch's life: plan, write, validate and commit, each with every retry."""
        a = self.airflow
        per_task = a.task_timeout_minutes * 60 * (a.retries + 1) + a.retry_delay_seconds * a.retries
        return 4 * per_task

    def staging_dir(self) -> Path:
        return Path(self.batch.staging_dir) if self.batch.staging_dir else home_dir() / "staging"

    def suite_path(self) -> Path | None:
        suite = self.table.suite or self.validation.suite
        if not suite:
            return None
        base = Path(self.source_path).parent if self.source_path else pipelines_dir()
        return (base / suite).resolve()


# ---- parsing -------------------------------------------------------------------------------------


def _interpolate(value: Any, path: str) -> Any:
    if isinstance(value, str):

        def repl(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            env = os.environ.get(name)
            if env is not None:
                return env
            if default is not None:
                return default
            raise ConfigError(f"{path}: environment variable {name} is not set (use ${{{name}:-default}} for a default)")

        return _ENV_REF.sub(repl, value)
    if isinstance(value, list):
        return [_interpolate(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _interpolate(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    return value


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, path)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if origin is list:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__}")
        return [_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__}")
        return {str(k): _scalar_to_str(v, f"{path}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: expected an integer, got {value!r}") from None
    if tp is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: expected a number, got {value!r}") from None
    if tp is str:
        if isinstance(value, (dict, list)) or value is None:
            raise ConfigError(f"{path}: expected a string, got {type(value).__name__}")
        return str(value)
    raise ConfigError(f"{path}: unsupported type {_type_name(tp)}")


def _scalar_to_str(value: Any, path: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ConfigError(f"{path}: expected a string, number or boolean, got {type(value).__name__}")


def _build(cls: type, data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'pipeline'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        near = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else f" (known keys: {', '.join(fields)})"
        raise ConfigError(f"{path + '.' if path else ''}{key}: unknown key{hint}")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value, f"{path}.{name}" if path else name)
    return cls(**kwargs)


def _merge_table_defaults(data: Any) -> Any:
    """`tables:` entries take their defaults from `table:` (entry keys win)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("tables"), list):
        return data
    defaults = data.get("table") or {}
    if isinstance(defaults, str):
        return data
    defaults = {k: v for k, v in dict(defaults).items() if k != "identifier"}
    entries = [{**defaults, **e} if isinstance(e, Mapping) else e for e in data["tables"]]
    return {**data, "tables": entries}


def parse_pipeline(data: Any, source_path: str | None = None) -> PipelineSpec:
    """Parse and validate a pipeline specification from already-loaded YAML data."""
    data = _interpolate(data, "")
    if isinstance(data, Mapping) and isinstance(data.get("table"), str):
        data = {**data, "table": {"identifier": data["table"]}}
    spec: PipelineSpec = _build(PipelineSpec, _merge_table_defaults(data), "")
    spec = dataclasses.replace(spec, source_path=source_path)
    validate(spec)
    return spec


def load_pipeline(path: str | os.PathLike[str]) -> PipelineSpec:
    """Load one pipeline file. Errors name the file and the key at fault."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read pipeline file: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    try:
        return parse_pipeline(data, source_path=str(p.resolve()))
    except ConfigError as e:
        raise ConfigError(f"{p}: {e.message}") from None


def discover_pipelines(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """Pipeline files (``*.yaml``/``*.yml``) in the pipelines directory, sorted."""
    d = Path(directory) if directory else pipelines_dir()
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def validate(spec: PipelineSpec) -> None:
    """Checks across fields. Raises ConfigError naming the key."""
    if not spec.name:
        raise ConfigError("name: required")
    if not _NAME.match(spec.name):
        raise ConfigError(f"name: {spec.name!r} must be lower-case letters, digits and '_', starting with a letter")
    if not spec.topics and not spec.topic_pattern:
        raise ConfigError("topics: at least one topic (or a topic_pattern) is required")
    if spec.topic_pattern is not None:
        try:
            re.compile(spec.topic_pattern)
        except re.error as e:
            raise ConfigError(f"topic_pattern: {spec.topic_pattern!r} is not a valid regular expression ({e})") from None
    for i, t in enumerate(spec.topics):
        if not re.match(r"^[A-Za-z0-9._-]{1,249}$", t):
            raise ConfigError(f"topics[{i}]: {t!r} is not a valid Kafka topic name")
    if len(set(spec.topics)) != len(spec.topics):
        raise ConfigError("topics: a topic is listed twice")
    if spec.routed:
        _validate_routing(spec)
    elif not spec.table.identifier:
        raise ConfigError("table.identifier: required (namespace.name)")
    else:
        _check_identifier("table.identifier", spec.table.identifier)
    from tidewater.partitioning import check_config

    check_config(spec.table.partition_by, spec.table.sort_by, "table")
    if not spec.kafka.bootstrap_servers and not spec.kafka.conn_id:
        raise ConfigError("kafka: set either bootstrap_servers or conn_id")
    for key in ("group.id", "enable.auto.commit", "isolation.level", "enable.partition.eof"):
        if key in spec.kafka.settings:
            raise ConfigError(f"kafka.settings.{key}: managed by Tidewater (offsets live in the table); remove it")
    if spec.kafka.read_timeout_seconds <= 0:
        raise ConfigError("kafka.read_timeout_seconds: must be positive")
    formats = ("json", "connect_json", "debezium", "avro", "string", "bytes")
    if spec.format.value not in formats:
        raise ConfigError(f"format.value: {spec.format.value!r} is not supported (supported: {', '.join(formats)})")
    if spec.format.value == "avro" and not spec.format.registry_url:
        raise ConfigError("format.registry_url: required for value format avro")
    try:
        from zoneinfo import ZoneInfo

        ZoneInfo(spec.format.timezone)
    except Exception:
        raise ConfigError(f"format.timezone: {spec.format.timezone!r} is not an IANA time zone name") from None
    for column, tfmt in spec.format.timestamps.items():
        if tfmt not in ("iso8601", "epoch_millis", "epoch_seconds") and "%" not in tfmt:
            raise ConfigError(
                f"format.timestamps.{column}: {tfmt!r} is not iso8601, epoch_millis, epoch_seconds or a strftime pattern"
            )
    _one_of("format.key", spec.format.key, ("none", "string", "bytes"))
    if not re.match(r"^[A-Za-z0-9_]{1,8}$", spec.format.flatten_separator):
        raise ConfigError(f"format.flatten_separator: {spec.format.flatten_separator!r} must be 1-8 letters, digits or '_'")
    _one_of("format.metadata", spec.format.metadata, ("none", "prefixed", "struct"))
    _one_of("validation.on_failure", spec.validation.on_failure, ("fail", "warn", "quarantine"))
    _one_of("validation.unique_ids", spec.validation.unique_ids, ("none", "batch", "table"))
    if spec.validation.unique_ids != "none" and not spec.routed and not spec.table.id_columns:
        raise ConfigError("validation.unique_ids: needs table.id_columns")
    if spec.validation.on_failure == "quarantine" and spec.routed:
        raise ConfigError("validation.on_failure: quarantine is not available for pipelines that route to several tables yet")
    _one_of("dead_letter.policy", spec.dead_letter.policy, ("dead_letter", "fail", "skip"))
    if spec.dead_letter.topic is not None and (
        not re.match(r"^[A-Za-z0-9._-]{1,249}$", spec.dead_letter.topic) or spec.dead_letter.topic in spec.topics
    ):
        raise ConfigError(f"dead_letter.topic: {spec.dead_letter.topic!r} must be a valid Kafka topic name, not a source topic")
    if spec.dead_letter.topic and spec.dead_letter.policy != "dead_letter":
        raise ConfigError("dead_letter.topic: only used with dead_letter.policy: dead_letter")
    dlq = spec.dead_letter.table
    if dlq is not None and (
        dlq == spec.table.identifier or len(dlq.split(".")) < 2 or not all(_IDENTIFIER_PART.match(p) for p in dlq.split("."))
    ):
        raise ConfigError(f"dead_letter.table: {dlq!r} must be `namespace.name` (letters, digits, '_'), not the target table")
    m = spec.maintenance
    for key, value, minimum in (
        ("batch.max_records", spec.batch.max_records, 1),
        ("batch.records_per_task", spec.batch.records_per_task, 1),
        ("batch.chunk_records", spec.batch.chunk_records, 1),
        ("validation.chunk_rows", spec.validation.chunk_rows, 1),
        ("format.flatten_max_depth", spec.format.flatten_max_depth, 1),
        ("airflow.task_timeout_minutes", spec.airflow.task_timeout_minutes, 1),
        ("maintenance.rewrite_data_files.min_input_files", m.rewrite_data_files.min_input_files, 1),
        ("maintenance.expire_snapshots.retain_last", m.expire_snapshots.retain_last, 1),
        ("maintenance.expire_snapshots.older_than_hours", m.expire_snapshots.older_than_hours, 0),
    ):
        if value < minimum:
            raise ConfigError(f"{key}: must be at least {minimum}")
    _one_of("maintenance.rewrite_data_files.strategy", m.rewrite_data_files.strategy, ("auto", "binpack", "sort", "zorder"))
    if m.rewrite_data_files.strategy == "zorder" and not m.rewrite_data_files.zorder_columns:
        raise ConfigError("maintenance.rewrite_data_files.zorder_columns: needed for strategy zorder")
    longest_h = spec.longest_batch_seconds() / 3600
    if m.remove_orphan_files.older_than_hours < max(longest_h, 24):
        raise ConfigError(
            f"maintenance.remove_orphan_files.older_than_hours: {m.remove_orphan_files.older_than_hours:g} is less than "
            f"the longest possible batch ({longest_h:.1f} h from airflow.task_timeout_minutes, retries and "
            "retry_delay_seconds) or 24 h; a younger file may belong to a batch still being written"
        )
    props = spec.catalog_properties()
    if "type" not in props and "uri" not in props:
        raise ConfigError("catalog.properties: set at least `type` (sql, rest, glue, hive) or `uri`")
    if spec.airflow.retries < 0:
        raise ConfigError("airflow.retries: must be zero or more")
    suite = spec.suite_path()
    if suite is not None and not suite.is_file():
        raise ConfigError(f"{'table.suite' if spec.table.suite else 'validation.suite'}: file {suite} does not exist")
    for i, t in enumerate(spec.tables):
        if t.suite:
            path = spec.for_table(t.identifier).suite_path()
            if path is None or not path.is_file():
                raise ConfigError(f"tables[{i}].suite: file {path} does not exist")


def _check_identifier(key: str, ident: str) -> None:
    parts = ident.split(".")
    if len(parts) < 2 or not all(_IDENTIFIER_PART.match(p) for p in parts):
        raise ConfigError(f"{key}: {ident!r} must be namespace.name made of letters, digits and '_'")


def _validate_routing(spec: PipelineSpec) -> None:
    r = spec.routing
    if spec.table.identifier:
        raise ConfigError("table.identifier: not used when records are routed (`tables` or routing.dynamic); "
                          "`table` holds the defaults of every target table, list the targets under `tables`")
    if not r.namespace or not _IDENTIFIER_PART.match(r.namespace):
        raise ConfigError("routing.namespace: required when routing (letters, digits and '_'): it holds the "
                          "pipeline's checkpoint and dead-letter tables")
    _one_of("routing.unmatched", r.unmatched, ("dead_letter", "skip"))
    if r.field is not None and not re.match(r"^[A-Za-z_$][A-Za-z0-9_$-]*(\.[A-Za-z_$][A-Za-z0-9_$-]*)*$", r.field):
        raise ConfigError(f"routing.field: {r.field!r} is not a field name or dotted path")
    if r.dynamic:
        if not r.field:
            raise ConfigError("routing.field: required with routing.dynamic")
        if r.table_template.count("{value}") != 1:
            raise ConfigError(f"routing.table_template: {r.table_template!r} must contain {{value}} once")
    seen = set()
    for i, t in enumerate(spec.tables):
        key = f"tables[{i}]"
        if not t.identifier:
            raise ConfigError(f"{key}.identifier: required")
        _check_identifier(f"{key}.identifier", t.identifier)
        if t.identifier in seen:
            raise ConfigError(f"{key}.identifier: {t.identifier!r} is listed twice")
        seen.add(t.identifier)
        if t.route_regex is not None:
            if r.dynamic:
                raise ConfigError(f"{key}.route_regex: not used with routing.dynamic (the value names the table)")
            if not r.field:
                raise ConfigError(f"{key}.route_regex: needs routing.field")
            try:
                re.compile(t.route_regex)
            except re.error as e:
                raise ConfigError(f"{key}.route_regex: {t.route_regex!r} is not a valid regular expression ({e})") from None
        for topic in t.topics:
            listed = topic in spec.topics or (spec.topic_pattern and re.fullmatch(spec.topic_pattern, topic))
            if not listed:
                raise ConfigError(f"{key}.topics: {topic!r} is not one of the pipeline's topics (or topic_pattern)")
        from tidewater.partitioning import check_config

        check_config(t.partition_by, t.sort_by, key)
    for ident in (spec.checkpoint_table(), spec.dead_letter_table()):
        if ident in seen:
            raise ConfigError(f"tables: {ident!r} is the pipeline's own checkpoint or dead-letter table")


def _one_of(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(choices)}")


def is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def redact(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A copy with secret-looking values replaced, safe for logs, XCom and snapshot properties."""
    return {k: (REDACTED if is_secret_key(k) else v) for k, v in settings.items()}


# ---- reference documentation -----------------------------------------------------------------------


def reference_markdown() -> str:
    """The configuration reference page, generated from the dataclasses above."""
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `tidewater docs` from include/tidewater/config.py; a test checks it is current. -->",
        "",
        "One YAML file per pipeline in `include/pipelines/` (override the directory with "
        f"`{PIPELINES_DIR_ENV}`). Strings may use `${{NAME}}` or `${{NAME:-default}}` to read the "
        "environment. Check a file with `tidewater validate --pipeline FILE`.",
        "",
        "## Environment",
        "",
        "| variable | meaning |",
        "| --- | --- |",
        f"| `{HOME_ENV}` | Data directory for the embedded defaults (catalog, warehouse, staging, repaired jars). Default `~/.tidewater`; the Makefile uses `.data/` in the checkout. |",
        f"| `{PIPELINES_DIR_ENV}` | Directory of pipeline files. Default `include/pipelines`. |",
        f"| `{KAFKA_CONFIG_ENV}` | Set by the ingest DAG for its Spark job: resolved librdkafka settings (JSON). Not for people. |",
        "",
    ]

    def section(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> None:
        hints = typing.get_type_hints(cls)
        lines.append(f"## `{prefix or 'top level'}`")
        lines.append("")
        lines.append((cls.__doc__ or "").strip())
        lines.append("")
        lines.append("| key | type | default | meaning |")
        lines.append("| --- | --- | --- | --- |")
        nested = []
        for f in dataclasses.fields(cls):
            if f.metadata.get("internal") or f.name in skip:
                continue
            tp = hints[f.name]
            key = f"{prefix}.{f.name}" if prefix else f.name
            if dataclasses.is_dataclass(tp):
                nested.append((tp, key))
                lines.append(f"| `{key}` | section | | {f.metadata['doc']} See below. |")
                continue
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                default = f.default_factory()  # type: ignore[misc]
            else:
                default = None
            shown = "required" if default in ("", []) and f.name in ("name", "topics", "identifier") else f"`{default!r}`"
            type_shown = str(tp).replace("typing.", "").replace("tidewater.config.", "")
            lines.append(f"| `{key}` | `{type_shown}` | {shown} | {f.metadata['doc']} |")
        lines.append("")
        for tp, key in nested:
            section(tp, key)

    section(PipelineSpec, "")
    section(RouteTableSpec, "tables[]", skip=tuple(f.name for f in dataclasses.fields(TableSpec)))
    lines.append("A bare string is accepted for `table` as a shorthand for `table.identifier`.")
    lines.append("")
    return "\n".join(lines)
