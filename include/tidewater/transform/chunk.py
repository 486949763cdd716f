"""A chunk of records from bytes to rows: the format's decoder (``decode/registry.py``), then shaping and date-time
conversions, with every failure kept as a bad record of the chunk (by its index in the chunk)."""

from __future__ import annotations

from typing import Any

from tidewater.config.formats import FORMATS
from tidewater.config.spec import PipelineSpec
from tidewater.decode.records import BadRecord, DecodeContext, surviving
from tidewater.decode.registry import decoder
from tidewater.errors import RecordError
from tidewater.transform.conversions import apply
from tidewater.transform.shaping import conform, shape


def decode_chunk(
    spec: PipelineSpec, chunk: Any, explicit: Any, registry: Any = None, shaper: Any = None
) -> tuple[Any, list[Any], list[Any]]:
    """Decode a chunk in the pipeline's value format: (rows, bad records, records ignored by design).

    Ignored: records a format skips by design (Debezium tombstones follow deletes and carry no row),
    counted as skipped. ``shaper``: (NameMatcher, table schema) when shaping applies (maps, flattening,
    name matching). With ``dead_letter.policy: fail`` the first bad record raises RecordError naming it.
    """
    fmt = spec.format.value
    kind = FORMATS[fmt]
    fail = spec.dead_letter.policy == "fail"
    decoded, bad = decoder(fmt)(
        chunk,
        DecodeContext(
            fmt,
            explicit,
            fail,
            registry,
            spec.format.max_nesting_depth,
            spec.format.allow_non_numeric_numbers,
            spec.routes_by_source,
            spec.targets.own_table,
            tuple(spec.format.timestamps),
            spec.format.message,
        ),
    )
    skipped = kind.skipped_classes + (kind.control_classes if spec.format.skip_control_events else ())
    ignored = [b for b in bad if b.error_class in skipped]
    bad = [b for b in bad if b.error_class not in skipped]

    def record_failures(failed: list[tuple[int, str]], error_class: str) -> list[Any]:
        """Failures by row of the current ``decoded`` -> BadRecords by chunk index, merged into ``bad``."""
        if not failed:
            return bad
        rows = surviving(len(chunk), [b.index for b in bad + ignored])  # chunk index of each decoded row
        return sorted(bad + [BadRecord(rows[r], error_class, msg) for r, msg in failed], key=lambda b: b.index)

    if shaper is not None and kind.structured:
        matcher, target = shaper
        decoded, failed = conform(shape(decoded, spec.format, matcher), target)
        bad = record_failures(failed, "TypeMismatch")
    if kind.structured and spec.format.timestamps:
        decoded, failed = apply(decoded, spec.format)
        bad = record_failures(failed, "ConversionError")
    if bad and fail:
        raise RecordError(
            f"{bad[0].error_class}: {bad[0].message}", topic=chunk.topic, partition=chunk.partition, offset=chunk.offsets[bad[0].index]
        )
    return decoded, bad, ignored
