"""JSON decoding into Arrow: types, deferred nulls, timestamps kept as strings, bad records named."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from tidewater.decode.json import decode_json
from tidewater.errors import RecordError
from tidewater.source.kafka import Chunk


def chunk(values, start=100):
    return Chunk("pizzas", 2, list(values), list(range(start, start + len(values))), [0] * len(values))


PIZZA = {"order_id": "af69865f", "store_id": 42, "sauce": "extra", "date_ordered": "2024-01-04 12:28:13"}


def test_types_inferred_and_date_strings_kept():
    vals = [json.dumps({**PIZZA, "price": 9.5, "hot": True, "tags": ["a"], "addr": {"zip": 1}}).encode()] * 3
    t = decode_json(chunk(vals), None)
    s = t.schema
    assert t.num_rows == 3
    assert s.field("store_id").type == pa.int64()
    assert s.field("price").type == pa.float64()
    assert s.field("hot").type == pa.bool_()
    assert s.field("date_ordered").type == pa.string()  # not silently parsed into a timestamp
    assert t.column("date_ordered")[0].as_py() == "2024-01-04 12:28:13"
    assert pa.types.is_list(s.field("tags").type)
    assert pa.types.is_struct(s.field("addr").type)


def test_null_only_fields_are_deferred_and_explicit_types_win():
    vals = [b'{"a": 1, "n": null}', b'{"a": 2, "n": null}']
    t = decode_json(chunk(vals), None)
    assert t.schema.names == ["a"]
    t2 = decode_json(chunk([b'{"a": 3}']), pa.schema([("a", pa.float64()), ("b", pa.string())]))
    assert t2.schema.field("a").type == pa.float64()


def test_pretty_printed_values():
    vals = [json.dumps(PIZZA, indent=2).encode(), b'{"order_id": "x",\r\n "store_id": 1}']
    t = decode_json(chunk(vals), None)
    assert t.num_rows == 2 and t.column("store_id").to_pylist() == [42, 1]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (b'{"order_id": "x", "store_id": ', "not a valid JSON object"),
        (b"not json at all", "not a valid JSON object"),
        (b"42", "not a valid JSON object"),
        (b'{"order_id": "x", "store_id": "forty-two"}', "not a valid JSON object"),
        (b"   ", "empty or whitespace"),
        (None, "tombstone"),
    ],
)
def test_bad_record_is_named_by_topic_partition_offset(bad, reason):
    good = json.dumps(PIZZA).encode()
    vals = [good] * 37 + [bad] + [good] * 20
    with pytest.raises(RecordError) as e:
        decode_json(chunk(vals, start=1000), None)
    assert e.value.offset == 1037
    assert e.value.topic == "pizzas" and e.value.partition == 2
    assert reason in str(e.value)
    assert "offset=1037" in str(e.value)


# ---- lenient decoding (dead letters) ---------------------------------------------------------------


def test_lenient_sets_bad_records_apart_and_keeps_the_good_in_order():
    from tidewater.decode.json import decode_json_lenient

    values = [b'{"a": 1}', b'{"a": 2', None, b"", b'\xff{"a": 3}', b'{"a": 4}', b"[1]", b'{"a": 5}']
    table, bad = decode_json_lenient(chunk(values), None)
    assert table.column("a").to_pylist() == [1, 4, 5]
    assert [(b.index, b.error_class) for b in bad] == [
        (1, "InvalidJson"),
        (2, "Tombstone"),
        (3, "EmptyValue"),
        (4, "InvalidUtf8"),
        (6, "TypeMismatch"),
    ]
    assert table.num_rows + len(bad) == len(values)


def test_lenient_first_seen_type_wins_without_a_table_and_the_table_type_wins_with_one():
    from tidewater.decode.json import decode_json_lenient

    table, bad = decode_json_lenient(chunk([b'{"a": 1}', b'{"a": "x"}', b'{"a": 2, "b": true}']), None)
    assert table.column("a").to_pylist() == [1, 2] and [b.index for b in bad] == [1]
    explicit = pa.schema([pa.field("a", pa.string())])
    table, bad = decode_json_lenient(chunk([b'{"a": "x"}', b'{"a": {"k": 1}}', b'{"a": "y"}']), explicit)
    assert table.column("a").to_pylist() == ["x", "y"]
    assert [(b.index, b.error_class) for b in bad] == [(1, "TypeMismatch")]


def test_lenient_finds_every_bad_record_among_many():
    """Every 7th of 3000 records is broken: all 429 are found, the 2571 others decode, nothing is lost."""
    from tidewater.decode.json import decode_json_lenient

    values = [b"{broken" if i % 7 == 0 else f'{{"i": {i}}}'.encode() for i in range(3000)]
    table, bad = decode_json_lenient(chunk(values), None)
    assert [b.index for b in bad] == list(range(0, 3000, 7))
    assert table.column("i").to_pylist() == [i for i in range(3000) if i % 7]


def test_lenient_success_path_is_the_plain_decoder():
    from tidewater.decode.json import decode_json_lenient

    table, bad = decode_json_lenient(chunk([b'{"a": 1}', b'{"a": 2}']), None)
    assert bad == [] and table.column("a").to_pylist() == [1, 2]


def test_schema_limits_set_apart_the_records_over_them_and_keep_the_rest():
    """max_new_columns 3: a record adding 5 fields goes (TooManyColumns), two adding 2 each: the later one
    goes once the first fits; an over-long name goes (FieldNameTooLong); the kept rows carry only the
    fields they may add, and existing columns stay whatever the budget."""
    import pyarrow as pa

    from tidewater.table.limits import SchemaLimits, check

    names = ["id", "a", "b", "c", "d", "e", "f", "g"]
    schema = pa.schema([*((n, pa.int64()) for n in names), ("h", pa.struct([("x", pa.int64())])), ("z" * 20, pa.int64())])
    rows = pa.Table.from_pylist(
        [
            {"id": 1, "a": 1, "b": 2},
            {"id": 2, "c": 1, "d": 2, "e": 3, "f": 4, "g": 5},
            {"id": 3, "h": {"x": 1}},
            {"id": 4, "z" * 20: 1},
            {"id": 5},
        ],
        schema=schema,
    )
    existing = pa.schema([("id", pa.int64())])
    kept, over = check(rows, existing, SchemaLimits(max_new_columns=3, max_columns=100, max_field_name_length=10), 0)
    assert [(o.row, o.error_class) for o in over] == [(1, "TooManyColumns"), (2, "TooManyColumns"), (3, "FieldNameTooLong")]
    assert kept.column("id").to_pylist() == [1, 5] and kept.column_names == ["id", "a", "b"]
    kept, over = check(rows.slice(4), existing, SchemaLimits(3, 100, 10), 3)
    assert over == [] and kept.num_rows == 1
    kept, over = check(rows.slice(0, 1), None, SchemaLimits(1, 2, 10), 0)
    assert [o.error_class for o in over] == ["TooManyColumns"] and kept.num_rows == 0


# ---- numbers JSON cannot hold exactly ------------------------------------------------------------------


NUMBERS = [
    b'{"a": 1, "x": NaN}',  # 0: not JSON
    b'{"a": 2, "xs": [1.5, -Infinity]}',  # 1: not JSON
    b'{"a": 3, "huge": ' + b"7" * 200 + b"}",  # 2: a new field would become a double
    b'{"a": 4, "r": 1e400}',  # 3: beyond a double
    b'{"a": 5, "n": 9223372036854775807}',  # 4: the largest long: a row
    b'{"a": 6, "n": 9223372036854775808}',  # 5: one past it
    b'{"a": 7, "s": "id: 123456789012345678901234, NaN"}',  # 6: a string that looks suspect: a row
    b'{"a": 8, "d": 1e19}',  # 7: a double that large is legitimate: a row
]


def test_nan_infinity_and_out_of_range_numbers_are_dead_letters_named_by_class():
    """Default: NaN/Infinity are InvalidJson, integers beyond 64 bits and numbers beyond a double are
    NumberOutOfRange; the largest long, digits inside a string and a legitimate double of 1e19 (which makes the
    check screen the chunk: a false alarm) are rows with their values exact."""
    from tidewater.decode.json import decode_json_lenient

    table, bad = decode_json_lenient(chunk(NUMBERS), None)
    assert [(b.index, b.error_class) for b in bad] == [
        (0, "InvalidJson"),
        (1, "InvalidJson"),
        (2, "NumberOutOfRange"),
        (3, "NumberOutOfRange"),
        (5, "NumberOutOfRange"),
    ]
    assert "format.allow_non_numeric_numbers" in bad[0].message and "64-bit" in bad[2].message
    assert table.column("a").to_pylist() == [5, 7, 8]
    assert table.column("n").to_pylist() == [9223372036854775807, None, None] and table.schema.field("n").type == pa.int64()
    assert table.column("s").to_pylist() == [None, "id: 123456789012345678901234, NaN", None]
    assert table.column("d").to_pylist() == [None, None, 1e19]


def test_strict_decoding_names_the_first_such_record():
    good = json.dumps(PIZZA).encode()
    with pytest.raises(RecordError, match=r"NumberOutOfRange: integer 7777.* outside the signed 64-bit range") as e:
        decode_json(chunk([good] * 5 + [NUMBERS[2]] + [good], start=50), None)
    assert e.value.offset == 55


def test_non_numeric_numbers_are_doubles_when_allowed_but_out_of_range_ones_never_are():
    """format.allow_non_numeric_numbers: NaN and -Infinity become double values; the other rules stay."""
    import math

    from tidewater.decode.json import decode_json_lenient

    table, bad = decode_json_lenient(chunk(NUMBERS), None, allow_non_numeric=True)
    assert [(b.index, b.error_class) for b in bad] == [(2, "NumberOutOfRange"), (3, "NumberOutOfRange"), (5, "NumberOutOfRange")]
    assert table.column("a").to_pylist() == [1, 2, 5, 7, 8]
    assert math.isnan(table.column("x").to_pylist()[0]) and table.column("x").type == pa.float64()
    assert table.column("xs").to_pylist()[1] == [1.5, -math.inf]
