"""The Kafka side of a pipeline file: ``kafka`` (how to reach it), ``format`` (how records are read) and
``dead_letter`` (where records that cannot be landed go)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tidewater.config.sections import doc

if TYPE_CHECKING:
    pass

# The choices of this section's mode settings, one place each: the parser refuses any other value naming the
# setting and its choices (config/parse.py), the JSON Schema and the reference list them
KeyFormat = Literal["none", "string", "bytes"]
MetadataColumns = Literal["none", "prefixed", "struct"]
DeadLetterPolicy = Literal["dead_letter", "fail", "skip"]


@dataclass(frozen=True)
class KafkaSpec:
    """How to reach Kafka. Either ``conn_id`` or ``bootstrap_servers``."""

    bootstrap_servers: str | None = doc(
        "Comma-separated host:port list (librdkafka `bootstrap.servers`). Required unless `conn_id` is set.",
        default=None,
    )
    conn_id: str | None = doc(
        "Airflow connection id holding the brokers (host[:port], comma-separated hosts allowed) and, in its "
        "extra JSON, librdkafka settings; its password becomes `sasl.password`.",
        default=None,
    )
    settings: dict[str, str] = doc(
        "Any librdkafka consumer setting passed through as-is (SASL/SSL included), e.g. "
        "`security.protocol: SASL_SSL`, `sasl.password: ${KAFKA_PASSWORD}`. Secrets are redacted in logs.",
        default_factory=dict,
    )
    read_timeout_seconds: float = doc(
        "Fail a partition read (transient error naming the partition and position) when no progress is made for this long.",
        default=60.0,
    )
    start_from: str = doc(
        "Where a partition without committed offsets starts (the pipeline's first batch, a partition a topic gains, "
        "a topic a `topic_pattern` picks up later): `earliest` (its log start); `latest`: the log end the partition "
        "had when a plan first saw its topic, pinned in the staging area (`<staging>/<pipeline>/start-offsets.json`) "
        "so that no record produced after it is skipped, however many plans find nothing before the first batch "
        "commits (partitions a pinned topic gains later start at their log start); or a time in ISO 8601 "
        "(`2026-11-01T00:00:00Z`; without a zone, UTC): the first record whose timestamp is at or after it, the log "
        "end when there is none. Partitions with committed offsets continue from them.",
        default="earliest",
    )


@dataclass(frozen=True)
class FormatSpec:
    """How record values are decoded."""

    value: str = doc(
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
    registry_url: str | None = doc(
        "Schema registry URL (Confluent REST API) for `value: avro`, `debezium_avro`, `json_schema`, `protobuf` and "
        "`debezium_protobuf`, and for Avro message keys (`table.key_source: message_key`).",
        default=None,
    )
    registry_basic_auth: str | None = doc("`user:password` for the schema registry (use `${ENV_VAR}`; never logged).", default=None)
    registry_settings: dict[str, str] = doc(
        "More settings of confluent-kafka's schema registry client: TLS (`ssl.ca.location`, `ssl.certificate.location`, "
        "`ssl.key.location`), bearer auth (`bearer.auth.credentials.source`, `bearer.auth.token`, ...), `timeout`, "
        "`max.retries`. Secret values through `${ENV_VAR}`.",
        default_factory=dict,
    )
    registry_conn_id: str | None = doc(
        "Airflow connection id holding the schema registry, instead of `registry_url` (served by Airflow's secrets "
        "backends): its host (with scheme and port) is the URL, its login and password the basic auth, and its "
        "extra JSON adds `registry_settings`. `registry_url`, `registry_basic_auth` and `registry_settings` set "
        "here win.",
        default=None,
    )
    message: str | None = doc(
        "`protobuf`, `debezium_protobuf`: the message type to read (its full name, `shop.Order`) instead of the one "
        "each record's message indexes pick; a record whose schema has no such message is a dead letter "
        "`MessageIndexOutOfRange`.",
        default=None,
    )
    timestamps: dict[str, str] = doc(
        "Columns parsed into UTC timestamps (a field inside an object as `a.b`), column -> format: a strftime pattern "
        "(`%Y-%m-%d %H:%M:%S`), `iso8601` (with or without a zone: `2024-02-29T12:23:03`, `...+01:00`, `...Z`), "
        "`epoch_millis` or `epoch_seconds`. A value that does not parse makes its record a dead letter.",
        default_factory=dict,
    )
    timezone: str = doc("Time zone of date-times without a zone (IANA name, e.g. `Europe/Oslo`).", default="UTC")
    key: KeyFormat = doc(
        "Message key as a column `_kafka_key`: `none` (default), `string` (UTF-8; invalid bytes replaced) or `bytes`.",
        default="none",
    )
    headers: bool = doc("Message headers as a column `_kafka_headers` (map of string to bytes).", default=False)
    metadata: MetadataColumns = doc(
        "Kafka metadata columns: `prefixed` (default: `_kafka_topic`, `_kafka_partition`, `_kafka_offset`, "
        "`_kafka_timestamp`), `struct` (one column `_kafka` with fields topic, partition, offset, timestamp) or "
        "`none`. Replay and backfills match rows to offsets through them, so they need `prefixed` or `struct`; "
        "they add about 10% to the data files of the pizza table (`make bench-metadata`, BENCHMARKS.md).",
        default="prefixed",
    )
    skip_control_events: bool = doc(
        "`debezium` / `debezium_avro`: skip (count in `tidewater.skipped`) the connector's own events that a topic "
        "list or pattern picks up: schema-change events (`ddl`, `tableChanges`) and heartbeats (`ts_ms` alone). Off "
        "(default): each is a dead letter of class `SchemaChange` or `Heartbeat` that names the topic to leave out.",
        default=False,
    )
    flatten: bool = doc(
        "Flatten nested objects into top-level columns (`a.b.c` -> `a_b_c`). Off: objects stay struct columns. "
        "`format.timestamps` and `table.partition_by` then name the flattened columns.",
        default=False,
    )
    flatten_separator: str = doc("Joins the names of flattened fields (letters, digits, `_`).", default="_")
    allow_non_numeric_numbers: bool = doc(
        "JSON formats: take `NaN`, `Infinity` and `-Infinity` (not JSON, but written by some producers, e.g. "
        "Python's json.dumps) as double values. Off (default): such a record is a dead letter (`InvalidJson`). "
        "Whatever this says, an integer outside the signed 64-bit range or a number too large for a double "
        "(`1e400`) is a dead letter (`NumberOutOfRange`): it would otherwise lose its digits silently.",
        default=False,
    )
    max_nesting_depth: int = doc(
        "Deepest object/array nesting a record may have; deeper records are dead letters (class `TooDeep`) "
        "instead of exhausting the decoder's stack.",
        default=64,
    )
    flatten_max_depth: int = doc(
        "Object levels flattened; objects nested deeper stay struct columns (1: only top-level objects).", default=8
    )
    map_columns: list[str] = doc(
        "Top-level fields whose objects have open-ended keys (attributes, labels, ...), stored as one "
        "`map<string, V>` column instead of a struct with a column per key. V is the values' common type "
        "(long, double or string; mixed scalars become strings). Not flattened.",
        default_factory=list,
    )


@dataclass(frozen=True)
class DeadLetterSpec:
    """What happens to records that cannot be decoded (invalid JSON, wrong types, tombstones, ...)."""

    policy: DeadLetterPolicy = doc(
        "`dead_letter`: written to the dead-letter table in the same batch (records read = rows + dead "
        "letters); `fail`: the batch fails naming the first bad record (topic, partition, offset); `skip`: "
        "dropped and counted in the snapshot summary (`tidewater.skipped`).",
        default="dead_letter",
    )
    table: str | None = doc(
        "Dead-letter table identifier. Default: the target table's name with `_dead_letters` appended, in "
        "the same namespace. Columns: topic, partition, offset, timestamp, key, value, headers, "
        "error_class, error_message, batch_id, pipeline.",
        default=None,
    )
    topic: str | None = doc(
        "Also send dead letters to this Kafka topic (same cluster and settings), raw key, value and headers "
        "kept, with headers `tidewater.topic`, `.partition`, `.offset`, `.timestamp`, `.error.class`, "
        "`.error.message`, `.batch-id`, `.pipeline`. Sent by the commit step before the dead-letter table's "
        "commit; at least once (a failure between the two sends them again: deduplicate on batch id + offset).",
        default=None,
    )
