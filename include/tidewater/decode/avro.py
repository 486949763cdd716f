"""Avro values in the Confluent wire format (magic byte 0, 4-byte big-endian schema id, Avro body),
with writer schemas fetched from a schema registry by id and cached for the task's life.

Avro has no vectorized decoder: each record is read by fastavro in Python (the one per-record step
in Tidewater; its cost is measured in BENCHMARKS.md). Records of several schema ids in one chunk
land together under the union of their schemas (fields added by evolution are null in older records).
"""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pyarrow as pa

from tidewater.decode.records import BadRecord, DecodeContext
from tidewater.errors import TerminalError, TransientError
from tidewater.source.kafka import Chunk

log = logging.getLogger(__name__)


class UnknownSchemaId(Exception):
    pass


class RegistryClient:
    """Writer schemas by id, through confluent-kafka's ``SchemaRegistryClient`` (its HTTP client, retries,
    TLS and basic or bearer auth: ``format.registry_basic_auth`` and ``format.registry_settings``), parsed
    once and cached for the task's life. Its errors become ours: an id the registry does not know (404) or
    a schema that is not Avro makes the record a dead letter (``UnknownSchemaId``); refused credentials
    (401, 403) are terminal; an unreachable registry or a server error is transient."""

    def __init__(self, url: str, auth: str | None = None, settings: dict[str, str] | None = None,
                 timeout: float = 10.0) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url = url.rstrip("/")
        conf: dict[str, Any] = {"url": self.url, "timeout": timeout, "max.retries": 2, **(settings or {})}
        if auth:
            conf["basic.auth.user.info"] = auth
        try:
            self._client = SchemaRegistryClient(conf)
        except ValueError as e:  # a bad setting (its message names it)
            raise TerminalError(f"format.registry_settings: {e}") from None
        self._cache: dict[int, Any] = {}

    def schema(self, schema_id: int) -> Any:
        """The parsed writer schema for ``schema_id`` (cached)."""
        import fastavro
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        if schema_id in self._cache:
            return self._cache[schema_id]
        try:
            found = self._client.get_schema(schema_id)
        except SchemaRegistryError as e:
            if e.http_status_code == 404:
                raise UnknownSchemaId(f"schema id {schema_id} is not in the registry {self.url}") from None
            if e.http_status_code in (401, 403):
                raise TerminalError(f"schema registry {self.url} refused the credentials (HTTP {e.http_status_code}); "
                                    "check format.registry_basic_auth / format.registry_settings") from None
            raise TransientError(f"schema registry {self.url} answered HTTP {e.http_status_code} for schema id "
                                 f"{schema_id}") from None
        except Exception as e:  # connection refused, timeouts, TLS: the client's transport errors
            raise TransientError(f"schema registry {self.url} unreachable: {type(e).__name__}") from None
        if (found.schema_type or "AVRO") != "AVRO":
            raise UnknownSchemaId(f"schema id {schema_id} is a {found.schema_type} schema, not Avro")
        parsed = fastavro.parse_schema(json.loads(found.schema_str))
        self._cache[schema_id] = parsed
        return parsed


# ---- Avro schema -> Arrow type -------------------------------------------------------------------


def arrow_type(schema: Any) -> pa.DataType:
    if isinstance(schema, list):  # union: nullable of its one non-null branch (else a string fallback)
        branches = [s for s in schema if s != "null"]
        return arrow_type(branches[0]) if len(branches) == 1 else pa.string()
    if isinstance(schema, str):
        return {
            "null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
            "double": pa.float64(), "bytes": pa.binary(), "string": pa.string(),
        }.get(schema, pa.string())
    t = schema.get("type")
    logical = schema.get("logicalType")
    if logical in ("timestamp-millis", "timestamp-micros"):
        return pa.timestamp("us", tz="UTC")
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        return pa.timestamp("us")
    if logical == "date":
        return pa.date32()
    if logical == "decimal":
        return pa.decimal128(int(schema["precision"]), int(schema.get("scale", 0)))
    if logical == "uuid":
        return pa.string()
    if t == "record":
        return pa.struct([pa.field(f["name"], arrow_type(f["type"])) for f in schema["fields"]])
    if t == "array":
        return pa.list_(arrow_type(schema["items"]))
    if t == "map":
        return pa.map_(pa.string(), arrow_type(schema["values"]))
    if t == "enum":
        return pa.string()
    if t == "fixed":
        return pa.binary()
    return arrow_type(t)


def decode_avro(chunk: Chunk, registry: RegistryClient) -> tuple[pa.Table, list[BadRecord]]:
    """Decode Confluent-framed Avro values. Unknown schema ids and unreadable bodies are bad records;
    an unreachable registry fails the batch (TransientError: nothing is committed, retrying is safe)."""
    import fastavro

    rows: list[dict[str, Any]] = []
    bad: list[BadRecord] = []
    types: dict[int, pa.StructType] = {}
    unknown: dict[int, str] = {}
    for i, v in enumerate(chunk.values):
        if v is None:
            bad.append(BadRecord(i, "Tombstone", "record has a null value (tombstone)"))
            continue
        if len(v) < 5 or v[0] != 0:
            bad.append(BadRecord(i, "NotConfluentAvro", f"value does not start with magic byte 0 and a schema id; starts with {v[:16]!r}"))
            continue
        schema_id = int.from_bytes(v[1:5], "big")
        if schema_id in unknown:
            bad.append(BadRecord(i, "UnknownSchemaId", unknown[schema_id]))
            continue
        try:
            writer = registry.schema(schema_id)
        except UnknownSchemaId as e:
            unknown[schema_id] = str(e)
            bad.append(BadRecord(i, "UnknownSchemaId", str(e)))
            continue
        try:
            record = fastavro.schemaless_reader(io.BytesIO(v[5:]), writer, None)
        except Exception as e:  # truncated or corrupt body
            bad.append(BadRecord(i, "InvalidAvro", f"schema id {schema_id}: {type(e).__name__}: {e}"))
            continue
        if not isinstance(record, dict):
            bad.append(BadRecord(i, "InvalidAvro", f"schema id {schema_id} is not a record schema"))
            continue
        if schema_id not in types:
            types[schema_id] = arrow_type(writer)
        rows.append(record)
    if not rows:
        return pa.table({}), bad
    schema = pa.unify_schemas([pa.schema(list(t)) for t in types.values()], promote_options="permissive")
    try:
        return pa.Table.from_pylist(rows, schema=schema), bad
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise TerminalError(f"Avro records of schema ids {sorted(types)} do not fit one table schema: {e}",
                            topic=chunk.topic, partition=chunk.partition, offset=chunk.offsets[0]) from e


def decode(chunk: Chunk, ctx: DecodeContext) -> tuple[pa.Table, list[BadRecord]]:
    """Registry entry for ``avro`` (Confluent wire format; writer schemas from ``ctx.registry``)."""
    return decode_avro(chunk, ctx.registry)
