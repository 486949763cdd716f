"""Dead letters: the raw records a batch could not decode, with where they came from and why.

They are written as data files of the pipeline's dead-letter table by the same Spark task that writes
the good rows, listed in the batch manifest, and committed right after the batch's own commit (by
batch id, so a retry never adds them twice). Records read = rows written + dead letters + skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tidewater.decode.records import BadRecord
from tidewater.source.kafka import Chunk
from tidewater.table.own_tables import DEAD_LETTER_SCHEMA

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

POLICIES = ("dead_letter", "fail", "skip")


def dead_letter_rows(
    chunk: Chunk, bad: list[BadRecord], batch_id: str, pipeline: str, reread: Callable[[list[int]], dict[int, Any]] | None = None
) -> pa.Table:
    """One row per bad record (error path only: a Python step per bad record).

    Keys and headers come from the chunk when it was read with them, else from ``reread`` (the bad
    records' offsets read again: the hot path does not keep keys and headers it does not need).
    """
    idx = [b.index for b in bad]
    offsets = [chunk.offsets[i] for i in idx]
    if chunk.keys is not None and chunk.headers is not None:
        meta = {chunk.offsets[i]: (chunk.keys[i], chunk.headers[i]) for i in idx}
    else:
        meta = reread(offsets) if reread is not None else {}
    keys = [meta.get(o, (None, None))[0] for o in offsets]
    headers = [[{"key": k, "value": v} for k, v in h] if (h := meta.get(o, (None, None))[1]) else None for o in offsets]
    stamps = [chunk.timestamps[i] for i in idx]
    return pa.table(
        {
            "topic": [chunk.topic] * len(idx),
            "partition": pa.array([chunk.partition] * len(idx), pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "timestamp": pa.array([t * 1000 if t is not None and t >= 0 else None for t in stamps], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
            "key": pa.array(keys, pa.binary()),
            "value": pa.array([chunk.values[i] for i in idx], pa.binary()),
            "headers": pa.array(headers, DEAD_LETTER_SCHEMA.field("headers").type),
            "error_class": [b.error_class for b in bad],
            "error_message": [b.message for b in bad],
            "batch_id": [batch_id] * len(idx),
            "pipeline": [pipeline] * len(idx),
        },
        schema=DEAD_LETTER_SCHEMA,
    )
