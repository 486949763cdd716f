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
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tidewater.config.airflow_section import setting
from tidewater.config.formats import DEBEZIUM_FORMATS, FORMATS
from tidewater.config.targets import TargetSet
from tidewater.errors import ConfigError
from tidewater.staging import locate

if TYPE_CHECKING:
    from pyiceberg.table import Table


# The choices of the mode settings, one place each: the parser refuses any other value naming the setting and its
# choices (config/parse.py), the JSON Schema and the reference list them
KeyFormat = Literal["none", "string", "bytes"]
MetadataColumns = Literal["none", "prefixed", "struct"]
DeadLetterPolicy = Literal["dead_letter", "fail", "skip"]
TruncatePolicy = Literal["dead_letter", "apply"]
KeySource = Literal["value", "message_key"]
MultiTableCommit = Literal["auto", "never"]
Unmatched = Literal["dead_letter", "skip"]
NotNullPolicy = Literal["fail", "dead_letter"]
UniqueIds = Literal["none", "batch", "table"]
GateFailure = Literal["fail", "warn", "quarantine"]
CompactionStrategy = Literal["auto", "binpack", "sort", "zorder"]

PIPELINES_DIR_ENV = "TIDEWATER_PIPELINES_DIR"
HOME_ENV = "TIDEWATER_HOME"
# Set by read-only commands (`tidewater status`, ...): the embedded default catalog is not created when it is missing
READ_ONLY_ENV = "TIDEWATER_READ_ONLY"
KAFKA_CONFIG_ENV = "TIDEWATER_KAFKA_CONFIG"


def home_dir() -> Path:
    """The data directory for embedded defaults (catalog, warehouse, staging, repaired jars): ``$TIDEWATER_HOME``,
    else ``[tidewater] home`` of Airflow's configuration (``config/airflow_section.py``), else ``~/.tidewater``."""
    return Path(setting("home") or Path.home() / ".tidewater").expanduser().resolve()


def pipelines_dir() -> Path:
    """Where pipeline specifications live: ``$TIDEWATER_PIPELINES_DIR``, else ``[tidewater] pipelines_dir`` of
    Airflow's configuration (``config/airflow_section.py``), else ``include/pipelines`` beside the package."""
    where = setting("pipelines_dir")
    if where:
        return Path(where).expanduser().resolve()
    return Path(__file__).resolve().parents[2] / "pipelines"


def spark_app_path() -> Path:
    """The write step's spark-submit entry point: the one the package ships (``TIDEWATER_SPARK_APP``: another)."""
    env = os.environ.get("TIDEWATER_SPARK_APP")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / "runtime" / "spark_app" / "ingest_batch.py"


KEYED_OP = "_op"  # the operation column of upserts keyed by the message key (U, or D for a tombstone)


@dataclass(frozen=True)
class SchemaLimits:
    """What records may do to a table's schema (``table/limits.py`` checks chunks against them)."""

    max_new_columns: int  # fields (nested ones included) one write task may add to the table
    max_columns: int  # fields the table may have in all
    max_field_name_length: int  # characters in one field name


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
        "Fail a partition read (transient error naming the partition and position) when no progress is made for this long.",
        default=60.0,
    )
    start_from: str = _doc(
        "Where a partition without committed offsets starts (the pipeline's first batch, a partition a topic gains, "
        "a topic a `topic_pattern` picks up later): `earliest` (its log start) or a time in ISO 8601 "
        "(`2026-11-01T00:00:00Z`; without a zone, UTC): the first record whose timestamp is at or after it, the log "
        "end when there is none. Partitions with committed offsets continue from them. There is no `latest`: a "
        "pipeline's offsets live in its table, which a plan without records does not commit, so the log end would "
        "move with every plan until records came and what arrived in between would be skipped; give the time the "
        "pipeline goes live instead.",
        default="earliest",
    )


@dataclass(frozen=True)
class FormatSpec:
    """How record values are decoded."""

    value: str = _doc(
        "Value format: `json` (one JSON object per record, no schema; fields become columns), `connect_json` "
        "(Kafka Connect JsonConverter with schemas: the payload's fields, typed by the declared schema; Timestamp and "
        "Date logical types converted), `debezium` (change events, plain or Connect-enveloped: the `after` image, "
        "or `before` for deletes, plus an `_op` column c/u/d/r; tombstones are counted as skipped), `debezium_avro` "
        "(the same change events in Confluent-framed Avro through `registry_url`), `avro` (Confluent "
        "wire format, writer schema by id from `registry_url`; unknown ids are dead letters), `json_schema` (Confluent "
        "JSON Schema wire format: the columns are the registered schema's, by id from `registry_url`, with `date-time` "
        "and `date` formats typed and fields it does not name ignored; a record that breaks its schema is a dead letter "
        "`SchemaViolation` naming the path), `protobuf` (Confluent Protobuf wire format: the message type the message "
        "indexes pick in the schema registered by id, its imports fetched by their references; uint64 as decimal(20,0), "
        "enums as names, Timestamp as timestamptz, Duration as long microseconds, wrappers and proto3 `optional` null "
        "when absent, each oneof's fields plus a `<oneof>_case` column), `debezium_protobuf` (Debezium change events in "
        "that Protobuf wire format, applied as `debezium`), `string` (the "
        "value as one UTF-8 column `value`; invalid UTF-8 is a dead letter) or `bytes` (one binary column `value`).",
        default="json",
    )
    registry_url: str | None = _doc(
        "Schema registry URL (Confluent REST API) for `value: avro`, `debezium_avro`, `json_schema`, `protobuf` and "
        "`debezium_protobuf`, and for Avro message keys (`table.key_source: message_key`).",
        default=None,
    )
    registry_basic_auth: str | None = _doc("`user:password` for the schema registry (use `${ENV_VAR}`; never logged).", default=None)
    registry_settings: dict[str, str] = _doc(
        "More settings of confluent-kafka's schema registry client: TLS (`ssl.ca.location`, `ssl.certificate.location`, "
        "`ssl.key.location`), bearer auth (`bearer.auth.credentials.source`, `bearer.auth.token`, ...), `timeout`, "
        "`max.retries`. Secret values through `${ENV_VAR}`.",
        default_factory=dict,
    )
    registry_conn_id: str | None = _doc(
        "Airflow connection id holding the schema registry, instead of `registry_url` (served by Airflow's secrets "
        "backends): its host (with scheme and port) is the URL, its login and password the basic auth, and its "
        "extra JSON adds `registry_settings`. `registry_url`, `registry_basic_auth` and `registry_settings` set "
        "here win.",
        default=None,
    )
    message: str | None = _doc(
        "`protobuf`, `debezium_protobuf`: the message type to read (its full name, `shop.Order`) instead of the one "
        "each record's message indexes pick; a record whose schema has no such message is a dead letter "
        "`MessageIndexOutOfRange`.",
        default=None,
    )
    timestamps: dict[str, str] = _doc(
        "Columns parsed into UTC timestamps (a field inside an object as `a.b`), column -> format: a strftime pattern "
        "(`%Y-%m-%d %H:%M:%S`), `iso8601` (with or without a zone: `2024-02-29T12:23:03`, `...+01:00`, `...Z`), "
        "`epoch_millis` or `epoch_seconds`. A value that does not parse makes its record a dead letter.",
        default_factory=dict,
    )
    timezone: str = _doc("Time zone of date-times without a zone (IANA name, e.g. `Europe/Oslo`).", default="UTC")
    key: KeyFormat = _doc(
        "Message key as a column `_kafka_key`: `none` (default), `string` (UTF-8; invalid bytes replaced) or `bytes`.",
        default="none",
    )
    headers: bool = _doc("Message headers as a column `_kafka_headers` (map of string to bytes).", default=False)
    metadata: MetadataColumns = _doc(
        "Kafka metadata columns: `prefixed` (default: `_kafka_topic`, `_kafka_partition`, `_kafka_offset`, "
        "`_kafka_timestamp`), `struct` (one column `_kafka` with fields topic, partition, offset, timestamp) or "
        "`none`. Replay and backfills match rows to offsets through them, so they need `prefixed` or `struct`; "
        "they add about 10% to the data files of the pizza table (`make bench-metadata`, BENCHMARKS.md).",
        default="prefixed",
    )
    skip_control_events: bool = _doc(
        "`debezium` / `debezium_avro`: skip (count in `tidewater.skipped`) the connector's own events that a topic "
        "list or pattern picks up: schema-change events (`ddl`, `tableChanges`) and heartbeats (`ts_ms` alone). Off "
        "(default): each is a dead letter of class `SchemaChange` or `Heartbeat` that names the topic to leave out.",
        default=False,
    )
    flatten: bool = _doc(
        "Flatten nested objects into top-level columns (`a.b.c` -> `a_b_c`). Off: objects stay struct columns. "
        "`format.timestamps` and `table.partition_by` then name the flattened columns.",
        default=False,
    )
    flatten_separator: str = _doc("Joins the names of flattened fields (letters, digits, `_`).", default="_")
    allow_non_numeric_numbers: bool = _doc(
        "JSON formats: take `NaN`, `Infinity` and `-Infinity` (not JSON, but written by some producers, e.g. "
        "Python's json.dumps) as double values. Off (default): such a record is a dead letter (`InvalidJson`). "
        "Whatever this says, an integer outside the signed 64-bit range or a number too large for a double "
        "(`1e400`) is a dead letter (`NumberOutOfRange`): it would otherwise lose its digits silently.",
        default=False,
    )
    max_nesting_depth: int = _doc(
        "Deepest object/array nesting a record may have; deeper records are dead letters (class `TooDeep`) "
        "instead of exhausting the decoder's stack.",
        default=64,
    )
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

    policy: DeadLetterPolicy = _doc(
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
    auto_create: bool = _doc("Create the namespace and table when missing, with the schema inferred from the data.", default=True)
    evolve_schema: bool = _doc(
        "Add columns for new top-level or nested fields found in the data. When off, new fields are left out "
        "of the rows and reported (snapshot summary `tidewater.ignored-fields`, the write step's log).",
        default=True,
    )
    properties: dict[str, str] = _doc(
        "Iceberg table properties used when the table is auto-created (e.g. `write.target-file-size-bytes`). The "
        "writer honours `write.target-file-size-bytes` and the `write.parquet.*` codec, level, page and dictionary "
        "sizes; a column whose values are mostly distinct (more than half of a file's first 10,000) is written without "
        "a dictionary in that file.",
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
        "This table's great-expectations suite file (relative to the pipeline file); replaces `validation.suite` for this table.",
        default=None,
    )
    id_columns: list[str] = _doc(
        "Columns that identify a row. Set as the table's identifier fields (required columns) when it is "
        "auto-created; a record without a value for one is a dead letter (`MissingId`). A change table of a routed "
        "pipeline reading Debezium (`debezium`, `debezium_avro`, `debezium_protobuf`) may leave it empty: the fields of its records' "
        "message key (the source table's primary key, JSON with or without its schema, or Avro) become the table's "
        "identifier fields when it is created, and an existing table's identifier fields are its id columns.",
        default_factory=list,
    )
    upsert: bool = _doc(
        "Apply the records as changes to rows identified by `id_columns`, so the table equals its source: each "
        "record replaces the row with its key, and with `op_field` a delete removes it. Within a batch the changes "
        "to one key are applied in (partition, offset) order and the last wins; across batches in batch order "
        "(keys must be partitioned by key, as Debezium does; a key seen in two partitions of one batch is "
        "reported). Deletes are merge-on-read position delete files (never equality deletes). Needs `id_columns` "
        "and `format.metadata: prefixed`. Replays re-apply changes (`tidewater replay --mode reapply`). In a routed "
        "pipeline: per table under `tables` (one topic each), or as the `table` defaults with `routing.dynamic`. "
        "With `branch` the changes apply to the branch (`tidewater publish` fast-forwards main). With "
        "`validation.on_failure: quarantine` a refused batch's row delta waits on its quarantine branch, and so does "
        "the table's next batch (in a routed pipeline: the pipeline's next batch).",
        default=False,
    )
    op_field: str | None = _doc(
        "Column whose value says whether a record inserts, updates or deletes its row (Kafka Connect's "
        "`cdc-field`); setting it turns on `upsert`. With `format.value: debezium` (or `debezium_avro`, `debezium_protobuf`) and `upsert` "
        "it is `_op`.",
        default=None,
    )
    op_values: dict[str, str] = _doc(
        "What each value of `op_field` means: `insert`, `update`, `delete` or `truncate` (see `truncate`). An insert "
        "of an existing key is applied as an update (Debezium's snapshot reads `r` are inserts), a delete of an absent "
        "key is a no-op (counted). A value not listed here makes the record a dead letter (`UnknownOp`).",
        default_factory=lambda: {
            "I": "insert",
            "c": "insert",
            "r": "insert",
            "U": "update",
            "u": "update",
            "D": "delete",
            "d": "delete",
            "t": "truncate",
        },
    )
    truncate: TruncatePolicy = _doc(
        "What a truncate of the source table (Debezium's `op: t`, or an `op_values` entry meaning `truncate`) does: "
        "`dead_letter` (default: the record is a dead letter, class `Truncate`, and no row is removed, so nothing is "
        "lost silently) or `apply` (change tables: every row committed before the batch and every change of the "
        "batch before it in its partition is removed; changes in other partitions of the same batch are applied "
        "after it, as their order against it is not known). An append table always dead-letters them.",
        default="dead_letter",
    )
    key_source: KeySource = _doc(
        "Where a change's key (`id_columns`) comes from: `value` (its fields) or `message_key` (the Kafka message "
        "key: a JSON object with the id columns, a Confluent-framed Avro record through `format.registry_url`, or a "
        "JSON scalar or plain string for a single id column). With "
        "`message_key` a tombstone (null value) deletes its key, and the key's values replace the value's. In a "
        "routed pipeline the table must take its one topic alone (a `tables` entry listing it, or tables named by "
        "their topic with `routing.dynamic`).",
        default="value",
    )
    branch: str | None = _doc(
        "Commit to this branch instead of `main` (created by the first commit). The committed offsets are "
        "read from the same branch; `tidewater publish` fast-forwards main to it (write-audit-publish).",
        default=None,
    )
    max_new_columns: int = _doc(
        "Most fields (nested ones included) one write task may add to an existing table. Records that would add "
        "more are dead letters (`TooManyColumns`), the record adding the most first; the rest of the chunk lands.",
        default=100,
    )
    max_columns: int = _doc(
        "Most fields (nested ones included) the table may have, also when records create it. Records beyond it "
        "are dead letters (`TooManyColumns`).",
        default=1000,
    )
    max_field_name_length: int = _doc(
        "Longest field name (characters) a record may add; records with a longer one are dead letters "
        "(`FieldNameTooLong`). Existing columns are not affected.",
        default=255,
    )

    def limits(self) -> SchemaLimits:
        return SchemaLimits(self.max_new_columns, self.max_columns, self.max_field_name_length)


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

    field: str | None = _doc(
        "Route field: a dotted path into the record value (`meta.type`). Required for static "
        "`route_regex` entries and for a `table_template` with `{value}`.",
        default=None,
    )
    dynamic: bool = _doc(
        "The record names its table: `table_template` filled with the route field's value and/or the record's "
        "topic; names are checked (letters, digits, `_`; at most 255 characters); tables are auto-created with the "
        "`table` settings (an entry in `tables` overrides them for one table) when `table.auto_create` is on, "
        "otherwise their records are dead letters (`UnknownTable`). With `table.upsert` / `op_field` every such "
        "table is a change table (one topic each: a change table fed by two topics in one batch is refused).",
        default=False,
    )
    table_template: str = _doc(
        "Dynamic table name. Placeholders: `{value}` (the route field's value, one name part: letters, digits, `_`; "
        "never in the namespace), `{topic}` (the record's topic) and `{topic[N]}` (the N-th dot-separated part of the "
        "topic's name from 0, negative from the end); in topic parts other characters become `_`. E.g. "
        "`payments_{value}`, `ns.{value}`, or `{topic[-1]}` for Debezium's `<server>.<schema>.<table>` topics "
        "(`{topic[1]}.{topic[2]}` puts each schema in its own namespace). With a Debezium format, "
        "`{source.<field>}` is a field of the change event's `source` block (`{source.schema}_{source.table}`: "
        "the source table even when a topic carries several, as after Debezium's topic routing), one name part "
        "like `{value}` and never in the namespace. Without a namespace the table goes to `routing.namespace`.",
        default="{value}",
    )
    namespace: str | None = _doc(
        "Namespace of the pipeline's own tables (`<name>_checkpoints`: one row and the committed offsets per "
        "batch; `<name>_dead_letters`) and of dynamic tables without one. Required when routing.",
        default=None,
    )
    unmatched: Unmatched = _doc(
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
    conn_id: str | None = _doc(
        "Airflow connection id holding the catalog, so that Airflow's secrets backends serve its credentials: a "
        "`postgres`/`mysql`/`sqlite` connection is a SQL catalog, an `http`/`https` one a REST catalog (login and "
        "password as its OAuth2 `credential`, a password alone as its `token`), an `aws` one a Glue catalog; the "
        "connection's extra JSON adds properties (`warehouse`, `s3.*`, ...). `properties` set here win.",
        default=None,
    )
    case_sensitive: bool = _doc(
        "Whether the catalog tells table names apart by case. Off (default, the strictest common rule: Hive, Glue "
        "and Spark fold names to lower case, a SQL catalog on MySQL compares them without case): a dynamic route "
        "value is folded to lower case before it names a table, and a name that differs from the pipeline's "
        "checkpoint or dead-letter table only by case is refused, so no record can reach a protected or another "
        "pipeline's table by its spelling. On: route values keep their case (`VT` and `vt` name two tables).",
        default=False,
    )
    multi_table_commit: MultiTableCommit = _doc(
        "How a routed batch commits its tables. `auto`: in one catalog transaction where the catalog offers the "
        "Iceberg REST spec's multi-table commit (`POST /v1/{prefix}/transactions/commit` among the endpoints its "
        "`/v1/config` lists): every table's change and the checkpoint land together or not at all; elsewhere one "
        "table after another with the checkpoint last (a batch cut short is finished by the retried commit step or "
        "re-planned from the checkpoint). `never`: one after another on every catalog.",
        default="auto",
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
    chunk_records: int = _doc("Records decoded and written at a time inside one Spark task (bounds memory per task).", default=50_000)
    pack_ranges: bool = _doc(
        "Short partition ranges are read by one Spark task together, which writes their rows into the same data "
        "files: a batch's files grow with its data, not with the topic's partitions. A task reads at most "
        "`records_per_task` records, and no more than the batch's records shared over `write_parallelism` tasks. "
        "Ingest batches only (replays read one range a task); which rows and offsets a batch commits is the same "
        "either way.",
        default=True,
    )
    write_parallelism: int = _doc(
        "How many tasks packing spreads a batch over at least (when it has as many ranges). 0: Spark's default "
        "parallelism (the cores Spark has); through Spark Connect the server's `spark.default.parallelism`, or this "
        "machine's cores when it is unset; the inline write (no Spark), this machine's cores.",
        default=0,
    )
    staging_dir: str | None = _doc(
        "Where each batch's steps leave what the next step reads (plan, manifest, error, quality verdict, "
        "replay and skip records), under `<dir>/<pipeline>/<batch id>/`: a local path (or `file://`) that every "
        "host running a step shares, or object storage (`s3://bucket/prefix`, `gs://`, `abfs://`) when they "
        "share no disk, read and written with the catalog's file settings (`s3.*`, `gcs.*`, `adls.*`, overridden "
        "by `staging_properties`). Default: `$TIDEWATER_HOME/staging`.",
        default=None,
    )
    staging_properties: dict[str, str] = _doc(
        "File-layer settings for an object-storage `staging_dir` that differ from the catalog's (pyiceberg FileIO "
        "keys such as `s3.endpoint`, `s3.access-key-id`, `s3.secret-access-key`, `s3.region`). Secret values "
        "through `${ENV_VAR}`.",
        default_factory=dict,
    )
    staging_conn_id: str | None = _doc(
        "Airflow connection id holding the object storage credentials of `staging_dir` and `validation."
        "data_docs_dir` (served by Airflow's secrets backends): an `aws` connection's login and password as the "
        "access key, its extra's `endpoint_url`, `region_name` and `aws_session_token` as `s3.endpoint`, `s3.region` "
        "and `s3.session-token`, and any extra key with a dot (`s3.*`, `gcs.*`, `adls.*`) as it is. Over the "
        "catalog's file settings; `staging_properties` win.",
        default=None,
    )


@dataclass(frozen=True)
class ValidationSpec:
    """The data-quality gate that runs on a staged batch before it is committed."""

    not_null: list[str] = _doc("Columns that must be non-null in every row of the batch.", default_factory=list)
    not_null_policy: NotNullPolicy = _doc(
        "What a null (or missing) value in a `not_null` column does: `fail` fails the quality gate (nothing is "
        "committed, and every retry fails the same way until the data is dealt with); `dead_letter` sets the "
        "record apart as a dead letter (`NullInRequiredColumn`, naming the column) while the write step runs, "
        "and the rest of the batch lands.",
        default="fail",
    )
    suite: str | None = _doc(
        'A great-expectations suite file (JSON, `{"expectations": [{"type": ..., "kwargs": {...}}]}`), '
        "relative to the pipeline file, whose expectations are added to the built-in ones. Row-wise "
        "expectations (`expect_column_values_to_*`, column pairs) run chunk by chunk; whole-column ones "
        "(uniqueness, means, ...) read their columns for the whole batch.",
        default=None,
    )
    chunk_rows: int = _doc(
        "Rows of the checked columns held in memory at a time while validating (bounds the gate's memory).",
        default=500_000,
    )
    unique_ids: UniqueIds = _doc(
        "Uniqueness of the table's `id_columns`: `none`, `batch` (no two rows of the batch share an id) or "
        "`table` (also none of the batch's ids is already in the table; reads the table's id columns for "
        "the batch's ids).",
        default="none",
    )
    data_docs_dir: str | None = _doc(
        "Where each pipeline's great-expectations file data context lives (`<dir>/<pipeline>/gx/`: the batches' "
        "validation results and their Data Docs site, `gx/uncommitted/data_docs/local_site/`; the Tidewater view "
        "serves it). A path the Airflow workers and the api-server share, or object storage (`s3://bucket/prefix`, "
        "`gs://`, `abfs://`, with the staging file settings) when they share no disk: each page is rendered in a "
        "private copy of the project and copied back. Default: `$TIDEWATER_HOME/data-docs`.",
        default=None,
    )
    on_failure: GateFailure = _doc(
        "`fail`: a failing expectation stops the batch (nothing committed, offsets unchanged); `warn`: the batch "
        "is committed and the failure is logged and recorded in the snapshot summary (`tidewater.validation`); "
        "`quarantine`: the batch's files are committed to a branch `quarantine-<batch id>` of the table, main gets "
        "an empty snapshot that advances the offsets (main stays clean), the run fails with the report, and a "
        "person publishes or drops it (`tidewater quarantine publish|drop`); a change table's next batch waits for "
        "that decision (changes apply in order). In a routed pipeline each target table is judged on its own: only "
        "those that fail are quarantined (`--table T` names one), the others commit. The accounting checks (row "
        "count, read = rows + dead letters + skipped) always fail the batch.",
        default="fail",
    )


@dataclass(frozen=True)
class SparkSpec:
    """How the write step's Spark job is submitted."""

    master: str = _doc("Spark master for `tidewater run` (the DAG uses the Airflow connection).", default="local[*]")
    conn_id: str = _doc("Airflow Spark connection used by the ingest DAG's SparkSubmitOperator.", default="tidewater_spark")
    conf: dict[str, str] = _doc("Extra Spark configuration passed to spark-submit.", default_factory=dict)
    python_env: str | None = _doc(
        "A packed Python environment for executors whose machines lack the project's packages (`make executor-env` "
        "builds `.data/executor-env.tar.gz`; a path or a URI the cluster can read: hdfs://, s3a://, https://). "
        "Shipped with `spark.archives` and used as the executors' Python; the driver keeps its own. Unset: "
        "executors use the Python of their machine (`spark.pyspark.python`), which then needs the packages.",
        default=None,
    )
    iceberg_packages: str | None = _doc(
        "Maven coordinates for the Iceberg Spark runtime (production). Unset: the bundled offline jar is repaired and used.",
        default=None,
    )
    kubernetes_secret: str | None = _doc(
        "Cluster deploy mode on Kubernetes (`k8s://` master, `deploy-mode: cluster` in the Spark connection's extra): "
        "the name of a Kubernetes secret, in the driver's namespace, from which the driver pod takes the settings "
        "resolved from Airflow connections (`kafka.conn_id`, `catalog.conn_id`, `format.registry_conn_id`, "
        "`batch.staging_conn_id`). One key per setting, named as its variable (`TIDEWATER_KAFKA_CONFIG`, "
        "`TIDEWATER_CATALOG_CONFIG`, `TIDEWATER_REGISTRY_CONFIG`, `TIDEWATER_STORAGE_CONFIG`); "
        "`tidewater connections --pipeline FILE --output DIR` writes them for `kubectl create secret generic NAME "
        "--from-file=DIR`. The generated Spark configuration holds only references "
        "(`spark.kubernetes.driver.secretKeyRef.*`), never the values. Unset: such a pipeline is refused in cluster "
        "mode on Kubernetes (in client mode the driver gets them in spark-submit's environment).",
        default=None,
    )
    connect_url: str | None = _doc(
        "A long-running Spark Connect server (`sc://host:15002`) for the write step: the batch's tasks run "
        "there through the DataFrame API (`mapInArrow`), submitted from `tidewater run` or the DAG's write "
        "task, with no spark-submit and no JVM start per batch. The server's Python workers need the "
        "project's packages, like executors. Unset (default): one spark-submit per batch.",
        default=None,
    )


MAX_RETRY_DELAY = timedelta(hours=1)
"""The longest wait between two tries of a transient failure, however many retries a pipeline allows."""


def doubled_delay(base: timedelta, try_number: int) -> timedelta:
    """``base`` doubled at each try after the first, at most :data:`MAX_RETRY_DELAY` (or ``base``, if longer): the wait
    after try ``try_number`` (1-based) failed. Airflow 3.3's retry policy of the pipeline's tasks waits this long
    (runtime/retries.py), and the longest possible batch counts it."""
    return min(base * (2 ** max(try_number - 1, 0)), max(MAX_RETRY_DELAY, base))


# The DAGs a pipeline may go without (``airflow.dags``); every pipeline has its ingest DAG
OPTIONAL_DAGS = ("replay", "skip", "retry_dead_letters", "audit", "maintain")
# Every kind of DAG a pipeline file makes, the one list (``PipelineSpec.dag_ids``, the DAG builders, a task's parse):
# its ingest DAG, the optional ones, the quarantine DAG (under the quarantine policy), and for a file that does not
# load, ``ingest_invalid_<file stem>``
INVALID_DAG_KIND = "ingest_invalid"
DAG_KINDS = ("ingest", *OPTIONAL_DAGS, "quarantine", INVALID_DAG_KIND)


def catalog_type(props: dict[str, str]) -> str:
    """The type of the catalog these pyiceberg properties open: ``type``, else ``rest`` for an http(s) ``uri`` (as
    pyiceberg infers it), else ``sql``."""
    return props.get("type") or ("rest" if str(props.get("uri", "")).startswith("http") else "sql")


@dataclass(frozen=True)
class StepSpec:
    """Where one step of a batch runs: its executor queue and pool, and on the KubernetesExecutor its pod."""

    queue: str | None = _doc(
        "The executor queue of this step's tasks (Celery: the workers that serve it). Unset: `airflow.queue`.", default=None
    )
    pool: str | None = _doc("The Airflow pool of this step's tasks. Unset: `airflow.pool`.", default=None)
    image: str | None = _doc(
        "KubernetesExecutor: the image of this step's pod (for example one with Java and Spark "
        "for `write` only). Unset: the executor's pod template.",
        default=None,
    )
    requests: dict[str, str] = _doc(
        "KubernetesExecutor: resource requests of this step's pod (`cpu: '2'`, `memory: 4Gi`).", default_factory=dict
    )
    limits: dict[str, str] = _doc("KubernetesExecutor: resource limits of this step's pod.", default_factory=dict)
    env_from_secrets: list[str] = _doc(
        "KubernetesExecutor: Kubernetes secrets whose keys become this step's environment variables (`envFrom`; "
        "for example the `${ENV}` values of the pipeline file).",
        default_factory=list,
    )
    node_selector: dict[str, str] = _doc("KubernetesExecutor: node labels this step's pod must run on.", default_factory=dict)
    service_account: str | None = _doc("KubernetesExecutor: the service account of this step's pod.", default=None)

    def pod_settings(self) -> bool:
        """Whether this step overrides anything of the pod (any field but its queue and pool)."""
        return any(getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("queue", "pool"))


@dataclass(frozen=True)
class StepsSpec:
    """Per step of a batch (the ingest and replay DAGs' plan, write, validate and commit tasks; the Data Docs task
    follows validate): its queue, pool and Kubernetes pod, so that the write step's pod can differ from the light
    ones."""

    plan: StepSpec = _doc("The plan task.", default_factory=StepSpec)
    write: StepSpec = _doc("The write task (spark-submit or Spark Connect).", default_factory=StepSpec)
    validate: StepSpec = _doc("The validate task and the Data Docs task.", default_factory=StepSpec)
    commit: StepSpec = _doc("The commit task.", default_factory=StepSpec)


@dataclass(frozen=True)
class AirflowSpec:
    """DAG settings."""

    retries: int = _doc(
        "Task retries. On Airflow 3.3 and later only errors worth retrying (an unreachable broker or catalog, a commit "
        "conflict) use them: an error retrying cannot help (a bad setting, a refused schema) fails the task at once, "
        "and other failures keep Airflow's default retries.",
        default=2,
    )
    retry_delay_seconds: int = _doc(
        "Delay before the first retry. On Airflow 3.3 and later an error worth retrying waits this long, doubled at each "
        "further try, at most an hour.",
        default=60,
    )
    owner: str = _doc("DAG owner shown in the UI.", default="tidewater")
    tags: list[str] = _doc("Extra DAG tags (`tidewater` and `ingest` are always set).", default_factory=list)
    task_timeout_minutes: int = _doc(
        "Execution timeout of each ingest task. With retries it bounds the longest possible batch, which "
        "`maintenance.remove_orphan_files.older_than_hours` may never undercut.",
        default=60,
    )
    freshness: str | None = _doc(
        "A promise of freshness, as a deadline on each ingest run (Airflow 3.1+ deadline alerts, which Airflow marks "
        "experimental): a run still unfinished this long after it was queued (`90s`, `15m`, `2h`, `1d`) calls "
        "`airflow.on_late`, once per run. It catches a batch that is slow or stuck; a pipeline whose runs are not "
        "queued at all (paused, scheduler down) is caught by the lag trigger or the audit DAG instead (docs: From "
        "the Airflow UI). Unset: no deadline.",
        default=None,
    )
    dag_id_prefix: str = _doc(
        "Put before every DAG id of the pipeline (`team_a_` gives `team_a_ingest_orders`, `team_a_replay_orders`, ...), "
        "for a shared Airflow where another team's DAG may have the name. Letters, digits, `_`, `-` and `.` only. A "
        "task's parse still builds only its own pipeline's DAGs when the file is named after the pipeline.",
        default="",
    )
    dags: list[str] = _doc(
        "Which optional DAGs the pipeline gets beside its ingest DAG: any of `replay`, `skip`, `retry_dead_letters`, "
        "`audit`, `maintain` (default: all). The quarantine DAG comes with `validation.on_failure: quarantine`. The "
        "Tidewater view leaves out the links and buttons of DAGs a pipeline does not have.",
        default_factory=lambda: list(OPTIONAL_DAGS),
    )
    pool: str | None = _doc(
        "The Airflow pool every task of the pipeline's DAGs runs in (create it in Airflow: Admin > Pools), to bound how "
        "many Tidewater tasks a shared Airflow runs at once. Unset: Airflow's `default_pool`.",
        default=None,
    )
    queue: str | None = _doc(
        "The executor queue of every task (the Celery executor's queues, for example workers that have Java and "
        "Spark). Unset: the executor's default queue.",
        default=None,
    )
    shared_paths: list[str] = _doc(
        "Local folders that every host running the pipeline's tasks mounts at the same path (an NFS or CSI volume). "
        "Under an executor that runs tasks on several hosts (Celery, Kubernetes, Edge) a local warehouse, "
        "`batch.staging_dir` or `validation.data_docs_dir` is refused unless it lies under one of these; a SQLite "
        "catalog is refused even there. Unset: none (object storage only).",
        default_factory=list,
    )
    steps: StepsSpec = _doc("Per step of a batch: queue, pool and Kubernetes pod (see `airflow.steps.*` below).", default_factory=StepsSpec)
    on_failure: str | None = _doc(
        "What a failed task calls (Airflow's `on_failure_callback` on every task of the pipeline's DAGs): the dotted "
        "path of a callable, given Airflow's task context, or of an Airflow notifier class (made without arguments). "
        "It is imported when the DAG file is parsed, so the DAG processor and the workers must be able to import it; "
        "a path that does not import shows the pipeline as its failing `ingest_invalid_<file>` DAG naming this "
        "setting. Unset: none.",
        default=None,
    )
    on_late: str | None = _doc(
        "What a missed `airflow.freshness` deadline calls: the dotted path of a callable, or of an Airflow notifier "
        "class (made without arguments), given one dict (`pipeline`, `freshness`, `message`, `dag_run`, "
        "`deadline`). It runs in Airflow's triggerer, which must be able to import it. Always, before it: a warning in "
        "the triggerer's log and the metric `tidewater.<name>.late`.",
        default=None,
    )

    def freshness_interval(self) -> timedelta | None:
        """``freshness`` as a duration (None when unset); a ConfigError naming the setting when it is not one."""
        if self.freshness is None:
            return None
        m = re.fullmatch(r"\s*(\d+)\s*([smhd])\s*", str(self.freshness))
        if not m or int(m.group(1)) == 0:
            raise ConfigError(f"airflow.freshness: {self.freshness!r} is not a duration such as 90s, 15m, 2h or 1d")
        return timedelta(seconds=int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)])

    def dag_kwargs(self, kind: str) -> dict[str, Any]:
        """Arguments every DAG of the pipeline shares (``kind``: ingest, replay, quarantine, maintenance)."""
        return {
            "start_date": datetime(2024, 1, 1, tzinfo=timezone.utc),
            "catchup": False,
            "max_active_runs": 1,
            "tags": sorted({"tidewater", kind, *self.tags}),
            "default_args": self.default_args(),
        }

    def retry_delay(self, try_number: int) -> timedelta:
        """The wait before the next try after try ``try_number`` (1-based) failed with an error worth retrying
        (:func:`doubled_delay` of ``retry_delay_seconds``)."""
        return doubled_delay(timedelta(seconds=self.retry_delay_seconds), try_number)

    def default_args(self) -> dict[str, Any]:
        """Airflow ``default_args`` shared by the pipeline's DAGs."""
        placement = {k: v for k, v in (("pool", self.pool), ("queue", self.queue)) if v}
        return {
            "owner": self.owner,
            "retries": self.retries,
            "retry_delay": timedelta(seconds=self.retry_delay_seconds),
            "execution_timeout": timedelta(minutes=self.task_timeout_minutes),
            **placement,
        }


@dataclass(frozen=True)
class CompactionSpec:
    """Rewrite data files (Spark `rewrite_data_files`): small files into files near the target size."""

    enabled: bool = _doc("Run this task.", default=True)
    strategy: CompactionStrategy = _doc(
        "`auto` (sort when the table has a sort order, else bin-pack), `binpack`, `sort`, or `zorder`.",
        default="auto",
    )
    zorder_columns: list[str] = _doc("Columns for `strategy: zorder`.", default_factory=list)
    target_file_size_bytes: int | None = _doc(
        "Target size of rewritten files. Default: the table's `write.target-file-size-bytes`.", default=None
    )
    min_input_files: int = _doc("A file group is rewritten only when it has at least this many files.", default=5)
    partial_progress: bool = _doc("Commit file groups as they finish (big tables make progress even if the task dies).", default=True)
    partial_progress_max_commits: int = _doc("Most commits one run makes with partial progress.", default=10)
    delete_ratio_threshold: float = _doc(
        "Change tables: a data file whose deleted rows reach this share of its rows is rewritten without them, "
        "whatever its size (Iceberg's `delete-ratio-threshold`).",
        default=0.3,
    )
    delete_file_threshold: int = _doc(
        "Change tables: a data file with at least this many position delete files is rewritten without the "
        "deleted rows (Iceberg's `delete-file-threshold`).",
        default=3,
    )


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
    rewrite_position_deletes: bool = _doc(
        "Change tables: merge small position delete files and drop those whose rows are gone (Spark "
        "`rewrite_position_delete_files`). Skipped on tables without delete files.",
        default=True,
    )
    rewrite_manifests: bool = _doc("Rewrite manifests (Spark `rewrite_manifests`).", default=True)
    expire_snapshots: ExpirySpec = _doc("Snapshot expiry.", default_factory=ExpirySpec)
    remove_orphan_files: OrphanSpec = _doc("Orphan file removal.", default_factory=OrphanSpec)

    def enabled_actions(self, applies_changes: bool) -> list[str]:
        """The actions the maintenance DAG and `tidewater maintain` run, in order (position delete files are
        rewritten on change tables only)."""
        on = {
            "rewrite_data_files": self.rewrite_data_files.enabled,
            "rewrite_position_delete_files": self.rewrite_position_deletes and applies_changes,
            "rewrite_manifests": self.rewrite_manifests,
            "expire_snapshots": self.expire_snapshots.enabled,
            "remove_orphan_files": self.remove_orphan_files.enabled,
        }
        return [a for a in MAINTENANCE_ACTIONS if on[a]]


MAINTENANCE_ACTIONS = (
    "rewrite_data_files",
    "rewrite_position_delete_files",
    "rewrite_manifests",
    "expire_snapshots",
    "remove_orphan_files",
)


@dataclass(frozen=True)
class TriggerSpec:
    """Batches started by the amount of pending data, besides the schedule (checked by Airflow's triggerer,
    without Spark). Any threshold set turns it on; a batch starts when one is exceeded."""

    pending_records: int | None = _doc("Start a batch when more records than this wait in Kafka (all partitions).", default=None)
    pending_bytes: int | None = _doc(
        "Start a batch when the pending records weigh more than this, estimated from the size of the first pending "
        "record of each partition.",
        default=None,
    )
    max_age_seconds: float | None = _doc(
        "Start a batch when the oldest pending record (its Kafka timestamp) is older than this.", default=None
    )
    poll_seconds: float = _doc("How often the triggerer checks (reads offsets and at most one record per partition).", default=30.0)

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.pending_records, self.pending_bytes, self.max_age_seconds))


@dataclass(frozen=True)
class AuditSpec:
    """The `audit_<name>` DAG (`tidewater audit` by hand)."""

    schedule: str | None = _doc(
        "Airflow schedule of the audit DAG, which fails on a discrepancy. `null`: triggered only.", default="@daily"
    )
    deep: bool = _doc(
        "Also check every row's source offset (`tidewater audit --deep`; needs `format.metadata`): reads "
        "the table's offset columns and the dead letters.",
        default=False,
    )
    full: bool = _doc(
        "Check every batch in the ledger on each run (`tidewater audit --full`). By default a run checks "
        "the batches committed since the last clean audit (a deep run: since the last clean deep audit), "
        "and Kafka, the dead letters and the writes outside Tidewater whole.",
        default=False,
    )


@dataclass(frozen=True)
class PipelineSpec:
    """One pipeline: Kafka topics into one Iceberg table."""

    name: str = _doc("Pipeline name: lower-case letters, digits and `_`. The DAG id is `ingest_<name>`.", default="")
    topics: list[str] = _doc("Kafka topics to ingest. `topics`, `topic_pattern` or both: at least one is required.", default_factory=list)
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
    audit: AuditSpec = _doc("Reconciliation of the table against its topic.", default_factory=AuditSpec)
    trigger: TriggerSpec = _doc("Batches started by pending data (lag), besides `schedule`.", default_factory=TriggerSpec)
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
            tspec = dataclasses.replace(tspec, id_columns=[schema.find_column_name(i) for i in schema.identifier_field_ids])
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
