"""Columns that come from the Kafka message rather than its value: key, headers, topic, partition,
offset and timestamp (``format.key``, ``format.headers``, ``format.metadata``).

Built from librdkafka's message batch with C-level maps and Arrow arrays (no Python step per record),
for the records that decoded (dead letters keep their own copy of key, headers and coordinates).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tidewater.config.sections.source import FormatSpec
from tidewater.decode.records import keep_mask
from tidewater.errors import RecordError
from tidewater.source.kafka import Chunk

PREFIX = "_kafka_"


STRUCT = "_kafka"


HEADERS_TYPE = pa.map_(pa.string(), pa.binary())


def column_names(fmt: FormatSpec) -> set[str]:
    names: set[str] = set()
    if fmt.metadata == "prefixed":
        names |= {PREFIX + n for n in ("topic", "partition", "offset", "timestamp")}
    elif fmt.metadata == "struct":
        names.add(STRUCT)
    if fmt.key != "none":
        names.add(PREFIX + "key")
    if fmt.headers:
        names.add(PREFIX + "headers")
    return names


def without_source_columns(schema: pa.Schema | None, fmt: FormatSpec) -> pa.Schema | None:
    """The table schema the value decoder should see (source columns are not in the values)."""
    if schema is None:
        return None
    names = column_names(fmt)
    return pa.schema([f for f in schema if f.name not in names]) if names else schema


def add_source_columns(fmt: FormatSpec, chunk: Chunk, table: pa.Table, bad: list[int]) -> pa.Table:
    """Append the configured source columns to the decoded rows (chunk order, bad records left out)."""
    names = column_names(fmt)
    if not names:
        return table
    clash = names & set(table.column_names)
    if clash:
        raise RecordError(
            f"record field(s) {', '.join(sorted(clash))} collide with the source columns of format.key/headers/metadata",
            topic=chunk.topic,
            partition=chunk.partition,
            offset=chunk.offsets[0],
        )
    n = len(chunk)
    keep = keep_mask(n, bad) if bad else None

    def take(arr: Any) -> pa.Array:
        return arr.filter(keep) if keep is not None else arr

    cols: dict[str, pa.Array] = {}
    if fmt.metadata != "none":
        stamps = pa.array(chunk.timestamps, pa.int64())
        meta = {
            "topic": pa.array([chunk.topic] * n, pa.string()),
            "partition": pa.array([chunk.partition] * n, pa.int32()),
            "offset": pa.array(chunk.offsets, pa.int64()),
            "timestamp": pa.compute.multiply(stamps, 1000).cast(pa.timestamp("us", tz="UTC")),
        }
        if fmt.metadata == "prefixed":
            cols.update({PREFIX + k: take(v) for k, v in meta.items()})
        else:
            cols[STRUCT] = take(pa.StructArray.from_arrays(list(meta.values()), list(meta.keys())))
    if fmt.key != "none":
        keys = pa.array(chunk.keys, pa.binary())
        if fmt.key == "string":
            keys = (
                pa.array([k.decode("utf-8", "replace") if k is not None else None for k in keys.to_pylist()], pa.string())
                if not _valid_utf8(keys)
                else keys.cast(pa.string())
            )
        cols[PREFIX + "key"] = take(keys)
    if fmt.headers:
        cols[PREFIX + "headers"] = take(pa.array(chunk.headers, HEADERS_TYPE))
    for name, arr in cols.items():
        table = table.append_column(name, arr)
    return table


def _valid_utf8(arr: pa.Array) -> bool:
    try:
        arr.cast(pa.string()).validate(full=True)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return False
