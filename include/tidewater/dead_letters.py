"""Dead letters: the raw records a batch could not decode, with where they came from and why.

They are written as data files of the pipeline's dead-letter table by the same Spark task that writes
the good rows, listed in the batch manifest, and committed right after the batch's own commit (by
batch id, so a retry never adds them twice). Records read = rows written + dead letters + skipped.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tidewater.catalog import DEAD_LETTER_SCHEMA
from tidewater.decoding import BadRecord
from tidewater.kafka_source import Chunk

POLICIES = ("dead_letter", "fail", "skip")


def dead_letter_rows(chunk: Chunk, bad: list[BadRecord], batch_id: str, pipeline: str) -> pa.Table:
    """One row per bad record (error path only: a Python step per bad record)."""
    idx = [b.index for b in bad]
    msgs: list[Any] = chunk.messages
    headers = []
    for i in idx:
        raw = msgs[i].headers() if msgs else None
        headers.append([{"key": k, "value": v} for k, v in raw] if raw else None)
    stamps = [chunk.timestamps[i] for i in idx]
    return pa.table(
        {
            "topic": [chunk.topic] * len(idx),
            "partition": pa.array([chunk.partition] * len(idx), pa.int32()),
            "offset": pa.array([chunk.offsets[i] for i in idx], pa.int64()),
            "timestamp": pa.array([t * 1000 if t is not None and t >= 0 else None for t in stamps], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
            "key": pa.array([msgs[i].key() if msgs else None for i in idx], pa.binary()),
            "value": pa.array([chunk.values[i] for i in idx], pa.binary()),
            "headers": pa.array(headers, DEAD_LETTER_SCHEMA.field("headers").type),
            "error_class": [b.error_class for b in bad],
            "error_message": [b.message for b in bad],
            "batch_id": [batch_id] * len(idx),
            "pipeline": [pipeline] * len(idx),
        },
        schema=DEAD_LETTER_SCHEMA,
    )
