"""Date-time conversions: patterns, ISO 8601 with and without zones, epochs, time zones, bad values."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

from tidewater.config.sections.source import FormatSpec
from tidewater.transform.conversions import apply


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)


def test_pattern_in_a_time_zone_and_a_bad_value():
    t = pa.table({"date_ordered": ["2024-01-04 12:28:13", "yesterday", None], "n": [1, 2, 3]})
    out, failed = apply(t, FormatSpec(timestamps={"date_ordered": "%Y-%m-%d %H:%M:%S"}, timezone="Europe/Oslo"))
    assert out.column("date_ordered").to_pylist() == [utc(2024, 1, 4, 11, 28, 13), None]
    assert out.column("n").to_pylist() == [1, 3]
    assert failed == [(1, "column 'date_ordered': 'yesterday' is not a date-time in format '%Y-%m-%d %H:%M:%S'")]


def test_iso8601_naive_and_zoned_mixed():
    t = pa.table({"created_at": ["2024-02-29T12:23:03", "2024-02-29T12:23:03+01:00", "2024-02-29T12:23:03Z"]})
    out, failed = apply(t, FormatSpec(timestamps={"created_at": "iso8601"}))
    assert failed == []
    assert out.column("created_at").to_pylist() == [utc(2024, 2, 29, 12, 23, 3), utc(2024, 2, 29, 11, 23, 3), utc(2024, 2, 29, 12, 23, 3)]
    assert out.schema.field("created_at").type == pa.timestamp("us", tz="UTC")


def test_iso8601_error_path_keeps_the_good_values():
    t = pa.table({"at": ["2024-02-29T12:23:03.250+02:00", "not a date", "2024-03-01"]})
    out, failed = apply(t, FormatSpec(timestamps={"at": "iso8601"}))
    assert [r for r, _ in failed] == [1]
    assert out.column("at").to_pylist() == [datetime(2024, 2, 29, 10, 23, 3, 250000, tzinfo=timezone.utc), utc(2024, 3, 1)]


def test_epochs():
    t = pa.table({"ms": [1_700_000_000_123], "s": [1_700_000_000.5]})
    out, failed = apply(t, FormatSpec(timestamps={"ms": "epoch_millis", "s": "epoch_seconds"}))
    assert failed == []
    assert out.column("ms")[0].as_py() == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=timezone.utc)
    assert out.column("s")[0].as_py() == datetime(2023, 11, 14, 22, 13, 20, 500000, tzinfo=timezone.utc)


def test_a_field_inside_an_object_is_converted_and_bad_values_name_their_row():
    import pyarrow as pa

    from tidewater.config.sections.source import FormatSpec
    from tidewater.transform.conversions import apply, decoder_schema

    t = pa.table(
        {
            "id": [1, 2, 3, 4],
            "meta": pa.array([{"at": "2024-01-04 12:28:13", "who": "a"}, {"at": "not a time", "who": "b"}, None, {"at": None, "who": "d"}]),
        }
    )
    fmt = FormatSpec(timestamps={"meta.at": "%Y-%m-%d %H:%M:%S"}, timezone="Europe/Oslo")
    out, failed = apply(t, fmt)
    assert failed == [(1, "column 'meta.at': 'not a time' is not a date-time in format '%Y-%m-%d %H:%M:%S'")]
    assert out.column("id").to_pylist() == [1, 3, 4]
    meta = out.column("meta").combine_chunks()
    assert meta.type.field("at").type == pa.timestamp("us", tz="UTC")
    values = meta.to_pylist()
    assert values[0]["at"].isoformat() == "2024-01-04T11:28:13+00:00" and values[0]["who"] == "a"
    assert values[1] is None and values[2] == {"at": None, "who": "d"}
    table_schema = pa.schema([("id", pa.int64()), ("meta", pa.struct([("at", pa.timestamp("us", tz="UTC")), ("who", pa.string())]))])
    assert decoder_schema(table_schema, fmt).field("meta").type.field("at").type == pa.string()
