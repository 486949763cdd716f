"""Pipeline specifications: one YAML file per pipeline.

A specification is parsed into frozen dataclasses. Every field has a default (or is marked required)
and a ``doc`` string; ``docs/configuration.md`` is generated from these (``tidewater docs``) and a test
checks that the page matches the code.

Strings may reference the environment as ``${NAME}`` or ``${NAME:-default}``; a reference to an unset
variable without a default is an error naming the key. Secrets (keys that look like passwords, tokens,
JAAS configs or private keys, and values that carry one) are never logged: ``config/secrets.py`` says what
counts as one; use its ``redact`` on anything that leaves the process.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidewater.config.formats import DEBEZIUM_FORMATS, FORMATS
from tidewater.config.locations import home_dir, pipelines_dir
from tidewater.config.sections import doc
from tidewater.config.sections.airflow import OPTIONAL_DAGS, AirflowSpec, AuditSpec, TriggerSpec
from tidewater.config.sections.maintenance import MaintenanceSpec
from tidewater.config.sections.run import BatchSpec, CatalogSpec, SparkSpec, ValidationSpec
from tidewater.config.sections.source import DeadLetterSpec, FormatSpec, KafkaSpec
from tidewater.config.sections.table import KEYED_OP, RouteTableSpec, RoutingSpec, TableSpec
from tidewater.config.targets import TargetSet
from tidewater.staging import locate

if TYPE_CHECKING:
    from pyiceberg.table import Table


@dataclass(frozen=True)
class PipelineSpec:
    """One pipeline: Kafka topics into one Iceberg table."""

    name: str = doc("Pipeline name: lower-case letters, digits and `_`. The DAG id is `ingest_<name>`.", default="")
    topics: list[str] = doc("Kafka topics to ingest. `topics`, `topic_pattern` or both: at least one is required.", default_factory=list)
    topic_pattern: str | None = doc(
        "Regular expression (full match) selecting more topics, e.g. `logs\\.\\d{8}` for daily topics. Matching "
        "topics are listed at every plan, so topics created later are picked up; their offsets are tracked like "
        "the others. Internal topics (`__...`) never match.",
        default=None,
    )
    table: TableSpec = doc(
        "Target table. With `tables` or `routing.dynamic`: the defaults of every target table (no identifier).",
        default_factory=TableSpec,
    )
    tables: list[RouteTableSpec] = doc(
        "Several target tables (see `tables[]` below): records go to tables by topic and/or `routing`. Each "
        "table gets one commit per batch and records its own offsets; the pipeline's position is kept in "
        "`<routing.namespace>.<name>_checkpoints`.",
        default_factory=list,
    )
    routing: RoutingSpec = doc("Routing between several tables.", default_factory=RoutingSpec)
    schedule: str | None = doc("Airflow schedule (cron or preset). `null`: triggered only.", default="*/5 * * * *")
    description: str = doc("Shown as the DAG's documentation.", default="")
    kafka: KafkaSpec = doc("Kafka connection.", default_factory=KafkaSpec)
    format: FormatSpec = doc("Record format.", default_factory=FormatSpec)
    dead_letter: DeadLetterSpec = doc("Records that cannot be decoded.", default_factory=DeadLetterSpec)
    catalog: CatalogSpec = doc("Iceberg catalog.", default_factory=CatalogSpec)
    batch: BatchSpec = doc("Batch limits.", default_factory=BatchSpec)
    validation: ValidationSpec = doc("Data-quality gate.", default_factory=ValidationSpec)
    spark: SparkSpec = doc("Spark job submission.", default_factory=SparkSpec)
    airflow: AirflowSpec = doc("Airflow DAG settings.", default_factory=AirflowSpec)
    maintenance: MaintenanceSpec = doc("Table maintenance.", default_factory=MaintenanceSpec)
    audit: AuditSpec = doc("Reconciliation of the table against its topic.", default_factory=AuditSpec)
    trigger: TriggerSpec = doc("Batches started by pending data (lag), besides `schedule`.", default_factory=TriggerSpec)
    source_path: str | None = field(default=None, metadata={"internal": True})
    # a single-table view of a routed pipeline (``for_table``) keeps the pipeline (a PipelineSpec): its ledger is the
    # pipeline's. Typed Any: a self-reference would turn the editors' JSON schema (config/schema.py) into a $ref
    routed_from: Any = field(default=None, metadata={"internal": True}, compare=False, repr=False)

    # ---- derived values -------------------------------------------------------------------------
    @property
    def dag_id(self) -> str:
        return self.dag_ids()["ingest"]

    def dag_ids(self) -> dict[str, str]:
        """The id of each DAG the pipeline has, by kind: ``<airflow.dag_id_prefix><kind>_<name>`` for its ingest DAG,
        the optional DAGs of ``airflow.dags`` and, under the quarantine policy, its quarantine DAG."""
        kinds = ["ingest", *(k for k in OPTIONAL_DAGS if k in self.airflow.dags)]
        if self.validation.on_failure == "quarantine":
            kinds.append("quarantine")
        return {kind: f"{self.airflow.dag_id_prefix}{kind}_{self.name}" for kind in kinds}

    def op_column(self) -> str | None:
        """The column that carries each change's operation (None: every record is an upsert)."""
        if self.table.op_field:
            return self.table.op_field
        if self.applies_changes and self.table.key_source == "message_key":
            return KEYED_OP  # set by the task: tombstones delete, other records upsert

        fmt = FORMATS.get(self.format.value)
        return fmt.op_column if self.table.upsert and fmt is not None else None

    @property
    def applies_changes(self) -> bool:
        """Records are changes to rows by key (upserts and deletes), not appended rows."""
        return not self.routed and (self.table.upsert or bool(self.table.op_field))

    @property
    def replay_modes(self) -> tuple[str, ...]:
        """The modes a replay of this pipeline takes, its default first: a change table is reapplied; an append table
        is replaced or gets the missing offsets; a routed pipeline takes all three, and each target table translates
        the mode to its kind (``batch.Mode.for_table``). The CLI, the replay DAG's form and the plan check read it."""
        if self.applies_changes:
            return ("reapply",)
        return ("replace", "append-missing", "reapply") if self.routed else ("replace", "append-missing")

    def catalog_properties(self) -> dict[str, str]:
        props = dict(self.catalog.properties)
        if self.catalog.conn_id:
            from tidewater.config.connections import catalog_connection

            props = {**catalog_connection(self.catalog.conn_id), **props}
        if not props:
            home = home_dir()
            props = {
                "type": "sql",
                "uri": f"sqlite:///{home / 'catalog.db'}",
                "warehouse": f"file://{home / 'warehouse'}",
            }
        return props

    def registry(self) -> tuple[str, str | None, dict[str, str]]:
        """The schema registry's (URL, basic auth, client settings): ``format.registry_*``, over what the connection
        ``format.registry_conn_id`` holds (resolved here, not at parse time)."""
        fmt = self.format
        if not fmt.registry_conn_id:
            return fmt.registry_url or "", fmt.registry_basic_auth, dict(fmt.registry_settings)
        from tidewater.config.connections import registry_connection

        conn = dict(registry_connection(fmt.registry_conn_id))
        url, auth = conn.pop("url", ""), conn.pop("basic.auth.user.info", None)
        return fmt.registry_url or url, fmt.registry_basic_auth or auth, {**conn, **fmt.registry_settings}

    def for_executors(self) -> PipelineSpec:
        """This pipeline as the Spark tasks get it: what would otherwise be resolved from an executor's own
        environment (the embedded default catalog and warehouse under ``$TIDEWATER_HOME``, the staging
        directory) or from Airflow (the connections of the catalog, the schema registry and object storage, which
        executors cannot ask for) made explicit here, on the driver. Executors never read their environment for
        these."""
        from tidewater.config.connections import storage_connection

        fmt, batch = self.format, self.batch
        if fmt.registry_conn_id:
            url, auth, registry = self.registry()
            fmt = dataclasses.replace(fmt, registry_url=url, registry_basic_auth=auth, registry_settings=registry, registry_conn_id=None)
        staging = {**(storage_connection(batch.staging_conn_id) if batch.staging_conn_id else {}), **batch.staging_properties}
        return dataclasses.replace(
            self,
            catalog=dataclasses.replace(self.catalog, properties=self.catalog_properties(), conn_id=None),
            format=fmt,
            batch=dataclasses.replace(batch, staging_dir=str(self.staging_dir()), staging_conn_id=None, staging_properties=staging),
        )

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

    def for_table(self, identifier: str, table: Table | None = None) -> PipelineSpec:
        """A single-table view of a routed pipeline (for the gate and maintenance of one target table). ``table``:
        the loaded Iceberg table, whose identifier fields are the id columns of a change table that leaves
        `id_columns` to the message keys (see ``ids_from_keys``)."""
        tspec = self.table_spec(identifier)
        if table is not None and (tspec.upsert or tspec.op_field) and not tspec.id_columns:
            schema = table.schema()
            tspec = dataclasses.replace(
                tspec, id_columns=[n for i in schema.identifier_field_ids if (n := schema.find_column_name(i)) is not None]
            )
        return dataclasses.replace(
            self,
            table=tspec,
            tables=[],
            routing=RoutingSpec(),
            dead_letter=dataclasses.replace(self.dead_letter, table=self.dead_letter_table()),
            routed_from=self,
        )

    @property
    def keys_from_messages(self) -> bool:
        """Some change table takes its keys from the message key (`key_source: message_key`)."""
        if not self.routed:
            return self.applies_changes and self.table.key_source == "message_key"
        return any((t.upsert or t.op_field) and t.key_source == "message_key" for t in [self.table, *self.tables])

    @property
    def routes_by_source(self) -> bool:
        """Dynamic routing by the Debezium envelope's source block (``{source.<field>}`` in the table template)."""
        return self.routing.dynamic and "{source." in self.routing.table_template

    @property
    def ids_from_keys(self) -> bool:
        """A routed Debezium pipeline with a change table whose `id_columns` are left empty: each such table takes
        the fields of its records' message keys (Debezium's key is the source table's primary key) as its id
        columns, set as the Iceberg table's identifier fields when the table is created and read from there on."""
        if not self.routed or self.format.value not in DEBEZIUM_FORMATS:
            return False
        return any((t.upsert or t.op_field) and not t.id_columns for t in [self.table, *self.tables])

    def describe_targets(self) -> str:
        """The target table(s), for logs and DAG documentation."""
        if not self.routed:
            return self.table.identifier
        if self.routing.dynamic:
            return f"tables named by {self.routing.field!r} ({self.routing.table_template})"
        return ", ".join(t.identifier for t in self.tables)

    @property
    def targets(self) -> TargetSet:
        """The one answer to "which tables may a batch commit, and where are its offsets" (``config/targets.py``):
        a plain pipeline is one table holding its own offsets; a routed pipeline's holder is its checkpoint
        table, and its ledger and dead letters live beside it in ``routing.namespace``."""
        dead = self.dead_letter.table
        if not self.routed:
            ident = self.table.identifier
            return TargetSet(ident, True, (ident,), self.table.branch, f"{ident}_ledger", dead or f"{ident}_dead_letters")
        base = f"{self.routing.namespace}.{self.name}"
        return TargetSet(
            f"{base}_checkpoints",
            False,
            tuple(t.identifier for t in self.tables),
            None,
            f"{base}_ledger",
            dead or f"{base}_dead_letters",
            holder_rows="records routed",
        )

    def checkpoint_table(self) -> str:
        """Where the pipeline's position lives (``targets.holder``): the target table, or the checkpoint table when
        routing."""
        return self.targets.holder

    def ledger_table(self) -> str:
        """Every committed batch's ranges and counts (``targets.ledger``): beside the target table, or in
        ``routing.namespace`` for a routed pipeline (one ledger for the checkpoint and every target table)."""
        return self.targets.ledger

    def dead_letter_table(self) -> str:
        return self.targets.dead_letters

    def longest_batch_seconds(self) -> int:
        """Upper bound on a batch's life: plan, write, validate and commit, each with every retry."""
        a = self.airflow
        waits = sum(a.retry_delay(n).total_seconds() for n in range(1, a.retries + 1))  # doubling (Airflow 3.3)
        per_task = a.task_timeout_minutes * 60 * (a.retries + 1) + int(waits)
        return 4 * per_task

    def staging_dir(self) -> Any:
        """The staging area (``tidewater.staging``: a Path, or an ObjectPath on object storage)."""
        return self.stage(self.batch.staging_dir) if self.batch.staging_dir else home_dir() / "staging"

    def stage(self, location: Any, setting: str = "batch.staging_dir") -> Any:
        """A staged location named by text (a plan's path in XCom or on a command line) in this pipeline's
        staging area: a Path, or an ObjectPath reached with the staging file settings (errors name ``setting``)."""
        return locate(location, self.staging_file_properties(), setting)

    def staging_file_properties(self) -> dict[str, str]:
        """The file settings of the staging area and the Data Docs: the catalog's, then the connection
        ``batch.staging_conn_id``'s (resolved here, not at parse time), then ``batch.staging_properties``."""
        props = self.catalog_properties()
        if self.batch.staging_conn_id:
            from tidewater.config.connections import storage_connection

            props = {**props, **storage_connection(self.batch.staging_conn_id)}
        return {**props, **self.batch.staging_properties}

    def suite_path(self) -> Path | None:
        suite = self.table.suite or self.validation.suite
        if not suite:
            return None
        base = Path(self.source_path).parent if self.source_path else pipelines_dir()
        return (base / suite).resolve()
