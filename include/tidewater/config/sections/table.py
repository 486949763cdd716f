"""The table side of a pipeline file: ``table`` (the Iceberg table and how records become its rows) and
``routing`` (records sent to several tables)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tidewater.config.sections import doc

if TYPE_CHECKING:
    pass

# The choices of this section's mode settings, one place each: the parser refuses any other value naming the
# setting and its choices (config/parse.py), the JSON Schema and the reference list them
TruncatePolicy = Literal["dead_letter", "apply"]
KeySource = Literal["value", "message_key"]
Unmatched = Literal["dead_letter", "skip"]


KEYED_OP = "_op"  # the operation column of upserts keyed by the message key (U, or D for a tombstone)


@dataclass(frozen=True)
class SchemaLimits:
    """What records may do to a table's schema (``table/limits.py`` checks chunks against them)."""

    max_new_columns: int  # fields (nested ones included) one write task may add to the table
    max_columns: int  # fields the table may have in all
    max_field_name_length: int  # characters in one field name


@dataclass(frozen=True)
class TableSpec:
    """The target Iceberg table."""

    identifier: str = doc("Table identifier `namespace.name` (nested namespaces allowed: `a.b.name`).", default="")
    auto_create: bool = doc("Create the namespace and table when missing, with the schema inferred from the data.", default=True)
    evolve_schema: bool = doc(
        "Add columns for new top-level or nested fields found in the data. When off, new fields are left out "
        "of the rows and reported (snapshot summary `tidewater.ignored-fields`, the write step's log).",
        default=True,
    )
    properties: dict[str, str] = doc(
        "Iceberg table properties used when the table is auto-created (e.g. `write.target-file-size-bytes`). The "
        "writer honours `write.target-file-size-bytes` and the `write.parquet.*` codec, level, page and dictionary "
        "sizes; a column whose values are mostly distinct (more than half of a file's first 10,000) is written without "
        "a dictionary in that file.",
        default_factory=dict,
    )
    case_insensitive: bool = doc(
        "Match record field names to the table's columns ignoring case (`OrderId` fills `orderid`). Field names are "
        "always matched through the table's name mapping (`schema.name-mapping.default` aliases) too. New fields "
        "keep their spelling.",
        default=False,
    )
    partition_by: list[str] = doc(
        "Partition spec used when the table is auto-created, one entry per field: `col` (identity), `year(col)`, "
        "`month(col)`, `day(col)`, `hour(col)`, `bucket(N, col)`, `truncate(W, col)`; nested columns as `a.b`. "
        "An existing table keeps its own spec (the writer follows whatever spec the table has). Each Spark task "
        "keeps one open file per partition it sees.",
        default_factory=list,
    )
    sort_by: list[str] = doc(
        "Sort order set when the table is auto-created: `col [asc|desc] [nulls first|nulls last]` per entry. "
        "Ingest files are written unsorted (marked so); `maintenance.rewrite_data_files.strategy: auto` sorts.",
        default_factory=list,
    )
    suite: str | None = doc(
        "This table's great-expectations suite file (relative to the pipeline file); replaces `validation.suite` for this table.",
        default=None,
    )
    id_columns: list[str] = doc(
        "Columns that identify a row. Set as the table's identifier fields (required columns) when it is "
        "auto-created; a record without a value for one is a dead letter (`MissingId`). A change table of a routed "
        "pipeline reading Debezium (`debezium`, `debezium_avro`, `debezium_protobuf`) may leave it empty: the fields of its records' "
        "message key (the source table's primary key, JSON with or without its schema, or Avro) become the table's "
        "identifier fields when it is created, and an existing table's identifier fields are its id columns.",
        default_factory=list,
    )
    upsert: bool = doc(
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
    op_field: str | None = doc(
        "Column whose value says whether a record inserts, updates or deletes its row (Kafka Connect's "
        "`cdc-field`); setting it turns on `upsert`. With `format.value: debezium` (or `debezium_avro`, `debezium_protobuf`) and `upsert` "
        "it is `_op`.",
        default=None,
    )
    op_values: dict[str, str] = doc(
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
    truncate: TruncatePolicy = doc(
        "What a truncate of the source table (Debezium's `op: t`, or an `op_values` entry meaning `truncate`) does: "
        "`dead_letter` (default: the record is a dead letter, class `Truncate`, and no row is removed, so nothing is "
        "lost silently) or `apply` (change tables: every row committed before the batch and every change of the "
        "batch before it in its partition is removed; changes in other partitions of the same batch are applied "
        "after it, as their order against it is not known). An append table always dead-letters them.",
        default="dead_letter",
    )
    key_source: KeySource = doc(
        "Where a change's key (`id_columns`) comes from: `value` (its fields) or `message_key` (the Kafka message "
        "key: a JSON object with the id columns, a Confluent-framed Avro record through `format.registry_url`, or a "
        "JSON scalar or plain string for a single id column). With "
        "`message_key` a tombstone (null value) deletes its key, and the key's values replace the value's. In a "
        "routed pipeline the table must take its one topic alone (a `tables` entry listing it, or tables named by "
        "their topic with `routing.dynamic`).",
        default="value",
    )
    branch: str | None = doc(
        "Commit to this branch instead of `main` (created by the first commit). The committed offsets are "
        "read from the same branch; `tidewater publish` fast-forwards main to it (write-audit-publish).",
        default=None,
    )
    max_new_columns: int = doc(
        "Most fields (nested ones included) one write task may add to an existing table. Records that would add "
        "more are dead letters (`TooManyColumns`), the record adding the most first; the rest of the chunk lands.",
        default=100,
    )
    max_columns: int = doc(
        "Most fields (nested ones included) the table may have, also when records create it. Records beyond it "
        "are dead letters (`TooManyColumns`).",
        default=1000,
    )
    max_field_name_length: int = doc(
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

    topics: list[str] = doc(
        "Records of these topics go to this table (empty: records of every topic). Many tables may share a "
        "topic, and many topics may feed one table.",
        default_factory=list,
    )
    route_regex: str | None = doc(
        "Static routing: the record's `routing.field` value must fully match this regular expression. A "
        "record can match several tables and goes to each.",
        default=None,
    )


@dataclass(frozen=True)
class RoutingSpec:
    """How a pipeline with several target tables routes records (with `tables:` or `routing.dynamic`)."""

    field: str | None = doc(
        "Route field: a dotted path into the record value (`meta.type`). Required for static "
        "`route_regex` entries and for a `table_template` with `{value}`.",
        default=None,
    )
    dynamic: bool = doc(
        "The record names its table: `table_template` filled with the route field's value and/or the record's "
        "topic; names are checked (letters, digits, `_`; at most 255 characters); tables are auto-created with the "
        "`table` settings (an entry in `tables` overrides them for one table) when `table.auto_create` is on, "
        "otherwise their records are dead letters (`UnknownTable`). With `table.upsert` / `op_field` every such "
        "table is a change table (one topic each: a change table fed by two topics in one batch is refused).",
        default=False,
    )
    table_template: str = doc(
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
    namespace: str | None = doc(
        "Namespace of the pipeline's own tables (`<name>_checkpoints`: one row and the committed offsets per "
        "batch; `<name>_dead_letters`) and of dynamic tables without one. Required when routing.",
        default=None,
    )
    unmatched: Unmatched = doc(
        "Records that go to no table (no entry matches, route field missing): `dead_letter` (error class "
        "`Unrouted`) or `skip` (counted in `tidewater.skipped`).",
        default="dead_letter",
    )
