"""Debezium change events in Protobuf through a schema registry (Debezium with Confluent's Protobuf converter): the
same envelope unwrapping as the JSON ``debezium`` format, over Confluent-framed Protobuf values (``decode/protobuf.py``).
The envelope's ``before`` and ``after`` are messages of the row's type (null when unset); nullable columns arrive as
wrapper types (the converter's ``wrapper.for.nullables``) or as proto3 ``optional``, and read as null when absent."""

from __future__ import annotations

import pyarrow as pa

from tidewater.decode.debezium import unwrap
from tidewater.decode.protobuf import decode_protobuf
from tidewater.decode.records import BadRecord, DecodeContext
from tidewater.source.kafka import Chunk


def decode(chunk: Chunk, ctx: DecodeContext) -> tuple[pa.Table, list[BadRecord]]:
    """Registry entry for ``debezium_protobuf``: tombstones come back as ``Tombstone`` bad records (skipped). The
    envelope is not the table's row, so it is not checked against the table's columns (the row image is, as it is
    written)."""
    outer, bad = decode_protobuf(chunk, ctx.registry, ctx.message)
    return unwrap(outer, bad, len(chunk), ctx.explicit, ctx.keep_source)
