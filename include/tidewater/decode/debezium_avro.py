"""Debezium change events in Avro through a schema registry (the Debezium + Avro converter combination):
the same envelope unwrapping as the JSON ``debezium`` format, over Confluent-framed Avro values."""

from __future__ import annotations

import pyarrow as pa

from tidewater.decode.avro import decode_avro
from tidewater.decode.debezium import unwrap
from tidewater.decode.records import BadRecord, DecodeContext
from tidewater.source.kafka import Chunk


def decode(chunk: Chunk, ctx: DecodeContext) -> tuple[pa.Table, list[BadRecord]]:
    """Registry entry for ``debezium_avro``: tombstones come back as ``Tombstone`` bad records (skipped)."""
    outer, bad = decode_avro(chunk, ctx.registry)
    return unwrap(outer, bad, len(chunk), ctx.explicit, ctx.keep_source)
