"""``string`` and ``bytes`` values: the raw value as one column, no decoding (invalid UTF-8 is a bad record)."""

from __future__ import annotations

import pyarrow as pa

from tidewater.decode.records import BadRecord, DecodeContext, keep_mask, not_utf8
from tidewater.source.kafka import Chunk

# ---- plain string and raw bytes values ----------------------------------------------------------------


def decode_raw(chunk: Chunk, kind: str) -> tuple[pa.Table, list[BadRecord]]:
    """``bytes``: the value as a binary column ``value``; ``string``: as UTF-8 text (invalid bytes are
    dead letters). Tombstones land as null values: for raw formats they are records like any other."""
    values = pa.array(chunk.values, pa.binary())
    if kind == "bytes":
        return pa.table({"value": values}), []
    try:
        text = values.cast(pa.string())
        text.validate(full=True)
        return pa.table({"value": text}), []
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    bad = [
        BadRecord(i, "InvalidUtf8", f"value is not valid UTF-8; value starts with {v[:120]!r}")
        for i, v in enumerate(chunk.values)
        if v is not None and not_utf8(v)
    ]
    return pa.table({"value": values.filter(keep_mask(len(values), [b.index for b in bad])).cast(pa.string())}), bad


def decode(chunk: Chunk, ctx: DecodeContext) -> tuple[pa.Table, list[BadRecord]]:
    """Registry entry for ``string`` and ``bytes``."""
    return decode_raw(chunk, ctx.fmt)
