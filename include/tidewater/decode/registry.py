"""registry (moved from spark_job.py)."""


from __future__ import annotations

from typing import Any

from tidewater.config.spec import PipelineSpec


def decode_chunk(spec: PipelineSpec, chunk: Any, explicit: Any, registry: Any = None,
                 shaper: Any = None) -> tuple[Any, list[Any], list[Any]]:
    """Decode a chunk in the pipeline's value format: (rows, bad records, records ignored by design).

    Ignored: Debezium tombstones (they follow deletes and carry no row), counted as skipped.
    ``shaper``: (NameMatcher, table schema) when shaping applies (maps, flattening, name matching).
    With ``dead_letter.policy: fail`` the first bad record raises RecordError naming it.
    """
    from tidewater.decode.connect import decode_connect
    from tidewater.decode.debezium import decode_debezium
    from tidewater.decode.json import decode_json, decode_json_lenient
    from tidewater.decode.raw import decode_raw
    from tidewater.decode.records import BadRecord, surviving
    from tidewater.errors import RecordError

    fmt = spec.format.value
    fail = spec.dead_letter.policy == "fail"
    if fmt == "json" and fail:
        decoded, bad = decode_json(chunk, explicit), []
    elif fmt in ("string", "bytes"):
        decoded, bad = decode_raw(chunk, fmt)
    elif fmt == "connect_json":
        decoded, bad = decode_connect(chunk, explicit)
    elif fmt == "debezium":
        decoded, bad = decode_debezium(chunk, explicit)
    elif fmt == "avro":
        from tidewater.decode.avro import decode_avro

        decoded, bad = decode_avro(chunk, registry)
    else:
        decoded, bad = decode_json_lenient(chunk, explicit)
    ignored: list[Any] = []
    if fmt == "debezium":
        ignored = [b for b in bad if b.error_class == "Tombstone"]
        bad = [b for b in bad if b.error_class != "Tombstone"]

    def record_failures(failed: list[tuple[int, str]], error_class: str) -> list[Any]:
        """Failures by row of the current ``decoded`` -> BadRecords by chunk index, merged into ``bad``."""
        if not failed:
            return bad
        rows = surviving(len(chunk), [b.index for b in bad + ignored])  # chunk index of each decoded row
        return sorted(bad + [BadRecord(rows[r], error_class, msg) for r, msg in failed], key=lambda b: b.index)

    if shaper is not None and fmt not in ("string", "bytes"):
        from tidewater.transform.shaping import conform, shape

        matcher, target = shaper
        decoded, failed = conform(shape(decoded, spec.format, matcher), target)
        bad = record_failures(failed, "TypeMismatch")
    if fmt not in ("string", "bytes") and spec.format.timestamps:
        from tidewater.transform.conversions import apply

        decoded, failed = apply(decoded, spec.format)
        bad = record_failures(failed, "ConversionError")
    if bad and fail:
        raise RecordError(f"{bad[0].error_class}: {bad[0].message}", topic=chunk.topic, partition=chunk.partition,
                          offset=chunk.offsets[bad[0].index])
    return decoded, bad, ignored
